"""The process environment every test, harness and benchmark runs in, set up in one place.

spark-submit and airflow come with the interpreter's environment (a venv that may not be
activated), Spark binds to loopback only, and Airflow keeps its state out of the user's home. Like a
deployment, the tests give every Spark driver the JVM options docs/operators.md recommends for
small ticks (the operators set none themselves): :func:`deploy_spark_defaults`.
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
    """Give every Spark driver JVM the tests start the options a deployment tuned for small ticks
    gives it (docs/operators.md, "Tuning the driver JVM"): C1 only and a class-data-sharing archive
    (``class_archive.py``, written once per checkout). They go in ``SPARK_SUBMIT_OPTS``, which
    spark-submit puts on the java command of a client-mode driver (spark-submits, in-process
    sessions and Airflow's Spark tasks alike), not in a ``spark-defaults.conf``: a directory on the
    driver's class path (``SPARK_CONF_DIR`` is) must be empty for an archive to map. Not for
    benchmarks, which choose their JVM options per run."""
    if "PGLOGICAL_TEST_CLASS_ARCHIVE" not in environ:
        from tests.support.class_archive import ensure_archive

        prepare(environ)
        directory = REPO / ".airflow-test" / "class-archive"
        directory.mkdir(parents=True, exist_ok=True)
        archive = ensure_archive(directory, C1_ONLY, dict(environ))
        environ["PGLOGICAL_TEST_CLASS_ARCHIVE"] = str(archive or "")
        environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [environ.get("SPARK_SUBMIT_OPTS"), driver_java_options(environ)]))


#: the driver JVM options docs/operators.md recommends for small ticks ("Tuning the driver JVM"):
#: C1 only, with the code cache tiered compilation has
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def driver_java_options(environ=os.environ) -> str:
    """C1 only, plus the class archive when the tests deployed one (:func:`deploy_spark_defaults`)."""
    from tests.support.class_archive import QUIET

    archive = environ.get("PGLOGICAL_TEST_CLASS_ARCHIVE")
    if archive and os.path.isfile(archive):
        return f"{C1_ONLY} -XX:SharedArchiveFile={archive} {QUIET}"
    return C1_ONLY


def subprocess_env(**extra: str) -> dict[str, str]:
    """A copy of this process's environment (after :func:`prepare`) with ``extra`` on top."""
    prepare()
    return {**os.environ, **extra}
