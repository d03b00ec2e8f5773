"""The process environment every test, harness and benchmark runs in, set up in one place.

spark-submit and airflow come with the interpreter's environment (a venv that may not be
activated), Spark binds to loopback only, and Airflow keeps its state out of the user's home.
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


def subprocess_env(**extra: str) -> dict[str, str]:
    """A copy of this process's environment (after :func:`prepare`) with ``extra`` on top."""
    prepare()
    return {**os.environ, **extra}
