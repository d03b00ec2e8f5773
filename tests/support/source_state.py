"""What a bad input must leave untouched: the publisher's replication objects and the staging files.

``SourceState.capture`` reads publications (tables, filters, column lists, options), slots (plugin,
restart and confirmed LSNs), subscriptions and every file under a staging root; two captures
compare equal when nothing changed. ``assert_application_can_write`` runs an UPDATE and a DELETE
of real rows (rolled back), which PostgreSQL rejects when a publication breaks the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from psycopg2 import sql

_PUBLICATIONS = """
SELECT p.pubname, p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot,
       coalesce((SELECT array_agg(format('%%s %%s %%s', pr.prrelid::regclass, pg_get_expr(pr.prqual, pr.prrelid),
                                         pr.prattrs::text) ORDER BY pr.prrelid::regclass::text)
                   FROM pg_publication_rel pr WHERE pr.prpubid = p.oid), '{}')
  FROM pg_publication p ORDER BY 1
"""
_SLOTS = "SELECT slot_name, plugin, database, restart_lsn::text, confirmed_flush_lsn::text FROM pg_replication_slots ORDER BY 1"
_SUBSCRIPTIONS = "SELECT subname, subenabled, subslotname, subpublications FROM pg_subscription ORDER BY 1"


@dataclass(frozen=True)
class SourceState:
    publications: tuple
    slots: tuple
    subscriptions: tuple
    staging_files: tuple

    @classmethod
    def capture(cls, db, staging: Path | None = None) -> "SourceState":
        """The state of ``db`` (a tests' ``Database``) and of the files under ``staging``."""
        files = ()
        if staging is not None and staging.exists():
            files = tuple(sorted((str(p.relative_to(staging)), p.stat().st_size)
                                 for p in staging.rglob("*") if p.is_file()))
        return cls(
            publications=tuple(db.query(_PUBLICATIONS)),
            slots=tuple(db.cluster.query(_SLOTS)),
            subscriptions=tuple(db.query(_SUBSCRIPTIONS)),
            staging_files=files,
        )


def assert_application_can_write(db, table: str, set_clause: str = "id = id") -> None:
    """UPDATE and DELETE every row of ``table`` in a transaction that is then rolled back."""
    conn = db.connect(autocommit=False)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.SQL("UPDATE {} SET " + set_clause).format(sql.Identifier(*table.split("."))))
            assert cursor.rowcount > 0, f"{table} has no rows to update: the check would prove nothing"
            cursor.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(*table.split("."))))
            assert cursor.rowcount > 0
    finally:
        conn.rollback()
        conn.close()
