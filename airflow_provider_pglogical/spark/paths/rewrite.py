"""The REWRITE path (``choice.ApplyPath.REWRITE``): every row of a table replaced by rows computed
from staging alone, in one validated overwrite.

A step takes it for a full snapshot that cannot be adopted as it is (``apply/adoption.py``), and
for a change batch holding a TRUNCATE (the rows after the last TRUNCATE are the table). A keyed
table's rows are written as staged; a keyless one's identical rows are numbered 1..n
(``_pglogical_occurrence``) and carry the batch's name (``_pglogical_batch``), as its MERGE writes
them (``merge.py``). The overwrite refuses when another commit added data or deletes to the table
while it ran (``row_delta/driver_commits.validated_overwrite``), and it writes no delete file at all.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.apply.plan import Step
from airflow_provider_pglogical.spark.common.identifiers import col
from airflow_provider_pglogical.staging.contract import MULTISET_COLUMNS, OCCURRENCE, WRITTEN_BY


def replace_all(lakehouse, frame, target: str) -> None:
    """Replace every row of ``target`` with ``frame`` (computed from staging alone), in one
    overwrite that refuses when another commit added data or deletes to the table while it ran."""
    from pyspark.sql import functions as F

    from airflow_provider_pglogical.spark.row_delta.driver_commits import validated_overwrite

    snapshot = lakehouse.iceberg_table(target).currentSnapshot()
    validated_overwrite(lakehouse, target, frame, F.lit(True), snapshot.snapshotId() if snapshot is not None else None)


def rewrite_keyed_snapshot(applier, step: Step, source: str, target: str, types: dict[str, str]) -> int:
    """A keyed table becomes a full snapshot's rows; returns the staged rows."""
    replace_all(applier.lakehouse, applier.read(step, source, types, changes=False), target)
    return step.batch.manifest.tables[source].rows


def rewrite_keyed_truncated(lakehouse, reduced_frame, target: str, batch_columns: list[str],
                            types: dict[str, str]) -> None:
    """A keyed table becomes the rows a change batch leaves after its last TRUNCATE (the reduced
    batch's rows that are not deletes); a column the batch does not hold (dropped) is NULL."""
    from pyspark.sql import functions as F

    kept = reduced_frame.where(F.col("__op") != "D").select(*map(col, batch_columns))
    kept = kept.withColumns({name: F.lit(None).cast(kind) for name, kind in types.items() if name not in batch_columns})
    replace_all(lakehouse, kept.select(*map(col, types)), target)


def rewrite_multiset_snapshot(applier, step: Step, source: str, target: str, values: dict[str, str]) -> int:
    """A keyless table becomes a full snapshot's rows, identical rows numbered 1..n; returns the staged rows."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    frame = applier.read(step, source, values, changes=False)
    copies = Window.partitionBy(*[col(c) for c in values]).orderBy(F.lit(1))
    numbered = frame.select(
        *[col(c) for c in values], F.row_number().over(copies).cast("int").alias(OCCURRENCE),
        F.lit(step.batch.name).alias(WRITTEN_BY))
    replace_all(applier.lakehouse, numbered, target)
    return step.batch.manifest.tables[source].rows


def rewrite_multiset_truncated(lakehouse, deltas, target: str, types: dict[str, str], batch: str) -> None:
    """A keyless table becomes the copies a change batch adds after its last TRUNCATE (``deltas``:
    per row value its net number of copies, ``__d``), numbered 1..n."""
    from pyspark.sql import functions as F

    copies = deltas.where(F.col("__d") > 0).select(
        *[col(c) for c in types if c not in MULTISET_COLUMNS],
        F.explode(F.sequence(F.lit(1), F.col("__d").cast("int"))).alias(OCCURRENCE))
    replace_all(lakehouse, copies.withColumn(WRITTEN_BY, F.lit(batch)).select(*[col(c) for c in types]), target)
