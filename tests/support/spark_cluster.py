"""A Spark standalone cluster on loopback (a master and N workers), started with pyspark's own
``sbin/spark-daemon.sh`` and stopped by the caller, for tests and benchmarks that submit to a cluster."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from airflow_provider_pglogical.embedded.postgres import wait_until
from tests.support.airflow_server import free_port

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@contextlib.contextmanager
def standalone_cluster(directory: Path, *, workers: int = 1, cores: int = 2,
                       memory: str = "2g") -> Iterator[tuple[int, dict[str, str]]]:
    """Start a master and ``workers`` workers of ``cores`` cores each (logs, pids and work under
    ``directory``); yields the master's port and the daemons' environment; stops them all."""
    port, ui_port = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_HOME": str(spark_home()),
           "SPARK_MASTER_HOST": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(directory / "logs"), "SPARK_PID_DIR": str(directory / "pids"),
           "SPARK_IDENT_STRING": f"pglogical-test-{port}", "SPARK_WORKER_DIR": str(directory / "work")}
    daemon = str(spark_home() / "sbin" / "spark-daemon.sh")
    master_url = f"spark://127.0.0.1:{port}"
    subprocess.run([daemon, "start", MASTER, "1", "--host", "127.0.0.1", "--port", str(port),
                    "--webui-port", str(ui_port)], env=env, check=True)
    started = 0
    try:
        for instance in range(1, workers + 1):
            subprocess.run([daemon, "start", WORKER, str(instance), "--host", "127.0.0.1",
                            "--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory, master_url],
                           env=env, check=True)
            started = instance
        # spark-daemon.sh returns before a worker has registered: a job submitted now would wait
        wait_until(lambda: alive_workers(ui_port) == workers, timeout=300,
                   message=f"{workers} Spark worker(s) to register with the master")
        yield port, env
    finally:
        for instance in range(1, started + 1):
            subprocess.run([daemon, "stop", WORKER, str(instance)], env=env, check=False)
        subprocess.run([daemon, "stop", MASTER, "1"], env=env, check=False)


def alive_workers(ui_port: int) -> int:
    """How many workers the master's web UI lists as alive (0 while it is not answering yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (urllib.error.URLError, OSError, ValueError):
        return 0
