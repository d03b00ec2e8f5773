"""The MERGE path (``choice.ApplyPath.MERGE``): one Spark ``MERGE INTO`` per step, merge-on-read
(Spark writes position deletes, or deletion vectors on format v3; never an equality delete).

A step takes it for a change batch the driver does not apply as a row delta (too large, a type
needing a cast, a partitioned or copy-on-write table, row deltas off, …: ``choice.py``), and for a
ranged backfill, which replaces only its key range. Four statements:

* a keyed table's change batch, reduced to one row per key (``apply/reduction.py``): deletes,
  updates (a value the batch left unchanged, TOAST, keeps the lakehouse's) and inserts;
* a keyed table's ranged snapshot: the range's rows replaced, the rows outside it untouched;
* a keyless table's change batch, netted per row value (``apply/reduction.py``'s
  ``multiset_deltas``): copies count+1..count+d added or the copies above count+d deleted, the
  batch's name written so a re-run after the data commit skips what it did;
* a keyless table's ranged snapshot, with the range's changes since folded in.
"""

from __future__ import annotations

from functools import reduce

from airflow_provider_pglogical.spark.apply.lakehouse_tables import BATCH_TABLE_PREFIX
from airflow_provider_pglogical.spark.apply.plan import Step
from airflow_provider_pglogical.spark.apply.reduction import (
    Reduced,
    after_truncate,
    check_multiset_identity,
    from_position_on,
    last_truncate,
    multiset_values,
    signed_copies,
)
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.common.identifiers import col, quote, sql_string, temporary_view_name
from airflow_provider_pglogical.staging.contract import OCCURRENCE, WRITTEN_BY
from airflow_provider_pglogical.staging.seam.manifests import TableManifest

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


# keyed tables ------------------------------------------------------------------------------------
def merge_key_range(applier, step: Step, source: str, target: str, types: dict[str, str], predicate: str) -> int:
    """A ranged backfill of a keyed table: the snapshot's rows MERGEd, the table's rows in the
    range (``predicate``) the snapshot does not hold deleted; returns the staged rows."""
    manifest = step.batch.manifest.tables[source]
    frame = applier.read(step, source, types, changes=False)
    view = temporary_view_name("snapshot")
    frame.createOrReplaceTempView(view)
    applier.spark.sql(
        f"MERGE INTO {applier.lakehouse.name(target)} t USING {view} s ON {join_condition(manifest)} "
        f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{quote(c)} = s.{quote(c)}' for c in types)} "
        f"WHEN NOT MATCHED THEN INSERT ({', '.join(map(quote, types))}) VALUES ({', '.join('s.' + quote(c) for c in types)}) "
        f"WHEN NOT MATCHED BY SOURCE AND {predicate} THEN DELETE"
    )
    applier.spark.catalog.dropTempView(view)
    return manifest.rows


def merge_keyed_changes(applier, reduced: Reduced, manifest: TableManifest, target: str, values: list[str]) -> None:
    """One MERGE of a keyed table's reduced change batch (no TRUNCATE in it)."""
    keys = list(manifest.key)
    batch_columns = [c.name for c in manifest.columns]
    frame = reduced.frame
    keep = reduced.unchanged_columns
    if keep and reduced.moved_unchanged:
        frame = fetch_moved(applier.spark, applier.lakehouse, frame, target, keys, values)
    source, staged = _merge_source(applier.lakehouse, frame, target, keys, reduced.rows)
    sets = []
    for index, name in enumerate(values):
        if name in keep:
            sets.append(f"{quote(name)} = CASE WHEN s.__keep{index} THEN t.{quote(name)} ELSE s.{quote(name)} END")
        else:
            sets.append(f"{quote(name)} = s.{quote(name)}")
    matched_update = f"WHEN MATCHED THEN UPDATE SET {', '.join(sets)} " if sets else ""
    applier.spark.sql(
        f"MERGE INTO {applier.lakehouse.name(target)} t USING {source} s ON {join_condition(manifest)} "
        "WHEN MATCHED AND s.__op = 'D' THEN DELETE "
        f"{matched_update}"
        f"WHEN NOT MATCHED AND s.__op <> 'D' THEN INSERT ({', '.join(map(quote, batch_columns))}) "
        f"VALUES ({', '.join('s.' + quote(c) for c in batch_columns)})"
    )
    if staged:
        applier.spark.sql(f"DROP TABLE IF EXISTS {source} PURGE")
    else:
        applier.spark.catalog.dropTempView(source)


def _merge_source(lakehouse, frame, target: str, keys: list[str], batch_rows: int) -> tuple[str, bool]:
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

    if not (lakehouse.bucket_count and keys and lakehouse.bucketed(target, keys[0])):
        view = temporary_view_name("changes")
        size = lakehouse.size(target)
        if prunes(size.rows, batch_rows, size.bytes):
            frame = pruning_source(frame)
        frame.createOrReplaceTempView(view)
        return view, False
    staged = lakehouse.name(f"{BATCH_TABLE_PREFIX}{target}__{uuid.uuid4().hex[:12]}")
    (frame.writeTo(staged).using("iceberg").tableProperty("format-version", "2")
     .partitionedBy(F.bucket(int(lakehouse.bucket_count), col(keys[0]))).create())
    return staged, True


def fetch_moved(spark, lakehouse, frame, target, keys, values):
    """Moved rows (``__ok`` != key) take kept values from the lakehouse row of their old key."""
    from pyspark.sql import functions as F

    same = reduce(lambda a, b: a & b, [col(k).eqNullSafe(F.col(f"__ok{i}")) for i, k in enumerate(keys)])
    moved = frame.where(~same & (F.col("__op") != "D"))
    lake = spark.table(lakehouse.name(target)).select(
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


# keyless tables (multisets) ----------------------------------------------------------------------
def merge_multiset_range(applier, step: Step, source: str, target: str, types: dict[str, str], predicate: str) -> int:
    """Replace the copies in the range with the snapshot's, plus the range's changes from the
    snapshot to where the rest of the table is (``step.window``, ``apply/plan.py``), in one MERGE.

    Re-applying those changes afterwards, as a keyed table does, would count the rows outside
    the range twice. The result is computed from staged files only, so a re-run after a crash
    writes the same rows. Identical rows are all in the range or all out of it.
    """
    from pyspark.sql import functions as F

    if step.window is None or step.through is None:
        raise ApplyError(
            f"batch {step.batch.name}, table {source}: the lakehouse keeps this table as a keyless multiset "
            "but the backfill copied it with a key; restore REPLICA IDENTITY FULL, or drop the Iceberg "
            "table and backfill it whole"
        )
    values = multiset_values(types)
    in_range = F.coalesce(F.expr(predicate), F.lit(False))
    signed = []
    for batch in step.window:
        manifest = batch.manifest.tables[source]
        if not manifest.files:
            continue
        check_multiset_identity(batch.name, source, manifest)
        rows = applier.read_batch(batch, source, {c.name: types[c.name] for c in manifest.columns}, changes=True)
        rows = from_position_on(rows, step.position).where(
            F.col("__lsn") < F.lit(step.through).cast("decimal(20,0)"))
        signed.append(signed_copies(rows, values, list(manifest.key), keep=("__op", "__lsn", "__seq")))
    snapshot = applier.read(step, source, values, changes=False).select(*[col(c) for c in values], F.lit(1).alias("__d"))
    if signed:
        window = reduce(lambda a, b: a.unionByName(b), signed)
        truncate = window.agg(last_truncate()).first().last_truncate
        window = after_truncate(window, truncate).where(F.col("__op") != "T").select(*[col(c) for c in values], "__d")
        # a TRUNCATE in the window empties the range too: only the rows after it count
        snapshot = window.where(in_range) if truncate is not None else snapshot.unionByName(window.where(in_range))
    counts = snapshot.groupBy(*[col(c) for c in values]).agg(F.sum("__d").cast("int").alias("__n"))
    copies = counts.where("__n > 0").select(
        *[col(c) for c in values], F.explode(F.sequence(F.lit(1), F.col("__n"))).alias("__occ"))
    view = temporary_view_name("ranged")
    copies.createOrReplaceTempView(view)
    join = " AND ".join(f"t.{quote(c)} <=> s.{quote(c)}" for c in values)
    written_by = sql_string(step.batch.name)
    applier.spark.sql(
        f"MERGE INTO {applier.lakehouse.name(target)} t USING {view} s "
        f"ON {join} AND t.{quote(OCCURRENCE)} = s.__occ "
        f"WHEN MATCHED THEN UPDATE SET {quote(WRITTEN_BY)} = {written_by} "
        f"WHEN NOT MATCHED THEN INSERT ({', '.join(map(quote, [*values, OCCURRENCE, WRITTEN_BY]))}) "
        f"VALUES ({', '.join('s.' + quote(c) for c in values)}, s.__occ, {written_by}) "
        f"WHEN NOT MATCHED BY SOURCE AND {predicate} THEN DELETE"
    )
    applier.spark.catalog.dropTempView(view)
    return step.batch.manifest.tables[source].rows


def merge_multiset_changes(spark, lakehouse, deltas, target: str, values: list[str], batch: str) -> None:
    """Set each touched row value's number of copies to (copies now) + (its change, ``__d``)."""
    from pyspark.sql import functions as F

    touched = deltas.where(F.col("__d") != 0).select(
        *[col(c).alias(f"__v{i}") for i, c in enumerate(values)], "__d")
    lake = spark.table(lakehouse.name(target)).select(
        *[col(c) for c in values], col(OCCURRENCE).alias("__occ"), col(WRITTEN_BY).alias("__by"))
    same = reduce(lambda a, b: a & b, [col(c).eqNullSafe(F.col(f"__v{i}")) for i, c in enumerate(values)])
    counts = (lake.join(touched, same, "right")
              .groupBy(*[f"__v{i}" for i in range(len(values))], "__d")
              .agg(F.count("__occ").cast("int").alias("__c"),
                   F.max(F.when(F.col("__by") == F.lit(batch), 1).otherwise(0)).alias("__done"))
              .where(F.col("__done") == 0)  # this batch's MERGE committed already (a re-run)
              .withColumn("__n", F.greatest(F.lit(0), F.col("__c") + F.col("__d")).cast("int")))
    row = [F.col(f"__v{i}").alias(c) for i, c in enumerate(values)]
    inserts = counts.where("__n > __c").select(
        *row, F.explode(F.sequence(F.col("__c") + 1, F.col("__n"))).alias("__occ"), F.lit("I").alias("__a"))
    deletes = counts.where("__n < __c").select(
        *row, F.explode(F.sequence(F.col("__n") + 1, F.col("__c"))).alias("__occ"), F.lit("D").alias("__a"))
    marks = counts.where("__n < __c AND __n > 0").select(*row, F.col("__n").alias("__occ"), F.lit("M").alias("__a"))
    view = temporary_view_name("multiset")
    # materialised: the MERGE must not read the target it is rewriting through its own source
    inserts.unionByName(deletes).unionByName(marks).localCheckpoint().createOrReplaceTempView(view)
    join = " AND ".join(f"t.{quote(c)} <=> s.{quote(c)}" for c in values)
    written_by = sql_string(batch)
    spark.sql(
        f"MERGE INTO {lakehouse.name(target)} t USING {view} s "
        f"ON {join} AND t.{quote(OCCURRENCE)} = s.__occ "
        "WHEN MATCHED AND s.__a = 'D' THEN DELETE "
        f"WHEN MATCHED AND s.__a = 'M' THEN UPDATE SET {quote(WRITTEN_BY)} = {written_by} "
        f"WHEN NOT MATCHED AND s.__a = 'I' THEN INSERT ({', '.join(map(quote, [*values, OCCURRENCE, WRITTEN_BY]))}) "
        f"VALUES ({', '.join('s.' + quote(c) for c in values)}, s.__occ, {written_by})"
    )
    spark.catalog.dropTempView(view)
