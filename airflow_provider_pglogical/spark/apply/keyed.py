"""Applying steps to a keyed table: a snapshot overwrites (or MERGEs a key range), a change batch
is reduced to one row per key and applied with ONE ``MERGE INTO`` (or, holding a TRUNCATE, replaces
the table). Which path a step takes (adoption, row delta, …) is chosen in ``paths/choice.py``."""

from __future__ import annotations

import logging
from functools import reduce

from airflow_provider_pglogical.spark.common.identifiers import col, quote, temporary_view_name
from airflow_provider_pglogical.spark.apply.lakehouse_tables import BATCH_TABLE_PREFIX
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.plan import Step, range_predicate
from airflow_provider_pglogical.spark.apply.reduction import reduce_changes
from airflow_provider_pglogical.spark.row_delta.row_deltas import RowDeltas
from airflow_provider_pglogical.spark.apply.steps import StepApplier
from airflow_provider_pglogical.staging.seam.manifests import TableManifest

log = logging.getLogger("pglogical.apply")

#: a MERGE prunes its target's scan when the table has at least this many rows more than ten
#: per batch row, or (``PRUNED_MERGE_BYTES``) this many bytes of data files more than
#: ``PRUNED_BYTES_PER_BATCH_ROW`` per batch row (``prunes``)
PRUNED_MERGE_ROWS = 500_000
PRUNED_MERGE_BYTES = 16 * 1024 * 1024
PRUNED_BYTES_PER_BATCH_ROW = 256


def prunes(table_rows: int, batch_rows: int, table_bytes: int = 0) -> bool:
    """Whether a MERGE is cheaper with the target's scan pruned by the batch's keys.

    Without pruning the MERGE shuffles every table row, whole (about 0.3 s per million narrow
    rows on 2 cores, and as much per 20,000 rows holding an 8 kB value); pruning computes the
    batch apart and builds its bloom filter first (two Spark jobs, and about 3 µs per batch row).
    So it pays for a table with many rows or large ones next to its batch. Measured by
    ``bench/bench_apply.py --layouts plain,plain-unpruned`` (a 100k-change batch applies faster
    unpruned into 500k narrow rows, 4.9 MB, and pruned into 5M, 44 MB) and ``bench_mixed_tick.py``
    (400 changes into 20,000 rows of 8 kB values, 92 MB: the step's Spark work halves).
    """
    return (table_rows >= PRUNED_MERGE_ROWS + 10 * batch_rows
            or table_bytes >= PRUNED_MERGE_BYTES + PRUNED_BYTES_PER_BATCH_ROW * batch_rows)


def pruning_source(frame):
    """The reduced batch as a MERGE source that Spark prunes the target's scan with.

    Spark plans the MERGE as ``target RIGHT OUTER JOIN batch`` and shuffles every target row. Its
    runtime filter (``InjectRuntimeFilter``) adds a bloom filter of the batch's keys to the target's
    scan, so only rows that may match reach the shuffle; it does so only for a join whose other
    side is a filtered scan. So the batch is computed once into the executors' memory (a scan) and
    read behind a filter that holds for every reduced row (``__op`` is ``D`` or ``U``).
    ``session_defaults`` sets the thresholds that let the filter apply.
    """
    from pyspark.sql import functions as F

    return frame.localCheckpoint().where(F.col("__op").isin("D", "U"))


def join_condition(manifest: TableManifest) -> str:
    """The MERGE's ON clause between target ``t`` and source ``s`` on the replica-identity key."""
    # identifier (NOT NULL) keys join with '='; REPLICA IDENTITY FULL rows may hold NULLs
    equals = "<=>" if manifest.replica_identity == "f" else "="
    return " AND ".join(f"t.{quote(k)} {equals} s.{quote(k)}" for k in manifest.key)


class KeyedTables(StepApplier):
    """Applies steps to tables with a replica-identity key (a primary key or USING INDEX).

    :param row_deltas: the small change batches ``paths/choice.py`` sends to a row delta are applied
        as Iceberg row deltas (``row_deltas.py``) instead of a MERGE; ``row_delta_steps`` names the
        ``(source, batch)`` steps that were.
    """

    def __init__(self, spark, staging, lakehouse, row_deltas: bool = True) -> None:
        super().__init__(spark, staging, lakehouse)
        self.row_deltas = RowDeltas(spark, staging, lakehouse) if row_deltas else None

    def snapshot(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import functions as F

        manifest = step.batch.manifest.tables[source]
        predicate = range_predicate(step.batch.manifest.snapshot_scope(source), step.batch.name, source)
        frame = self.read(step, source, types, changes=False)
        if predicate is None:
            self.replace_all(frame, target)
            return manifest.rows
        view = temporary_view_name("snapshot")
        frame.createOrReplaceTempView(view)
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {view} s ON {join_condition(manifest)} "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{quote(c)} = s.{quote(c)}' for c in types)} "
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(map(quote, types))}) VALUES ({', '.join('s.' + quote(c) for c in types)}) "
            f"WHEN NOT MATCHED BY SOURCE AND {predicate} THEN DELETE"
        )
        self.spark.catalog.dropTempView(view)
        return manifest.rows

    def changes(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import functions as F

        manifest = step.batch.manifest.tables[source]
        keys = list(manifest.key)
        if not keys:
            raise ApplyError(
                f"batch {step.batch.name}, table {source}: no replica-identity key; set REPLICA IDENTITY "
                "(a primary key, USING INDEX or FULL) on the source table"
            )
        batch_columns = [c.name for c in manifest.columns]
        values = [c for c in batch_columns if c not in keys]
        batch_types = {c: types[c] for c in batch_columns}
        if not manifest.files:
            return 0
        rows = self.read(step, source, batch_types, changes=True)
        reduced = reduce_changes(self.spark, rows, keys, values, step.position,
                                 manifest.facts_decide(step.position))
        if reduced.rows == 0:
            return 0
        frame = reduced.frame
        if reduced.truncated:
            kept = frame.where(F.col("__op") != "D").select(*map(col, batch_columns))
            kept = kept.withColumns({  # dropped columns: NULL
                name: F.lit(None).cast(kind) for name, kind in types.items() if name not in batch_types})
            self.replace_all(kept.select(*map(col, types)), target)
            return reduced.rows
        keep = reduced.unchanged_columns
        if keep and reduced.moved_unchanged:
            frame = self._fetch_moved(frame, target, keys, values)
        source, staged = self._merge_source(frame, target, keys, reduced.rows)
        sets = []
        for index, name in enumerate(values):
            if name in keep:
                sets.append(f"{quote(name)} = CASE WHEN s.__keep{index} THEN t.{quote(name)} ELSE s.{quote(name)} END")
            else:
                sets.append(f"{quote(name)} = s.{quote(name)}")
        matched_update = f"WHEN MATCHED THEN UPDATE SET {', '.join(sets)} " if sets else ""
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {source} s ON {join_condition(manifest)} "
            "WHEN MATCHED AND s.__op = 'D' THEN DELETE "
            f"{matched_update}"
            f"WHEN NOT MATCHED AND s.__op <> 'D' THEN INSERT ({', '.join(map(quote, batch_columns))}) "
            f"VALUES ({', '.join('s.' + quote(c) for c in batch_columns)})"
        )
        if staged:
            self.spark.sql(f"DROP TABLE IF EXISTS {source} PURGE")
        else:
            self.spark.catalog.dropTempView(source)
        return reduced.rows

    def _merge_source(self, frame, target: str, keys: list[str], batch_rows: int) -> tuple[str, bool]:
        """What the MERGE reads the reduced batch from: a temporary view or, for a bucketed target,
        an Iceberg table bucketed the same way (True).

        A MERGE shuffles every target row to join it with the batch, so its cost grows with the
        table. When both sides are Iceberg tables bucketed alike on the join key, Spark joins them
        bucket by bucket without that shuffle (a storage-partitioned join, ``session_defaults``).
        Each MERGE gets a table of its own name, dropped after it; ones a killed run left behind
        are dropped when the next run starts (:meth:`Lakehouse.drop_batch_tables`).
        """
        import uuid

        from pyspark.sql import functions as F

        if not (self.lakehouse.bucket_count and keys and self.lakehouse.bucketed(target, keys[0])):
            view = temporary_view_name("changes")
            size = self.lakehouse.size(target)
            if prunes(size.rows, batch_rows, size.bytes):
                frame = pruning_source(frame)
            frame.createOrReplaceTempView(view)
            return view, False
        staged = self.lakehouse.name(f"{BATCH_TABLE_PREFIX}{target}__{uuid.uuid4().hex[:12]}")
        (frame.writeTo(staged).using("iceberg").tableProperty("format-version", "2")
         .partitionedBy(F.bucket(int(self.lakehouse.bucket_count), col(keys[0]))).create())
        return staged, True

    def _fetch_moved(self, frame, target, keys, values):
        """Moved rows (``__ok`` != key) take kept values from the lakehouse row of their old key."""
        from pyspark.sql import functions as F

        same = reduce(lambda a, b: a & b, [col(k).eqNullSafe(F.col(f"__ok{i}")) for i, k in enumerate(keys)])
        moved = frame.where(~same & (F.col("__op") != "D"))
        lake = self.spark.table(self.lakehouse.name(target)).select(
            *[col(k).alias(f"__lk{i}") for i, k in enumerate(keys)],
            *[col(v).alias(f"__lv{i}") for i, v in enumerate(values)], F.lit(True).alias("__found"))
        cond = reduce(lambda a, b: a & b, [F.col(f"__ok{i}").eqNullSafe(F.col(f"__lk{i}")) for i in range(len(keys))])
        fetched = moved.join(lake, cond, "left")
        taken = {}
        for index, name in enumerate(values):  # one projection, every expression on the joined row
            take = F.col(f"__keep{index}") & F.col("__found").isNotNull()
            taken[name] = F.when(take, F.col(f"__lv{index}")).otherwise(col(name))
            taken[f"__keep{index}"] = F.col(f"__keep{index}") & ~take
        fetched = fetched.withColumns(taken).select(*map(col, frame.columns))
        return frame.where(same | (F.col("__op") == "D")).unionByName(fetched)

