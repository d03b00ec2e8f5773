"""A class-data-sharing archive for the tests' Spark drivers: written once per checkout, then mapped
by every driver JVM the suite starts (spark-submits, in-process sessions, Airflow's Spark tasks).

The suite starts a few hundred driver JVMs, and each one reads, parses and verifies the classes of
Spark, Catalyst and Iceberg again. With a dynamic archive (HotSpot's ``-XX:ArchiveClassesAtExit``,
then ``-XX:SharedArchiveFile``; docs/operators.md, "Tuning the driver JVM") a small Iceberg job's
driver used about 40% less CPU here (9.6 s against 15.6 s of user time, 3 runs each). The JVM
checks the archive against its own build and class path at start and runs without it when they
differ, silently with ``-Xlog:cds=off``: a stale or missing archive costs speed, never a result.
The archive's name carries what it depends on (the JDK, PySpark, the Iceberg runtime), so an
upgrade writes a new one. Benchmarks do not use it: they choose their JVM options per run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: unified-logging switches that keep a mismatched or missing archive silent (a job's stdout is parsed)
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

#: what the warm-up job does: the statements a test's apply and verify run, so that their classes
#: are in the archive (table creation, inserts, a MERGE, a row-level DELETE, reads)
WARM_UP_JOB = """\
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.warm")
spark.sql("CREATE TABLE lake.warm.t (id bigint, v string, d decimal(12,2), ts timestamp) USING iceberg "
          "TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read', "
          "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read')")
spark.sql("INSERT INTO lake.warm.t VALUES (1, 'a', 1.5, current_timestamp()), (2, 'b', 2.5, current_timestamp())")
spark.createDataFrame([(1, "x"), (3, "c")], "id bigint, v string").createOrReplaceTempView("src")
spark.sql("MERGE INTO lake.warm.t t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v "
          "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)")
spark.sql("DELETE FROM lake.warm.t WHERE id = 2")
assert spark.sql("SELECT count(*) FROM lake.warm.t").collect()[0][0] == 2
spark.table("lake.warm.t").orderBy("id").collect()
spark.stop()
"""


def archive_name() -> str:
    """``driver-<digest>.jsa``: a digest of the JDK binary, PySpark's version and the Iceberg runtime."""
    import pyspark

    from airflow_provider_pglogical.lakehouse.iceberg_config import iceberg_runtime_jar

    java = shutil.which("java") or "java"
    real = os.path.realpath(java)
    jars = Path(pyspark.__file__).parent / "jars"  # reinstalled: new modification times, which the JVM checks
    stamp = (f"{real}:{os.path.getmtime(real) if os.path.exists(real) else 0}:{pyspark.__version__}:"
             f"{jars.stat().st_mtime if jars.exists() else 0}:{iceberg_runtime_jar()}:on-class-path")
    return f"driver-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.jsa"


def ensure_archive(directory: Path, base_options: str, environ: dict[str, str]) -> Path | None:
    """The archive in ``directory``, written by one warm-up spark-submit unless it is there already.

    Concurrent callers (pytest-xdist's processes) take a file lock: one writes, the others wait and
    map it. The warm-up runs with Spark's default configuration directory, as every test driver
    does: the class path it records must be the drivers'. Returns None when the warm-up could not write one: the tests then run without it.
    """
    archive = directory / archive_name()
    with open(directory / ".archive.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file() and archive.stat().st_size > 0:
            return archive
        for stale in directory.glob("driver-*.jsa"):
            stale.unlink()
        print(f"tests: writing the Spark driver's class archive {archive.name} once (a warm-up job)",
              file=sys.stderr, flush=True)
        if _warm_up(directory, archive, base_options, environ):
            return archive
        return None


def _warm_up(directory: Path, archive: Path, base_options: str, environ: dict[str, str]) -> bool:
    """Run the warm-up job with ``-XX:ArchiveClassesAtExit``; the archive is renamed into place when whole."""
    from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
    from airflow_provider_pglogical.lakehouse.lakehouse_access import local_class_path

    with tempfile.TemporaryDirectory(prefix="class-archive-") as tmp:
        job = Path(tmp) / "warm_up.py"
        job.write_text(WARM_UP_JOB)
        partial = Path(tmp) / archive.name
        command = ["spark-submit", "--master", "local[2]", "--driver-memory", "2g", "--conf", "spark.ui.enabled=false",
                   "--conf", f"spark.driver.extraJavaOptions={base_options} -XX:ArchiveClassesAtExit={partial} {QUIET}"]
        conf = local_class_path(IcebergConfig(warehouse=Path(tmp, "warehouse").as_uri()).spark_conf())  # as the operators
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        done = subprocess.run([*command, str(job)], env={k: v for k, v in environ.items() if k != "SPARK_CONF_DIR"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
        if done.returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            print("tests: the class archive's warm-up failed; the drivers start without one", file=sys.stderr)
            return False
        shutil.move(str(partial), archive)
        return True
