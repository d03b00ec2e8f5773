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

from airflow_provider_pglogical.lakehouse.iceberg_config import (
    IcebergConfig, iceberg_aws_jars, iceberg_runtime_jar, postgresql_jdbc_jar, s3a_jars,
)
from airflow_provider_pglogical.lakehouse.lakehouse_access import LakehouseAccess, local_class_path
from airflow_provider_pglogical.spark.launch import job_bundle
from tests.support.environment import driver_java_options, subprocess_env




def submit_command(job: Path, args: list[str], iceberg: IcebergConfig | None = None, *, master: str = "local[2]",
                   driver_memory: str = "2g", conf: dict[str, str] | None = None,
                   properties_file: str | None = None) -> list[str]:
    """The spark-submit command line of ``job`` with ``args``, with :func:`driver_java_conf` unless
    ``conf`` sets the driver's options itself.

    :param properties_file: the private properties file of a lakehouse's credentials
        (``lakehouse_access.private_properties``), as the operators pass it: never a ``--conf``.
    """
    command = ["spark-submit", "--master", master, "--driver-memory", driver_memory, "--conf", "spark.ui.enabled=false"]
    given = {**driver_java_conf(), **(iceberg.spark_conf() if iceberg else {}), **(conf or {})}
    for key, value in (local_class_path(given) if master.startswith("local") else given).items():  # as the operators
        command += ["--conf", f"{key}={value}"]
    if properties_file:
        command += ["--properties-file", properties_file]
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


def apply_args(staging_root: str, pipeline: str, **options) -> list[str]:
    """The apply job's command line, as the operator writes it: one ``ApplyOptions`` as JSON."""
    from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions

    return ["--options", ApplyOptions(str(staging_root), pipeline, **options).to_json()]


def submit_apply(root: Path, warehouse: Path, *, pipeline: str = "p", namespace: str = "toast") -> None:
    """spark-submit the apply job of ``pipeline`` staged under ``root`` into ``warehouse``, as the
    operator does, and fail the test with its log's end unless it succeeded."""
    from airflow_provider_pglogical.spark.launch import APPLY_JOB

    command = submit_command(APPLY_JOB, apply_args(root.as_uri(), pipeline, namespace=namespace),
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


def session_jars() -> str:
    """``spark.jars`` of every in-process test session: the Iceberg runtime, S3A with its AWS SDK,
    Iceberg's AWS bundle (S3FileIO, Glue) and the PostgreSQL JDBC driver, whatever the session's lakehouse.

    A JVM's classpath is fixed by the first session of the process: a pytest worker keeps its JVM
    from test to test, so a session on S3 with a JDBC catalog (the reliability harness's) finds
    their classes only if the worker's first session, whichever test started it, brought them.
    Measured: no difference in session start or a first Iceberg write (docs/reliability.md).
    """
    return ",".join([iceberg_runtime_jar(), *s3a_jars(), *iceberg_aws_jars(), postgresql_jdbc_jar()])


def _lakehouse_conf(warehouse: Path | None, access: LakehouseAccess | None, extra: dict[str, str] | None = None) -> dict:
    """The lakehouse's public Spark properties (a Hadoop catalog on ``warehouse`` unless ``access``
    is given), with :func:`session_jars`."""
    conf = dict(access.public) if access is not None else IcebergConfig(warehouse=Path(warehouse).as_uri()).spark_conf()
    return local_class_path({**conf, **(extra or {}), "spark.jars": session_jars()})


def set_private(session, private: dict[str, str]) -> None:
    """Give a started session the lakehouse's credentials (``LakehouseAccess.private``) at run time,
    so they never reach the command line of the JVM the session may have launched. Hadoop
    properties go into the context's Hadoop configuration (S3A reads them at its first use), the
    catalog's into the SQL conf (Iceberg reads them when the catalog is first loaded)."""
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in private.items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key[len("spark.hadoop."):], value)
        else:
            session.conf.set(key, value)


def applying_session(warehouse: Path | None, app_name: str, access: LakehouseAccess | None = None):
    """An in-process Spark session (``local[2]``) that applies to the Iceberg warehouse as the apply
    job's own session does (UTC, case-sensitive names, the job's tuning) and reads it back. Stop it
    when done.

    :param access: the lakehouse's Spark properties (``lakehouse_access.job_access``) instead of a
        Hadoop catalog on ``warehouse``: an S3 warehouse with a JDBC catalog, its secrets set by
        :func:`set_private`.
    """
    import logging
    import os

    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.spark.common.session import tune_session

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # py4j logs each connection it closes at INFO, also from __del__ while the interpreter is busy
    # elsewhere (an import being compiled): keep it quiet, as reading_session does
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {**_lakehouse_conf(warehouse, access), "spark.ui.enabled": "false",
                       "spark.sql.session.timeZone": "UTC", "spark.sql.caseSensitive": "true",
                       **driver_java_conf()}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    set_private(session, access.private if access is not None else {})
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
    conf = _lakehouse_conf(warehouse, None, {"spark.sql.catalog.lake.cache-enabled": "false"})
    for key, value in {**conf, "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
                       "spark.sql.shuffle.partitions": "2", **driver_java_conf(), **(extra or {})}.items():
        builder = builder.config(key, value)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return builder.getOrCreate()
