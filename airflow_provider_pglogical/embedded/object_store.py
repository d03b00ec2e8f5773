"""A real S3 server on loopback (moto's server mode), for the demo's ``--lakehouse s3`` and the tests.

The server speaks S3's HTTP protocol to Spark's S3A file system as a cloud store would: path-style
addressing on a free port, any access key accepted. It holds everything in memory and ends with
its process. moto comes with the package's ``test`` extra (``bash scripts/setup.sh`` installs it).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from airflow_provider_pglogical.embedded.postgres import free_port
from airflow_provider_pglogical.embedded.readiness import stop_process, wait_for_http

#: what the S3 server needs: moto's server mode (its ``server`` extra brings Flask) and boto3
REQUIRED_MODULES = ("moto", "flask", "flask_cors", "boto3")
INSTALL_HINT = ("run `bash scripts/setup.sh` (it installs the package with its test extra), or "
                "`pip install 'moto[server]>=5.1,<6'` into the environment that runs the demo")


class S3ServerUnavailable(RuntimeError):
    """moto's S3 server is not installed, or did not start."""


def require_moto() -> None:
    """Refuse early, naming the install step, when moto's server mode is not installed."""
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise S3ServerUnavailable(f"the local S3 server needs moto[server] ({', '.join(missing)} not installed): "
                                  f"{INSTALL_HINT}")


@dataclass
class S3Server:
    """A running moto S3 server: its endpoint, and the process to stop."""

    endpoint: str
    process: subprocess.Popen
    #: the server's request log (one line per request it served), when started with one
    log_path: Path | None = None

    def client(self, access_key: str = "test", secret_key: str = "test"):
        """A boto3 S3 client of this server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=access_key,
                            aws_secret_access_key=secret_key, region_name="us-east-1")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` in ``bucket``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def stop(self) -> None:
        stop_process(self.process)


def start_s3_server(env: Mapping[str, str] | None = None, timeout: float = 60,
                    log_path: Path | None = None) -> S3Server:
    """Start moto's S3 server on a free loopback port (a session of its own, so a Ctrl-C of the
    caller's terminal does not stop it first); returns once it answers.

    :param log_path: where its output goes (its web server logs every request it serves, which
        ``request_logs.py`` counts); by default nowhere.
    """
    require_moto()
    port = free_port()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if log_path else subprocess.DEVNULL
    try:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                   env=None if env is None else dict(env), stdout=log, stderr=log,
                                   start_new_session=True)
    finally:
        if log_path:
            os.close(log)
    server = S3Server(f"http://127.0.0.1:{port}", process, log_path)

    try:
        wait_for_http(server.endpoint, process, timeout=timeout, what="moto's S3 server", exited=lambda code:
                      S3ServerUnavailable(f"moto's S3 server exited with code {code}: {INSTALL_HINT}"))
    except BaseException:
        server.stop()
        raise
    return server
