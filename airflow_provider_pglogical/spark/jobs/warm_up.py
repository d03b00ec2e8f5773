"""A waiting apply window warms its JVM up on throwaway tables, so a snapshot's round runs hot code.

A window that has nothing to apply after its first round (``--until-loaded`` waiting for the
initial sync, or any window before a backfill or an added table) holds a JVM that has never read
a staged file's footer, adopted a file or replaced a state-table partition. The first time each
of those runs, it costs 0.1-0.2 s of class loading and interpreted code, and that time lands after
the copy, on the load's critical path: the round that applied a 3M-row initial load took 0.68 s
cold and 0.39 s warm (docs/benchmarks.md, "into a running window").

So once per window, while it waits, :func:`warm_up` runs the same code on two tables of a
Hadoop catalog in a temporary directory: a tiny staged-like file adopted by ``Adoption.adopt``, a
state-like partition replaced by ``DriverCommits.replace_partition``. Both tables are of the
format version the apply creates its tables in (``IcebergConfig(format_version)``: v3 adds row
lineage's first row ids to every commit, other code than v2's). The lakehouse, the staging area
and the state table are not touched, and the directory is removed. A failure only warns.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

from airflow_provider_pglogical.spark.apply.format_versions import DEFAULT_FORMAT_VERSION
from airflow_provider_pglogical.spark.common.java_classes import java_class

log = logging.getLogger("pglogical.apply")


def warm_up(spark, format_version: int = DEFAULT_FORMAT_VERSION) -> float | None:
    """Run an adoption and a partition replacement on throwaway tables of ``format_version`` (the
    lakehouse's); returns the seconds it took, or None when it failed (logged; nothing of the job
    depends on it)."""
    started = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="pglogical-warm-up-"))
    try:
        _adopt_and_replace(spark, directory, format_version)
    except Exception as error:  # noqa: BLE001 - an optimisation only: the round ahead runs cold
        log.warning("could not warm the driver up for the next snapshot (it runs cold): %s", error)
        return None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    seconds = round(time.monotonic() - started, 3)
    log.info("warmed the driver up for a snapshot's round in %.2fs", seconds)
    return seconds


def _adopt_and_replace(spark, directory: Path, format_version: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_provider_pglogical.spark.apply.adoption import Adoption
    from airflow_provider_pglogical.spark.row_delta.driver_commits import DriverCommits

    # the shape of a snapshot's file: field ids, zstd, no dictionary, bounds (staging/batches.py's
    # with_field_ids and PARQUET_OPTIONS; that module and its imports are not in the job's bundle)
    schema = pa.schema([pa.field("pipeline", pa.string(), metadata={b"PARQUET:field_id": b"1"}),
                        pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"2"})])
    rows = pa.table({"pipeline": pa.array(["warm-up"]), "id": pa.array([1], pa.int64())}, schema=schema)
    staged = directory / "staged.parquet"
    pq.write_table(rows, staged, compression="zstd", use_dictionary=False, write_statistics=True)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    reader = java_class(spark, "org.apache.iceberg.shaded.org.apache.parquet.hadoop.ParquetFileReader").open(
        java_class(spark, "org.apache.iceberg.shaded.org.apache.parquet.hadoop.util.HadoopInputFile").fromPath(
            java_class(spark, "org.apache.hadoop.fs.Path")(staged.as_uri()), conf))
    try:
        schema = java_class(spark, "org.apache.iceberg.parquet.ParquetSchemaUtil").convert(
            reader.getFooter().getFileMetaData().getSchema())
    finally:
        reader.close()
    tables = java_class(spark, "org.apache.iceberg.hadoop.HadoopTables")(conf)
    spec = java_class(spark, "org.apache.iceberg.PartitionSpec")
    properties = java_class(spark, "java.util.HashMap")()
    properties.put("format-version", str(int(format_version)))
    adopted = tables.create(schema, spec.unpartitioned(), properties, (directory / "adopted").as_uri())
    Adoption(spark, kill_points=False).adopt(adopted, [staged.as_uri()], "warm-up")
    partitioned = tables.create(schema, spec.builderFor(schema).identity("pipeline").build(), properties,
                                (directory / "partitioned").as_uri())
    DriverCommits(spark, None).replace_partition(partitioned, rows, "pipeline", "warm-up", read_at=None)
