"""The apply job's state table: per pipeline and source table, the position the lakehouse holds.

Its own small object (``Lakehouse.state``), not a base class of the lakehouse the appliers are
handed: it uses the lakehouse's ``name``, ``loaded_table``, ``iceberg_table`` and ``create_by_catalog``.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.apply.plan import Batch, TableState
from airflow_provider_pglogical.spark.common.identifiers import col, sql_string
from airflow_provider_pglogical.staging.contract import (
    ORPHANED_PROPERTY, SNAPSHOT_BATCH, SNAPSHOT_FROM_LSN, SNAPSHOT_LSN, SNAPSHOT_PIPELINE, STATE_TABLE, hex16)

#: every commit writes a ``v<N>.metadata.json``: keep the last 100 and delete older ones at commit,
#: so a table's metadata stays flat however often it is applied (the state table commits every round)
METADATA_PROPERTIES = {"write.metadata.delete-after-commit.enabled": "true",
                       "write.metadata.previous-versions-max": "100"}


def metadata_properties() -> str:
    """:data:`METADATA_PROPERTIES` as the tail of a ``TBLPROPERTIES (...)`` list."""
    return "".join(f", {sql_string(name)}={sql_string(value)}" for name, value in METADATA_PROPERTIES.items())


#: the state table's columns a run reads, in ``TableState``'s order after the source table
_STATE_COLUMNS = ("source_table", "target_table", "position", "applied_snapshots", "last_batch")


def _comparable(rows) -> list[tuple]:
    """State rows (:data:`_STATE_COLUMNS`) in one order and form, read or written alike."""
    return sorted((source, target, position, tuple(sorted(snapshots or ())), last_batch)
                  for source, target, position, snapshots, last_batch in rows)


class StateTable:
    """Reading and writing this job's state table (one partition per pipeline).

    :param lakehouse: the namespace it lives in (``lakehouse_tables.Lakehouse``).
    """

    def __init__(self, lakehouse) -> None:
        self.lakehouse = lakehouse
        self.spark = lakehouse.spark
        #: per pipeline, the state table's snapshot its rows were last read or written at
        self._state_snapshots: dict[str, int | None] = {}
        #: per pipeline, those rows (:func:`_comparable`): what a commit that met housekeeping checks
        self._rows_seen: dict[str, list[tuple]] = {}

    def read_state(self, pipeline: str) -> dict[str, TableState]:
        """This pipeline's rows of the state table (created when missing).

        The driver reads the rows through Iceberg's reader (``_state_rows_by_driver``): in a fresh
        JVM a Spark query of the table costs 2-3 s, most of a small tick's job. At the snapshot this
        run last read or wrote, or one only lease fences followed (a window's next round), the rows
        are the ones it holds already: on an object store that read was six requests a round."""
        table = self.state_table()
        snapshot = table.currentSnapshot()  # what is read (the catalog's table, Spark's too)
        read_at = snapshot.snapshotId() if snapshot is not None else None
        if pipeline in self._rows_seen and _only_fences_since(table, self._state_snapshots.get(pipeline), snapshot):
            rows = list(self._rows_seen[pipeline])
        else:
            rows = self._state_rows_by_driver(table, read_at, pipeline)
            self._rows_seen[pipeline] = _comparable(rows)
        self._state_snapshots[pipeline] = read_at
        return {
            source: TableState(target, int(position, 16), set(snapshots or ()), last_batch)
            for source, target, position, snapshots, last_batch in rows
        }

    def state_table(self):
        """The state table (Iceberg's Java table), created on first use (by one of two applies that
        start at once: the other finds it)."""
        table = self.lakehouse.loaded_table(STATE_TABLE)
        if table is not None:
            return table
        try:
            self._create_state_table()
        except Exception:
            table = self.lakehouse.loaded_table(STATE_TABLE)
            if table is None:
                raise
            return table
        return self.lakehouse.iceberg_table(STATE_TABLE)

    def _create_state_table(self) -> None:
        columns = {"pipeline": ("string", False), "source_table": ("string", False), "target_table": ("string", True),
                   "position": ("string", True), "applied_snapshots": ("array<string>", True),
                   "last_batch": ("string", True), "updated_at": ("timestamp", True)}
        properties = {"format-version": str(self.lakehouse.format_version), "write.update.mode": "copy-on-write",
                      "write.delete.mode": "copy-on-write", "write.merge.mode": "copy-on-write", **METADATA_PROPERTIES}
        if self.lakehouse.create_by_catalog(STATE_TABLE, columns, properties, [("identity", "pipeline", None)]):
            return
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS {self.lakehouse.name(STATE_TABLE)} (pipeline string NOT NULL, "
            "source_table string NOT NULL, target_table string, position string, applied_snapshots array<string>, "
            "last_batch string, updated_at timestamp) USING iceberg PARTITIONED BY (pipeline) "
            f"TBLPROPERTIES ('format-version'='{int(self.lakehouse.format_version)}', 'write.update.mode'='copy-on-write', "
            "'write.delete.mode'='copy-on-write', 'write.merge.mode'='copy-on-write'"
            + metadata_properties() + ")"
        )

    def _state_rows_by_driver(self, table, snapshot: int | None, pipeline: str) -> list[tuple]:
        """The pipeline's state rows at ``snapshot``, read by Iceberg's own reader in the driver
        (``lookups/table_rows.py``: any FileIO, deletes and schema evolution followed; no Spark job)."""
        from airflow_provider_pglogical.spark.lookups.table_rows import read_rows

        return read_rows(self.spark, table, snapshot, list(_STATE_COLUMNS), {"pipeline": [pipeline]})

    def write_state(self, pipeline: str, states: dict[str, TableState], by_driver: bool = True) -> None:
        """:meth:`_write_state`, once more when it met a commit that left this pipeline's rows as
        this run last read or wrote them (housekeeping compacting the state table, or expiring the
        snapshot the run read): the rows are then still this run's own. Any other change of them
        is another apply's, and the conflict stands."""
        from airflow_provider_pglogical.spark.row_delta.driver_commits import ConcurrentCommit

        try:
            self._write_state(pipeline, states, by_driver)
        except ConcurrentCommit:
            table = self.state_table()
            snapshot = table.currentSnapshot()
            now_at = snapshot.snapshotId() if snapshot is not None else None
            if pipeline not in self._rows_seen or \
                    _comparable(self._state_rows_by_driver(table, now_at, pipeline)) != self._rows_seen[pipeline]:
                raise
            self._state_snapshots[pipeline] = now_at
            self._write_state(pipeline, states, by_driver)

    def _write_state(self, pipeline: str, states: dict[str, TableState], by_driver: bool = True) -> None:
        """Replace this pipeline's rows of the state table in one commit, which refuses when another
        commit changed them since this run read or wrote them (``ConcurrentCommit``).

        The driver writes the rows' Parquet file and commits it itself (``DriverCommits.replace_partition``)
        where pyarrow is importable (``driver_commits.py``): a Spark write cost every round 0.3-0.5 s of a small tick.
        Else, or with ``by_driver=False``, Spark overwrites the pipeline's partition. Either way
        it is one Iceberg commit replacing the partition's files."""
        from pyspark.sql import functions as F

        from airflow_provider_pglogical.spark.row_delta.driver_commits import DriverCommits, pyarrow_missing, validated_overwrite

        rows = [
            (pipeline, source, s.target, hex16(s.position), sorted(s.snapshots), s.last_batch)
            for source, s in sorted(states.items())
        ]
        read_at = self._state_snapshots.get(pipeline)
        if by_driver and pyarrow_missing() is None:
            writer = DriverCommits(self.spark, self.lakehouse)
            table = writer.load(STATE_TABLE)
            self._state_snapshots[pipeline] = writer.replace_partition(
                table, self._state_rows(writer, table, rows), "pipeline", pipeline, read_at=read_at)
            self._rows_seen[pipeline] = _comparable(row[1:] for row in rows)  # without the pipeline
            return
        schema = ("pipeline string, source_table string, target_table string, position string, "
                  "applied_snapshots array<string>, last_batch string")
        frame = self.spark.createDataFrame(rows, schema).withColumn("updated_at", F.current_timestamp())
        committed = validated_overwrite(self.lakehouse, STATE_TABLE, frame, col("pipeline") == F.lit(pipeline), read_at)
        # its own snapshot, not the table's newest (another writer's commit after it must still conflict)
        self._state_snapshots[pipeline] = committed if committed is not None else read_at
        self._rows_seen[pipeline] = _comparable(row[1:] for row in rows)

    @staticmethod
    def _state_rows(writer, table, rows: list[tuple]):
        """The state rows as an Arrow table with the state table's field ids, stamped now."""
        import datetime

        import pyarrow as pa

        names = ["pipeline", "source_table", "target_table", "position", "applied_snapshots", "last_batch"]
        kinds = [pa.string(), pa.string(), pa.string(), pa.string(), pa.list_(pa.string()), pa.string()]
        schema = table.schema()
        fields = [writer.arrow_field(schema, name, kind) for name, kind in zip(names, kinds)]
        arrays = [pa.array([row[i] for row in rows], type=kind) for i, kind in enumerate(kinds)]
        now = datetime.datetime.now(datetime.timezone.utc)
        fields.append(writer.arrow_field(schema, "updated_at", pa.timestamp("us", "UTC")))
        arrays.append(pa.array([now] * len(rows), type=pa.timestamp("us", "UTC")))
        return pa.Table.from_arrays([array.cast(field.type) for array, field in zip(arrays, fields)],
                                    schema=pa.schema(fields))


def _only_fences_since(table, seen: int | None, snapshot) -> bool:
    """Whether ``snapshot`` (the state table's current, Java) is snapshot ``seen`` or follows it
    through lease fences alone (``lease.ApplyLease._fence``: empty snapshots, no file added or
    removed), so the rows at both are the same."""
    from airflow_provider_pglogical.spark.apply.lease import FENCE_SUMMARY_PROPERTY

    changes = ("added-data-files", "deleted-data-files", "added-delete-files", "removed-delete-files")
    while snapshot is not None and snapshot.snapshotId() != seen:
        summary = snapshot.summary()  # a Java map: a missing key reads as None
        if summary.get(FENCE_SUMMARY_PROPERTY) is None or any((summary.get(key) or "0") != "0" for key in changes):
            return False
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None
    return snapshot is not None or seen is None


def settle_orphans(lakehouse, orphaned: dict[str, dict], states: dict[str, TableState], pipeline: str) -> dict[str, str]:
    """Mark (the table property ``pglogical.orphaned``) or drop the Iceberg tables of the sources a
    ``publish_via_partition_root`` flip orphaned (the pipeline record's ``orphaned``, written by the
    pull: ``capture/published_changes.py``), after the run applied what they had pending. A dropped
    one leaves the states (committed here), so no later run rebuilds it. Returns source -> "marked"
    or "dropped"."""
    done: dict[str, str] = {}
    for source, info in sorted(orphaned.items()):
        state = states.get(source)
        if state is None:
            continue
        table = lakehouse.loaded_table(state.target)
        if info.get("action") == "drop":
            lakehouse.spark.sql(f"DROP TABLE IF EXISTS {lakehouse.name(state.target)} PURGE")
            del states[source]
            done[source] = "dropped"
        elif table is not None:
            if table.properties().get(ORPHANED_PROPERTY) != info["why"]:
                lakehouse.spark.sql(f"ALTER TABLE {lakehouse.name(state.target)} SET TBLPROPERTIES "
                                    f"({sql_string(ORPHANED_PROPERTY)} = {sql_string(info['why'])})")
            done[source] = "marked"
    if "dropped" in done.values():
        lakehouse.state.write_state(pipeline, states)
    return done


#: how many snapshots back :func:`landed_position` looks for the pipeline's newest commit
#: (housekeeping commits without the pipeline's stamp may lie on top of it)
LANDED_LOOKBACK = 20


def landed_position(lakehouse, state: TableState, pipeline: str) -> tuple[int, str] | None:
    """(position, batch) of a change step whose data commit landed in ``state.target`` past
    ``state.position`` without its state commit (a crash, or a failed round, between the two);
    None when the state holds the table's newest commit.

    Only a folded step's (``plan.fold_changes``; its commit applied from before its last batch's
    start): a keyless step skips the row values the same step marked already, so its re-run is
    exact only when it folds the same batches, and a re-run after more batches arrived, or a
    one-off apply that does not fold, would not. Each commit's summary says which position it holds
    (``commit_stamp.py``), so the state moves there and the next step starts after it."""
    table = lakehouse.loaded_table(state.target)
    snapshot = table.currentSnapshot() if table is not None else None
    for _ in range(LANDED_LOOKBACK):
        if snapshot is None:
            return None
        summary = snapshot.summary()
        if summary.get(SNAPSHOT_PIPELINE) == pipeline:
            batch, lsn = Batch.parse(summary.get(SNAPSHOT_BATCH) or ""), summary.get(SNAPSHOT_LSN)
            if batch is None or batch.kind != "changes" or not lsn or int(lsn, 16) <= state.position:
                return None
            # a folded step applied from before its (last) batch's start; a step of one batch is
            # exact to apply again (its marks), as it always was
            if int(summary.get(SNAPSHOT_FROM_LSN) or "0", 16) >= batch.start:
                return None
            return int(lsn, 16), batch.name
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None
    return None
