"""spark-submit of the provider's Spark jobs as the operators submit them, and reading their results.

Tests, the reliability harness and the benchmarks that submit a job themselves (to kill it, time
it or read its log) build the command here: the same master, memory, Iceberg properties and
``--py-files`` bundle as ``IcebergApplyOperator``, so they test what a DAG runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.spark.launch import job_bundle
from tests.support.environment import driver_java_options, subprocess_env




def submit_command(job: Path, args: list[str], iceberg: IcebergConfig | None = None, *, master: str = "local[2]",
                   driver_memory: str = "2g", conf: dict[str, str] | None = None) -> list[str]:
    """The spark-submit command line of ``job`` with ``args``, with :func:`driver_java_conf` unless
    ``conf`` sets the driver's options itself."""
    command = ["spark-submit", "--master", master, "--driver-memory", driver_memory, "--conf", "spark.ui.enabled=false"]
    for key, value in {**driver_java_conf(), **(iceberg.spark_conf() if iceberg else {}), **(conf or {})}.items():
        command += ["--conf", f"{key}={value}"]
    return command + ["--py-files", str(job_bundle()), str(job), *args]


def driver_java_conf() -> dict[str, str]:
    """The tests' driver JVM options (``environment.driver_java_options``: C1 only and the class
    archive, as a deployment tuned for small ticks sets them; operators set none) as Spark conf."""
    return {"spark.driver.extraJavaOptions": driver_java_options()}


def run_job(command: list[str], *, env: dict[str, str] | None = None, timeout: float = 900,
            with_stderr: bool = True) -> tuple[int, str]:
    """Run a spark-submit command to its end; returns its exit code and its output.

    :param with_stderr: merge the JVM's log into the output. Leave it out when a result line may
        be longer than a pipe's atomic write (4 kB): the log could land inside it.
    """
    proc = subprocess.run(command, env=subprocess_env(**(env or {})), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if with_stderr else subprocess.DEVNULL, text=True, timeout=timeout)
    return proc.returncode, proc.stdout


def submit_apply(root: Path, warehouse: Path, *, pipeline: str = "p", namespace: str = "toast") -> None:
    """spark-submit the apply job of ``pipeline`` staged under ``root`` into ``warehouse``, as the
    operator does, and fail the test with its log's end unless it succeeded."""
    from airflow_provider_pglogical.spark.launch import APPLY_JOB

    command = submit_command(APPLY_JOB, ["--staging-root", root.as_uri(), "--pipeline", pipeline,
                                         "--namespace", namespace],
                             IcebergConfig(warehouse=warehouse.as_uri(), namespace=namespace))
    code, output = run_job(command)
    assert code == 0, output[-5000:]


def start_job(command: list[str], *, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a spark-submit command in a process group of its own (see ``processes.kill_tree``)."""
    return subprocess.Popen(command, env=subprocess_env(**(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def job_result(output: str, prefix: str) -> dict:
    """The JSON a job printed after ``prefix``; an AssertionError with the log's tail when there is none."""
    for line in output.splitlines():
        if prefix in line:
            return json.loads(line.split(prefix, 1)[1])
    raise AssertionError(f"the job printed no {prefix.strip()} line:\n{output[-5000:]}")


def bare_spark_submit_seconds(directory: Path, master: str = "local[2]") -> float:
    """Wall time of spark-submit of an empty PySpark job: the least any Spark apply can cost."""
    job = directory / "empty_job.py"
    job.write_text("from pyspark.sql import SparkSession\nSparkSession.builder.getOrCreate().stop()\n")
    started = time.perf_counter()
    subprocess.run(["spark-submit", "--master", master, "--conf", "spark.ui.enabled=false", str(job)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=subprocess_env())
    return time.perf_counter() - started


def applying_session(warehouse: Path, app_name: str):
    """An in-process Spark session (``local[2]``) that applies to the Iceberg warehouse as the apply
    job's own session does (UTC, case-sensitive names, the job's tuning) and reads it back. Stop it
    when done."""
    import logging
    import os

    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.spark.common.session import tune_session

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # py4j logs each connection it closes at INFO, also from __del__ while the interpreter is busy
    # elsewhere (an import being compiled): keep it quiet, as reading_session does
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {**IcebergConfig(warehouse=warehouse.as_uri()).spark_conf(), "spark.ui.enabled": "false",
                       "spark.sql.session.timeZone": "UTC", "spark.sql.caseSensitive": "true",
                       **driver_java_conf()}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    tune_session(session)
    return session


def reading_session(warehouse: Path, app_name: str, extra: dict[str, str] | None = None):
    """An in-process Spark session (``local[1]``) that reads the Iceberg warehouse a test's jobs
    write, with the catalog's cache off so it sees every commit, and the driver options of
    ``submit_command``. Stop it when done."""
    import logging
    import os

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName(app_name)
    conf = IcebergConfig(warehouse=warehouse.as_uri(), extra_conf={"spark.sql.catalog.lake.cache-enabled": "false"})
    for key, value in {**conf.spark_conf(), "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
                       "spark.sql.shuffle.partitions": "2", **driver_java_conf(), **(extra or {})}.items():
        builder = builder.config(key, value)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return builder.getOrCreate()
