"""The process environment every test, harness and benchmark runs in, set up in one place.

spark-submit and airflow come with the interpreter's environment (a venv that may not be
activated), Spark binds to loopback only, and Airflow keeps its state out of the user's home. Like a
deployment, the tests give every Spark driver the JVM options docs/operators.md recommends for
small ticks, in a ``spark-defaults.conf`` of their own (the operators set none themselves).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def prepare(environ=os.environ) -> None:
    """Put the interpreter's bin first on PATH and default Spark and Airflow to test settings."""
    environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), environ.get("PATH", "")])
    environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow-test"))
    environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


def deploy_spark_defaults(environ=os.environ) -> None:
    """Point Spark at the tests' ``spark-defaults.conf`` (not for benchmarks, which choose their
    JVM options per run)."""
    environ.setdefault("SPARK_CONF_DIR", str(spark_conf_dir()))


#: what a deployment's spark-defaults.conf holds for small ticks (docs/operators.md, "Tuning the driver JVM")
SPARK_DEFAULTS = "spark.driver.extraJavaOptions -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m\n"


def spark_conf_dir() -> Path:
    """The tests' Spark configuration directory, written once per checkout."""
    directory = REPO / ".airflow-test" / "spark-conf"
    defaults = directory / "spark-defaults.conf"
    if not defaults.is_file() or defaults.read_text() != SPARK_DEFAULTS:
        directory.mkdir(parents=True, exist_ok=True)
        defaults.write_text(SPARK_DEFAULTS)
    return directory


def subprocess_env(**extra: str) -> dict[str, str]:
    """A copy of this process's environment (after :func:`prepare`) with ``extra`` on top."""
    prepare()
    return {**os.environ, **extra}
