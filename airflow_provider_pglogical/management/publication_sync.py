"""Make a publication what the DAG declares, with its checks in the same transaction.

PostgreSQL accepts some publications that then break the application: a row filter on a column
outside the replica identity, a table without a replica identity while UPDATE/DELETE are
published, a column list without the key. Every later ``UPDATE`` of such a table fails. So the
DDL (create, or converge with ``ALTER PUBLICATION … SET``) and :func:`health.find_publisher_problems`
run in one transaction: a failed check rolls everything back and nothing remains. Re-running with
other tables, filters or options converges the publication and reports what changed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence


from airflow_provider_pglogical.exceptions import PublicationError, PublisherCheckError
from airflow_provider_pglogical.management import health
from airflow_provider_pglogical.management import publications as pubs
from airflow_provider_pglogical.management.publications import PublicationInfo, PublishedTable

log = logging.getLogger(__name__)


@dataclass
class PublicationChange:
    """What :func:`ensure_publication` did: ``created``, or the list of ``changes`` (empty: as declared)."""

    name: str
    created: bool
    changes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"publication": self.name, "created": self.created, "changes": self.changes}


def _describe_lines(info: PublicationInfo | None) -> dict[str, str]:
    """Comparable facts of a publication, as PostgreSQL normalised them: ``{aspect: value}``."""
    if info is None:
        return {}
    lines = {f"table {t.schema}.{t.table}": t.psql_line() for t in info.tables}
    lines.update({f"schema {s}": s for s in info.schemas})
    lines["publish"] = ", ".join(info.publish)
    lines["publish_via_partition_root"] = str(info.via_root).lower()
    if info.generated_columns is not None:
        lines["publish_generated_columns"] = info.generated_columns
    return lines


def _differences(before: PublicationInfo, after: PublicationInfo) -> list[str]:
    old, new = _describe_lines(before), _describe_lines(after)
    changes = []
    for aspect in sorted(set(old) | set(new)):
        if aspect not in new:
            changes.append(f"removed {aspect}")
        elif aspect not in old:
            changes.append(f"added {new[aspect]}" if aspect.startswith(("table", "schema")) else f"{aspect} = {new[aspect]}")
        elif old[aspect] != new[aspect]:
            changes.append(f"{aspect}: {old[aspect]} -> {new[aspect]}")
    return changes


def _converge(cursor, name: str, before: PublicationInfo, tables: Sequence[PublishedTable] | None,
              all_tables: bool, schemas: Sequence[str] | None, publish: Sequence[str],
              publish_via_partition_root: bool, publish_generated_columns: str | None) -> None:
    if before.all_tables != all_tables:
        raise PublicationError(
            f"publication {name!r} exists {'FOR ALL TABLES' if before.all_tables else 'with a table list'} and "
            f"the DAG declares it {'FOR ALL TABLES' if all_tables else 'with a table list'}: PostgreSQL cannot "
            f"change that with ALTER PUBLICATION. Nothing was changed. Drop the publication (DROP PUBLICATION "
            f"{name}; subscribers and pipelines using it must be re-synced) or declare it as it is"
        )
    if not all_tables:
        if tables or schemas:
            cursor.execute(pubs.set_publication_objects_sql(name, tables, schemas))
        else:
            for statement in pubs.drop_publication_objects_sql(name, before):
                cursor.execute(statement)
    cursor.execute(pubs.alter_publication_options_sql(
        name, publish=publish, publish_via_partition_root=publish_via_partition_root,
        publish_generated_columns=publish_generated_columns))


def ensure_publication(
    conn, name: str, tables: Sequence[PublishedTable] | None = None, *, all_tables: bool = False,
    schemas: Sequence[str] | None = None, publish: Sequence[str] = pubs.PUBLISH_OPERATIONS,
    publish_via_partition_root: bool = False, publish_generated_columns: str = "none", check: bool = True,
) -> PublicationChange:
    """Create or converge publication ``name`` and check it, all in one transaction on ``conn``.

    :param publish_generated_columns: ``"stored"`` publishes stored generated columns (PostgreSQL
        18; refused before anything runs on an older server), ``"none"`` does not.
    :param conn: a psycopg2 connection with autocommit off; committed on success, rolled back on
        any error (a failed check included), so a failure leaves nothing behind.
    :param check: run the publisher checks on the result before committing.
    :raises PublisherCheckError: listing every problem found (nothing was changed).
    """
    # Statements are built first: a bad name, row filter or option fails before any SQL runs.
    pubs.check_generated_columns(name, publish_generated_columns, conn.server_version)
    generated = publish_generated_columns if conn.server_version >= pubs.GENERATED_COLUMNS_SINCE else None
    create = pubs.create_publication_sql(
        name, tables, all_tables=all_tables, schemas=schemas, publish=publish,
        publish_via_partition_root=publish_via_partition_root, publish_generated_columns=generated,
    )
    try:
        with conn.cursor() as cursor:
            before = pubs.describe_publication(cursor, name)
            if before is None:
                log.info("Executing: %s", create.as_string(cursor))
                cursor.execute(create)
                change = PublicationChange(name, created=True)
            else:
                _converge(cursor, name, before, tables, all_tables, schemas, publish, publish_via_partition_root,
                          generated)
                change = PublicationChange(name, created=False, changes=_differences(before, pubs.describe_publication(cursor, name)))
            if check:
                problems = health.find_publisher_problems(cursor, [name])
                if problems:
                    raise PublisherCheckError(problems, rolled_back=name)
            if before is not None and not change.changes:
                conn.rollback()  # nothing differs: leave the catalog (and its invalidations) alone
                return change
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    for line in change.changes:
        log.info("publication %s: %s", name, line)
    return change
