"""The Spark session the jobs run in: UTC, case-sensitive names, small shuffles, FAIR pools.

Shared by the apply and the maintenance jobs (no Airflow import: it ships in the job bundle).
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.common.java_classes import java_class


def session_defaults(default_parallelism: int) -> dict[str, str]:
    """Spark SQL settings for applying batches that are small next to their tables.

    * a few shuffle partitions per core, not 200;
    * storage-partitioned joins: a bucketed target MERGEs with a batch bucketed alike without
      shuffling the target (only tables created with ``--bucket-count`` are bucketed);
    * a runtime bloom filter of a batch's keys on a large target's scan (``paths/merge.pruning_source``):
      Spark injects one only into a join it expects to shuffle (no broadcast planned from size
      estimates; at run time adaptive execution still broadcasts a side that turns out small),
      over a scan it estimates at 1 MB or more, from a batch side it estimates at 1 GB or less.
    """
    return {
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.sql.adaptive.autoBroadcastJoinThreshold": "10MB",
        "spark.sql.optimizer.runtime.bloomFilter.applicationSideScanSizeThreshold": "1MB",
        "spark.sql.optimizer.runtime.bloomFilter.creationSideThreshold": "1GB",
        **small_shuffles(default_parallelism),
        "spark.sql.sources.v2.bucketing.enabled": "true",
        "spark.sql.iceberg.planning.preserve-data-grouping": "true",
        "spark.sql.sources.v2.bucketing.pushPartValues.enabled": "true",
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
    }


def small_shuffles(default_parallelism: int) -> dict[str, str]:
    """A few shuffle partitions per core, not Spark's 200: the apply's and the maintenance's
    shuffles are small (a batch; a table's file lists), and 200 tasks per shuffle cost seconds on
    a few cores (an ``expire_snapshots`` of a small table: 2-7 s against 0.4-1.4 s)."""
    return {"spark.sql.shuffle.partitions": str(max(4, 2 * default_parallelism))}


def tune_session(spark, defaults: dict[str, str] | None = None) -> None:
    """Apply ``defaults`` (:func:`session_defaults` unless given) where the submitter did not set
    its own value, and stop the driver's local file system from writing checksum files.

    Hadoop's local file system (``file:``, the embedded lakehouse) writes a ``.crc`` file beside
    every file and, without Hadoop's native library, forks ``chmod`` for each of the two: a
    commit's seven files were fourteen forks, most of a small step's CPU on two cores. Iceberg
    keeps no use for them (its manifests hold file sizes, Parquet its own checksums); a file that
    has one is still verified when read, and overwriting it removes it. Other file systems are
    untouched.
    """
    conf = spark.sparkContext.getConf()
    if defaults is None:
        defaults = session_defaults(spark.sparkContext.defaultParallelism)
    for key, value in defaults.items():
        if not conf.contains(key):
            spark.conf.set(key, value)
    file_system = java_class(spark, "org.apache.hadoop.fs.FileSystem")
    file_system.getLocal(spark.sparkContext._jsc.hadoopConfiguration()).setWriteChecksum(False)


def create_session(app_name: str, log_level: str):
    """The job's Spark session: UTC, case-sensitive names, FAIR pools unless spark-submit chose."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.caseSensitive", "true")
    )
    SparkContext._ensure_initialized()  # the JVM holds spark-submit's --conf values: read them
    if not SparkConf().contains("spark.scheduler.mode"):
        builder = builder.config("spark.scheduler.mode", "FAIR")  # tables applied at once share fairly
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    tune_session(spark)
    return spark


def activate_in_thread(spark) -> None:
    """Make ``spark`` the active session of this Python thread's JVM thread.

    PySpark runs each Python thread's calls on a JVM thread of its own, where no session is active:
    a direct Java call that reads the SQL conf there (Iceberg's ``Spark3Util.loadIcebergTable``
    resolving a catalog this session has not loaded yet) gets Spark's fallback conf, without the
    lakehouse's catalog. ``spark.sql`` sets the session itself; such calls need this first."""
    spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
