"""Operators that stage a snapshot: the initial sync of a pipeline, and an ops backfill."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator

from airflow_provider_pglogical.capture.backfill import KeyRange, run_backfill
from airflow_provider_pglogical.capture.chunked.load import DEFAULT_CHUNK_ROWS, run_chunked_sync
from airflow_provider_pglogical.capture.chunked.plan import SnapshotMode
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.operators._capture import CaptureOperator
from airflow_provider_pglogical.operators._errors import fail_permanent_errors
from airflow_provider_pglogical.operators.spark_copy import SparkCopy


if TYPE_CHECKING:
    from airflow.sdk import Context


def checked_parallelism(operator: BaseOperator) -> int:
    """The rendered ``parallelism`` as a count of connections, or a clear error before any work."""
    value = operator.parallelism
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or (isinstance(value, float) and not value.is_integer()):
        raise InvalidInputError(
            f"{type(operator).__name__} {operator.task_id!r}: parallelism must be a whole number of "
            f"connections, 1 or more (got {value!r}); pass e.g. parallelism=2"
        )
    return count


def spark_copier(operator: BaseOperator, hook, root, parallelism: int):
    """The operator's ``copy_on_spark`` as a copier (None: the copy runs on this worker); an
    object-store staging root is refused here, before any slot exists."""
    if operator.copy_on_spark is None:
        return None
    return operator.copy_on_spark.copier(hook.connect_kwargs(), root, parallelism,
                                         f"{type(operator).__name__} {operator.task_id!r}", operator.log.info)


class PgInitialSyncOperator(CaptureOperator):
    """Create the pipeline's slot and stage a filtered, parallel snapshot of its publications.

    The snapshot batch sits at the slot's consistent LSN, so the change batches pulled from the
    slot continue it exactly. Row filters and column lists follow PostgreSQL's rules. Safe to
    retry: a committed snapshot is kept; a slot left by an attempt that died is recreated.

    :param slot: the pipeline's logical slot (created here; must not exist, unless this pipeline made it).
    :param publications: publications whose tables to copy.
    :param staging_root: root of the staging area (``file://``, ``s3://``, … via ObjectStoragePath);
        ``staging_path``, its old name, still works with a deprecation warning.
    :param pipeline: name of the pipeline: the staging sub-directory.
    :param parallelism: connections copying at once (tables are split by ctid ranges).
    :param type_overrides: ``{"schema.table.column": "string"}``: stage these columns as
        PostgreSQL's exact text output (a string column in Iceberg), for values the column's
        mapped type cannot hold (``infinity``, ``numeric`` NaN, …); pass the same mapping to the
        initial sync, backfill and pull operators of a pipeline (docs/types.md).
    :param failover: create the slot with ``FAILOVER`` (PostgreSQL 17+), so a physical standby that
        syncs slots keeps it and the pipeline continues on the promoted standby with nothing lost or
        doubled. Refused before anything is created on 15/16, or when the primary's
        ``synchronized_standby_slots`` is empty; check the standby with
        ``PgCheckPublisherOperator(failover=True, standby_conn_id=...)`` (docs/failover.md).
    :param copy_on_spark: run the copy's work units as tasks of a Spark job
        (``SparkCopy(conn_id="spark_cluster")``) instead of on this worker: each executor imports
        the exported snapshot and writes its units' files; ``parallelism`` units run at once. The
        batch is the same (docs/operators.md, "Copying on a Spark cluster").
    :param append_only: accept publications that do not publish updates and deletes: the lakehouse
        then keeps every row ever inserted (docs/reliability.md); otherwise they are refused before
        the slot exists. Pass the same to the pull.
    :param snapshot_mode: ``SnapshotMode.EXPORTED`` (the default): every table inside one exported
        snapshot, one transaction open for the whole copy; ``SnapshotMode.CHUNKED``: each table in key
        chunks of about ``chunk_rows`` rows, each chunk in its own short transaction, reconciled with the
        slot by watermarks, resumable after a kill at the first chunk not staged. A table without a
        primary key or replica identity index (a multiset), or whose key does not start with an
        integer or text column, is loaded whole in an exported snapshot of a temporary slot of its
        own, holding the xmin for that table's copy only (docs/snapshots.md says when to use which).
    :param chunk_rows: rows per chunk of a chunked load.
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = (
        "slot", "publications", "staging_root", "pipeline", "parallelism", "type_overrides", "postgres_conn_id",
        "snapshot_mode", "chunk_rows",
    )
    ui_color = "#cfe8fc"

    def __init__(self, *, slot: str, parallelism: int = 2, failover: bool = False,
                 copy_on_spark: SparkCopy | None = None, append_only: bool = False,
                 snapshot_mode: SnapshotMode | str = SnapshotMode.EXPORTED, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.slot = slot
        self.parallelism = parallelism
        self.failover = failover
        self.copy_on_spark = copy_on_spark
        self.append_only = append_only
        self.snapshot_mode = snapshot_mode
        self.chunk_rows = chunk_rows

    def _mode(self) -> SnapshotMode:
        """The rendered ``snapshot_mode``, or a clear error before any work."""
        try:
            mode = SnapshotMode(self.snapshot_mode)
        except ValueError:
            raise InvalidInputError(
                f"{type(self).__name__} {self.task_id!r}: snapshot_mode must be one of "
                f"{', '.join(repr(m.value) for m in SnapshotMode)} (got {self.snapshot_mode!r})") from None
        if mode is SnapshotMode.CHUNKED and (self.copy_on_spark is not None or self.failover):
            raise InvalidInputError(
                f"{type(self).__name__} {self.task_id!r}: snapshot_mode='chunked' reads on this worker and creates "
                "the slot without FAILOVER: drop copy_on_spark and failover, or use snapshot_mode='exported'")
        return mode

    def execute(self, context: Context) -> dict:
        with fail_permanent_errors():
            parallelism = checked_parallelism(self)
            if self._mode() is SnapshotMode.CHUNKED:
                hook, root = self.publisher_and_staging()
                return self.remember_lineage(hook, root, run_chunked_sync(
                    hook, slot=self.slot, publications=self.publications, root=root, pipeline=self.pipeline,
                    chunk_rows=int(self.chunk_rows), type_overrides=self.type_overrides, report=self.log.info,
                    append_only=self.append_only,
                ))
            hook, root = self.publisher_and_staging()
            copier = spark_copier(self, hook, root, parallelism)
            return self.remember_lineage(hook, root, run_initial_sync(
                hook, slot=self.slot, publications=self.publications, root=root, pipeline=self.pipeline,
                parallelism=parallelism, type_overrides=self.type_overrides, report=self.log.info,
                failover=bool(self.failover), copier=copier, append_only=self.append_only,
            ))


# Its :param lines repeat PgInitialSyncOperator's on purpose: Airflow's docs and a user's IDE show
# one operator's docstring at a time, so each carries every parameter it takes.
class PgBackfillOperator(CaptureOperator):
    """Re-snapshot one or more tables while the pipeline's slot keeps flowing.

    A temporary slot gives a fresh snapshot and its LSN; the apply job replaces the tables (or
    the key range) at that LSN and re-applies later changes, so both together give the source state.

    :param tables: ``schema.table`` names to re-snapshot (must be published).
    :param key_range: optional ``{"column": "id", "start": 100, "end": 200}`` (half-open) to
        re-snapshot only part of the tables.
    :param publications: the pipeline's publications (for row filters and column lists).
    :param staging_root: root of the staging area (``staging_path``, its old name, is deprecated).
    :param pipeline: the pipeline's name.
    :param parallelism: connections copying at once.
    :param type_overrides: ``{"schema.table.column": "string"}``: stage these columns as
        PostgreSQL's exact text output (a string column in Iceberg), for values the column's
        mapped type cannot hold (``infinity``, ``numeric`` NaN, …); pass the same mapping to the
        initial sync, backfill and pull operators of a pipeline (docs/types.md).
    :param copy_on_spark: run the copy's work units as tasks of a Spark job
        (``SparkCopy(conn_id="spark_cluster")``) instead of on this worker, as
        :class:`PgInitialSyncOperator` does; ``parallelism`` units run at once.
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    """

    template_fields: Sequence[str] = (
        "tables", "key_range", "publications", "staging_root", "pipeline", "parallelism", "type_overrides",
        "postgres_conn_id",
    )
    ui_color = "#fce8cf"

    def __init__(
        self, *, tables: Sequence[str] | str, key_range: dict | None = None, parallelism: int = 2,
        copy_on_spark: SparkCopy | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.tables = tables
        self.key_range = key_range
        self.parallelism = parallelism
        self.copy_on_spark = copy_on_spark

    def execute(self, context: Context) -> dict:
        with fail_permanent_errors():
            parallelism = checked_parallelism(self)
            tables = [self.tables] if isinstance(self.tables, str) else list(self.tables)
            key_range = KeyRange(**self.key_range) if self.key_range else None
            hook, root = self.publisher_and_staging()
            return self.remember_lineage(hook, root, run_backfill(
                hook, tables=tables, publications=self.publications, root=root, pipeline=self.pipeline,
                key_range=key_range, parallelism=parallelism, type_overrides=self.type_overrides,
                report=self.log.info, copier=spark_copier(self, hook, root, parallelism),
            ))
