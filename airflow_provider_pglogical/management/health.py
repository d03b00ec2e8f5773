"""Publisher health checks: find every problem before anything is created or changed.

PostgreSQL only reports some of these late: a row filter on a column outside the replica
identity is accepted by CREATE PUBLICATION and fails at the application's next UPDATE. We read
the catalogs and report all problems at once, each with the object and the fix. Read-only.
"""

from __future__ import annotations

from typing import Sequence

from airflow_provider_pglogical.exceptions import PublisherCheckError

_SETTINGS = """
SELECT current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_replication)::int,
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
       current_user
"""

_MISSING_PUBLICATIONS = "SELECT unnest(%s::text[]) EXCEPT SELECT pubname FROM pg_publication ORDER BY 1"

# Per publication and published relation: which columns the row filter reads (the Var nodes of
# PostgreSQL's stored expression tree), the column list, and the replica-identity columns.
_PUBLISHED_RELATIONS = r"""
SELECT p.pubname, (p.pubupdate OR p.pubdelete), format('%%I.%%I', n.nspname, c.relname), c.relkind,
       c.relreplident, gpt.attrs::int2[],
       (SELECT array_agg(DISTINCT m[1]::int2) FROM regexp_matches(gpt.qual::text, ':varattno (\d+)', 'g') m),
       CASE c.relreplident
         WHEN 'd' THEN (SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
         WHEN 'i' THEN (SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
         WHEN 'f' THEN (SELECT array_agg(a.attnum) FROM pg_attribute a
                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
       END,
       c.oid
  FROM pg_publication p
 CROSS JOIN LATERAL pg_get_publication_tables(p.pubname) gpt
  JOIN pg_class c ON c.oid = gpt.relid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE p.pubname = ANY(%s)
 ORDER BY 1, 3
"""

_ATTNAMES = "SELECT attnum, attname FROM pg_attribute WHERE attrelid = %s AND attnum = ANY(%s::int2[]) ORDER BY attnum"

_EXISTING_TABLES = "SELECT to_regclass(t) IS NOT NULL FROM unnest(%s::text[]) t"


def find_publisher_problems(cursor, publications: Sequence[str], tables: Sequence[str] = (),
                            replica_identity: bool = True) -> list[str]:
    """Every problem that would stop logical replication of ``publications``; empty when ready.

    :param replica_identity: also report published tables whose replica identity cannot carry
        the publication (those break the application's UPDATEs, not the replication itself).
    """
    problems: list[str] = []
    wal_level, max_slots, used_slots, max_senders, used_senders, can_replicate, role = _fetch(cursor, _SETTINGS)[0]
    if wal_level != "logical":
        problems.append(
            f"wal_level is {wal_level!r}: set wal_level = logical in postgresql.conf (ALTER SYSTEM SET "
            "wal_level = logical) and restart the server"
        )
    if used_slots >= max_slots:
        problems.append(
            f"all {max_slots} replication slots are in use (max_replication_slots): drop unused slots "
            "(pg_replication_slots) or raise max_replication_slots and restart"
        )
    if used_senders >= max_senders:
        problems.append(
            f"all {max_senders} WAL senders are busy (max_wal_senders): raise max_wal_senders and restart, "
            "or stop idle replication connections"
        )
    if not can_replicate:
        problems.append(
            f"role {role!r} has neither REPLICATION nor SUPERUSER: ALTER ROLE {role} WITH REPLICATION "
            "(it is needed to create slots with exported snapshots)"
        )
    if tables:
        for name, exists in zip(tables, (r[0] for r in _fetch(cursor, _EXISTING_TABLES, (list(tables),)))):
            if not exists:
                problems.append(f"table {name} does not exist on the publisher: create it or fix the name")
    missing = [r[0] for r in _fetch(cursor, _MISSING_PUBLICATIONS, (list(publications),))]
    for name in missing:
        problems.append(f"publication {name!r} does not exist: create it (create_publication) or fix the name")
    problems += _reserved_column_problems(cursor, publications)
    if not replica_identity:
        return problems
    for pub, updates_or_deletes, table, relkind, replident, attrs, filter_cols, ri_cols, oid in _fetch(
        cursor, _PUBLISHED_RELATIONS, (list(publications),)
    ):
        if not updates_or_deletes or relkind == "p":
            continue
        ri = set(ri_cols or [])
        if not ri:
            problems.append(
                f"table {table} in publication {pub!r} has no replica identity (REPLICA IDENTITY "
                f"{'NOTHING' if replident == 'n' else 'DEFAULT without a primary key'}) while the publication "
                f"publishes UPDATE/DELETE, so PostgreSQL will reject every UPDATE and DELETE on it: add a primary "
                f"key, or ALTER TABLE {table} REPLICA IDENTITY USING INDEX <unique index> (or FULL)"
            )
            continue
        outside_filter = sorted(set(filter_cols or []) - ri)
        if outside_filter:
            names = _names(cursor, oid, outside_filter)
            problems.append(
                f"the row filter of {table} in publication {pub!r} uses column(s) {names} outside the replica "
                f"identity while the publication publishes UPDATE/DELETE, so PostgreSQL will fail the next UPDATE "
                f"of {table}: make the replica identity cover them (e.g. CREATE UNIQUE INDEX ON {table} (<key>, "
                f"{names}); ALTER TABLE {table} REPLICA IDENTITY USING INDEX <that index>), or publish only inserts"
            )
        if attrs:
            outside_list = sorted(ri - set(attrs))
            if outside_list:
                names = _names(cursor, oid, outside_list)
                hint = (
                    "REPLICA IDENTITY FULL makes every column part of the identity, so a column list is "
                    "impossible while UPDATE/DELETE are published: drop the column list, or use a primary key "
                    "or REPLICA IDENTITY USING INDEX"
                    if replident == "f"
                    else f"add {names} to the column list"
                )
                problems.append(
                    f"the column list of {table} in publication {pub!r} leaves out replica-identity column(s) "
                    f"{names} while the publication publishes UPDATE/DELETE, so PostgreSQL will fail the next "
                    f"UPDATE of {table}: {hint}"
                )
    return problems


#: column names the lakehouse side keeps for itself: the keyless tables' ``_pglogical_occurrence`` and
#: ``_pglogical_batch`` columns, and the apply job's working columns (``__op``, ``__lsn``, ``__old0`` …)
RESERVED_PREFIXES = ("_pglogical_", "__")

_RESERVED_COLUMNS = r"""
SELECT DISTINCT format('%%I.%%I', schemaname, tablename), a
  FROM pg_publication_tables, unnest(attnames) a
 WHERE pubname = ANY(%s) AND (starts_with(a, '_pglogical_') OR starts_with(a, '__'))
 ORDER BY 1, 2
"""


def _reserved_column_problems(cursor, publications: Sequence[str]) -> list[str]:
    """Published columns whose names the lakehouse tables or the apply job use themselves.

    Found before a slot exists; staging itself takes any name (see ``staging.staged_name``).
    """
    return [
        f"column {column!r} of {table} has a name the lakehouse keeps for itself (names starting with "
        f"{' or '.join(repr(p) for p in RESERVED_PREFIXES)}): rename it (ALTER TABLE {table} RENAME COLUMN ...), or "
        "leave it out of every publication's column list"
        for table, column in _fetch(cursor, _RESERVED_COLUMNS, (list(publications),))
    ]


def check_publisher(cursor, publications: Sequence[str], tables: Sequence[str] = ()) -> None:
    """Raise :class:`PublisherCheckError` listing every problem found; do nothing when ready."""
    problems = find_publisher_problems(cursor, publications, tables)
    if problems:
        raise PublisherCheckError(problems)


def _fetch(cursor, query: str, params=None) -> list[tuple]:
    cursor.execute(query, params)
    return cursor.fetchall()


def _names(cursor, oid: int, attnums: list[int]) -> str:
    return ", ".join(r[1] for r in _fetch(cursor, _ATTNAMES, (oid, attnums)))
