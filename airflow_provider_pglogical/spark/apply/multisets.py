"""Applying steps to a keyless table, kept as a multiset the way PostgreSQL's subscriber keeps it."""

from __future__ import annotations

import logging
from functools import reduce

from airflow_provider_pglogical.spark.common.identifiers import col, quote, sql_string, temporary_view_name
from airflow_provider_pglogical.spark.row_delta.multiset_row_deltas import MultisetRowDeltas
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.plan import Step, range_predicate
from airflow_provider_pglogical.spark.apply.reduction import after_truncate, from_position_on, last_truncate
from airflow_provider_pglogical.spark.apply.steps import StepApplier
from airflow_provider_pglogical.staging.contract import MULTISET_COLUMNS, OCCURRENCE, WRITTEN_BY
from airflow_provider_pglogical.staging.seam.manifests import TableManifest

log = logging.getLogger("pglogical.apply")


class Multisets(StepApplier):
    """Applies steps to a keyless table, kept as PostgreSQL's own subscriber keeps it: a multiset.

    An INSERT adds one row even when identical ones exist; a DELETE, or an UPDATE's old row,
    removes exactly one identical row; NULLs compare equal. The n identical copies of a row value
    are numbered 1..n in ``_pglogical_occurrence``, so (values, occurrence) is a key. A change
    batch reduces to the net change of the number of copies per row value and one MERGE adds
    copies count+1..count+d or deletes the copies above count+d.

    Exactly once: the MERGE also writes the batch's name into ``_pglogical_batch`` of the copies
    it inserts, or of the highest copy it keeps, so a re-run after the data commit and before
    the state commit finds the row values the batch has changed already and skips them; a row
    value the batch removed entirely cannot go below zero copies.

    :param row_deltas: the small change batches ``paths/choice.py`` sends to a row delta are applied
        as Iceberg row deltas the driver commits (``multiset_row_deltas.py``), the same copies written
        and deleted, instead of a MERGE.
    """

    def __init__(self, spark, staging, lakehouse, row_deltas: bool = True) -> None:
        super().__init__(spark, staging, lakehouse)
        self.row_deltas = MultisetRowDeltas(spark, staging, lakehouse) if row_deltas else None

    def snapshot(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        manifest = step.batch.manifest.tables[source]
        predicate = range_predicate(step.batch.manifest.snapshot_scope(source), step.batch.name, source)
        if predicate is not None:
            return self._ranged_snapshot(step, source, target, types, predicate)
        values = _value_types(types)
        frame = self.read(step, source, values, changes=False)
        copies = Window.partitionBy(*[col(c) for c in values]).orderBy(F.lit(1))
        numbered = frame.select(
            *[col(c) for c in values], F.row_number().over(copies).cast("int").alias(OCCURRENCE),
            F.lit(step.batch.name).alias(WRITTEN_BY))
        self.replace_all(numbered, target)
        return manifest.rows

    def _ranged_snapshot(self, step: Step, source: str, target: str, types: dict[str, str], predicate: str) -> int:
        """Replace the copies in the range with the snapshot's, plus the range's changes from the
        snapshot to where the rest of the table is (``step.window``, ``plan.py``), in one MERGE.

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
        values = _value_types(types)
        in_range = F.coalesce(F.expr(predicate), F.lit(False))
        signed = []
        for batch in step.window:
            manifest = batch.manifest.tables[source]
            if not manifest.files:
                continue
            self._check_identity(batch, source, manifest)
            rows = self.read_batch(batch, source, {c.name: types[c.name] for c in manifest.columns}, changes=True)
            rows = from_position_on(rows, step.position).where(
                F.col("__lsn") < F.lit(step.through).cast("decimal(20,0)"))
            signed.append(signed_copies(rows, values, list(manifest.key), keep=("__op", "__lsn", "__seq")))
        snapshot = self.read(step, source, values, changes=False).select(*[col(c) for c in values], F.lit(1).alias("__d"))
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
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {view} s "
            f"ON {join} AND t.{quote(OCCURRENCE)} = s.__occ "
            f"WHEN MATCHED THEN UPDATE SET {quote(WRITTEN_BY)} = {written_by} "
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(map(quote, [*values, OCCURRENCE, WRITTEN_BY]))}) "
            f"VALUES ({', '.join('s.' + quote(c) for c in values)}, s.__occ, {written_by}) "
            f"WHEN NOT MATCHED BY SOURCE AND {predicate} THEN DELETE"
        )
        self.spark.catalog.dropTempView(view)
        return step.batch.manifest.tables[source].rows

    @staticmethod
    def _check_identity(batch, source: str, manifest: TableManifest) -> None:
        keys = list(manifest.key)
        if sorted(keys) != sorted(c.name for c in manifest.columns):
            raise ApplyError(
                f"batch {batch.name}, table {source}: the lakehouse keeps this table as a keyless multiset "
                f"but the batch's replica identity is {keys}, not every column; restore REPLICA IDENTITY FULL, "
                "or drop the Iceberg table and backfill it"
            )

    def changes(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import functions as F

        manifest = step.batch.manifest.tables[source]
        self._check_identity(step.batch, source, manifest)
        batch_columns = [c.name for c in manifest.columns]
        keys = list(manifest.key)
        if not manifest.files:
            return 0
        values = _value_types(types)
        rows = self.read(step, source, {c: types[c] for c in batch_columns}, changes=True)
        known = manifest.facts_decide(step.position)
        deltas, truncated, count = multiset_deltas(rows, values, keys, step.position,
                                                   known_rows=known.rows if known else None)
        if count == 0:
            return 0
        if truncated:
            copies = deltas.where(F.col("__d") > 0).select(
                *[col(c) for c in values],
                F.explode(F.sequence(F.lit(1), F.col("__d").cast("int"))).alias(OCCURRENCE))
            self.replace_all(copies.withColumn(WRITTEN_BY, F.lit(step.batch.name)).select(*[col(c) for c in types]),
                             target)
            return count
        self._merge(deltas, target, list(values), step.batch.name)
        return count

    def _merge(self, deltas, target: str, values: list[str], batch: str) -> None:
        """Set each touched row value's number of copies to (copies now) + (its change)."""
        from pyspark.sql import functions as F

        touched = deltas.where(F.col("__d") != 0).select(
            *[col(c).alias(f"__v{i}") for i, c in enumerate(values)], "__d")
        lake = self.spark.table(self.lakehouse.name(target)).select(
            *[col(c) for c in values], col(OCCURRENCE).alias("__occ"),
            col(WRITTEN_BY).alias("__by"))
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
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {view} s "
            f"ON {join} AND t.{quote(OCCURRENCE)} = s.__occ "
            "WHEN MATCHED AND s.__a = 'D' THEN DELETE "
            f"WHEN MATCHED AND s.__a = 'M' THEN UPDATE SET {quote(WRITTEN_BY)} = {written_by} "
            f"WHEN NOT MATCHED AND s.__a = 'I' THEN INSERT ({', '.join(map(quote, [*values, OCCURRENCE, WRITTEN_BY]))}) "
            f"VALUES ({', '.join('s.' + quote(c) for c in values)}, s.__occ, {written_by})"
        )
        self.spark.catalog.dropTempView(view)


def _value_types(types: dict[str, str]) -> dict[str, str]:
    return {name: kind for name, kind in types.items() if name not in MULTISET_COLUMNS}


def multiset_deltas(rows, values: dict[str, str], keys: list[str], from_position: int,
                    known_rows: int | None = None):
    """Per distinct row value (NULLs equal), the net change of its number of copies in a batch.

    +1 per INSERT, -1 per DELETE, an UPDATE -1 for its old row and +1 for its new one; rows before
    ``from_position`` are skipped, and only rows after the last TRUNCATE count. Returns the frame
    (value columns + ``__d``), whether the batch truncates, and the number of change rows counted.

    :param known_rows: the pull's count when its facts decide the batch (``contract.facts_decide``:
        every row counts, no TRUNCATE): no Spark job counts them.
    """
    from pyspark.sql import functions as F

    rows = from_position_on(rows, from_position)
    if known_rows is not None:
        count, truncate = known_rows, None
    else:
        facts = rows.agg(F.count(F.lit(1)).alias("rows"), last_truncate()).first()
        count, truncate = facts.rows, facts.last_truncate
    rows = after_truncate(rows, truncate)

    deltas = signed_copies(rows, values, keys).groupBy(*[col(c) for c in values]).agg(F.sum("__d").alias("__d"))
    return deltas, truncate is not None, count


def signed_copies(rows, values: dict[str, str], keys: list[str], keep: tuple[str, ...] = ()):
    """Each change row as the copies it adds (+1) and removes (-1): an INSERT adds its row, a
    DELETE removes it, an UPDATE removes its old row and adds its new one. ``keep`` names change
    columns (``__op``, ``__lsn``, ``__seq``) to carry along; with ``__op`` kept, a TRUNCATE stays
    as a row of its own (``__d`` 0) so that the rows before it can be dropped."""
    from pyspark.sql import functions as F

    def new(name):
        return (col(name) if name in keys else F.lit(None)).cast(values[name]).alias(name)

    def old(name):
        return (F.col(f"__old{keys.index(name)}") if name in keys else F.lit(None)).cast(values[name]).alias(name)

    def none(name):
        return F.lit(None).cast(values[name]).alias(name)

    kept = [F.col(name) for name in keep]
    parts = [
        rows.where(F.col("__op").isin("I", "U")).select(*[new(c) for c in values], F.lit(1).alias("__d"), *kept),
        rows.where(F.col("__op") == "D").select(*[new(c) for c in values], F.lit(-1).alias("__d"), *kept),
        rows.where(F.col("__op") == "U").select(*[old(c) for c in values], F.lit(-1).alias("__d"), *kept),
    ]
    if "__op" in keep:
        parts.append(rows.where(F.col("__op") == "T").select(*[none(c) for c in values], F.lit(0).alias("__d"), *kept))
    return reduce(lambda a, b: a.unionByName(b), parts)
