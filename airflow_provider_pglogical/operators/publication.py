"""Operators that set up the publisher: create a publication, check the publisher's health."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.management.publications import PUBLISH_OPERATIONS, PublishedTable
from airflow_provider_pglogical.operators._errors import fail_permanent_errors


if TYPE_CHECKING:
    from airflow.sdk import Context


def _as_published(tables: Sequence[PublishedTable | dict | str] | None) -> list[PublishedTable] | None:
    """Accept PublishedTable objects, plain names, or dicts (templated/JSON-friendly)."""
    if tables is None:
        return None
    if isinstance(tables, (str, dict, PublishedTable)):  # one table, e.g. a rendered template
        tables = [tables]
    out = []
    for table in tables:
        if isinstance(table, PublishedTable):
            out.append(table)
        elif isinstance(table, str):
            out.append(PublishedTable(table))
        else:
            out.append(PublishedTable(**table))
    return out


class PgCreatePublicationOperator(BaseOperator):
    """Create the publication, or converge an existing one to what is declared, and check it.

    The DDL and the checks run in one transaction: when a check fails (for example a row filter
    on a column outside the replica identity, which would make the application's UPDATEs fail),
    nothing is left behind. Re-running with other tables, filters or options changes the
    publication (``ALTER PUBLICATION … SET``) and returns what changed.

    :param publication: the publication's name.
    :param tables: tables to publish (``PublishedTable``, ``"schema.table"`` or
        ``{"name": …, "columns": […], "where": "…"}``); or use ``all_tables`` / ``schemas``.
        (templated: the names and dicts; ``PublishedTable`` objects are used as they are)
    :param all_tables: ``FOR ALL TABLES``.
    :param schemas: ``FOR TABLES IN SCHEMA``.
    :param publish: the DML operations to publish.
    :param publish_via_partition_root: publish partitions as their root table.
    :param publish_generated_columns: ``"stored"`` publishes stored generated columns, which the
        snapshot then copies too (PostgreSQL 18 and later; refused on an older server, changing
        nothing); ``"none"`` (default) leaves generated columns out of snapshot and changes alike.
    :param check: check the result before committing and fail (changing nothing) with every problem found.
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = ("publication", "tables", "schemas", "publish", "postgres_conn_id")
    ui_color = "#e8f4e8"

    def __init__(
        self, *, publication: str, tables: Sequence[PublishedTable | dict | str] | None = None,
        all_tables: bool = False, schemas: Sequence[str] | None = None,
        publish: Sequence[str] = PUBLISH_OPERATIONS, publish_via_partition_root: bool = False,
        publish_generated_columns: str = "none", check: bool = True, postgres_conn_id: str = PgLogicalHook.default_conn_name, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.publication = publication
        self.tables = tables
        self.all_tables = all_tables
        self.schemas = schemas
        self.publish = publish
        self.publish_via_partition_root = publish_via_partition_root
        self.publish_generated_columns = publish_generated_columns
        self.check = check
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> dict:
        with fail_permanent_errors():
            hook = PgLogicalHook(postgres_conn_id=self.postgres_conn_id)
            change = hook.ensure_publication(
                self.publication, _as_published(self.tables), all_tables=self.all_tables, schemas=self.schemas,
                publish=self.publish, publish_via_partition_root=self.publish_via_partition_root, check=self.check,
                publish_generated_columns=self.publish_generated_columns,
            )
            if change.created:
                self.log.info("Created publication %s", self.publication)
            elif change.changes:
                # drift: someone changed the publication by hand, or the DAG's declaration changed
                self.log.warning("Publication %s differed from what the DAG declares; converged it: %s",
                                 self.publication, "; ".join(change.changes))
            else:
                self.log.info("Publication %s is as declared already", self.publication)
            tables = [t.qualified_name for t in hook.published_tables([self.publication])]
            return {**change.as_dict(), "tables": tables}


class PgCheckPublisherOperator(BaseOperator):
    """Fail with one message listing every problem that would stop replication of ``publications``.

    Warnings that do not stop replication yet (an ``idle_replication_slot_timeout`` under a day, or
    under three of the DAG's intervals, taken from the run's data interval) are logged and returned.

    :param publications: the publications to check.
    :param failover: also check what failover slots need (PostgreSQL 17+, the primary's
        ``synchronized_standby_slots``), as ``PgInitialSyncOperator(failover=True)`` will.
    :param standby_conn_id: the physical standby's Airflow connection: also check its
        ``sync_replication_slots``, ``hot_standby_feedback``, ``primary_conninfo`` and ``primary_slot_name``.
        (templated)
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = ("publications", "standby_conn_id", "postgres_conn_id")

    def __init__(
        self, *, publications: Sequence[str], failover: bool = False, standby_conn_id: str | None = None,
        postgres_conn_id: str = PgLogicalHook.default_conn_name, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.publications = publications
        self.failover = failover
        self.standby_conn_id = standby_conn_id
        self.postgres_conn_id = postgres_conn_id

    def execute(self, context: Context) -> list[str]:
        with fail_permanent_errors():
            standby = PgLogicalHook(postgres_conn_id=self.standby_conn_id) if self.standby_conn_id else None
            warnings = PgLogicalHook(postgres_conn_id=self.postgres_conn_id).check_publisher(
                list(self.publications), failover=bool(self.failover or standby), standby=standby,
                pull_every=schedule_interval_seconds(context))
            for warning in warnings:
                self.log.warning(warning)
            return warnings


def schedule_interval_seconds(context: Context) -> float | None:
    """The run's data interval in seconds (how often a scheduled DAG runs); None for a manual run or
    an asset-triggered one, whose interval says nothing of the next run."""
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        return None
    seconds = (end - start).total_seconds()
    return seconds if seconds > 0 else None
