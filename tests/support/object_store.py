"""A real S3 server on loopback (moto's server mode), started by the tests that need object storage.

The server speaks S3's HTTP protocol to Spark's S3A file system as a cloud store would: path-style
addressing on a free port, any access key accepted. One per test session; it holds everything in
memory and ends with the session.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass

from airflow_provider_pglogical.embedded.postgres import wait_until
from tests.support.environment import subprocess_env


@dataclass
class S3Server:
    """A running moto S3 server: its endpoint, and the process to stop."""

    endpoint: str
    process: subprocess.Popen

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
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_s3_server(timeout: float = 60) -> S3Server:
    """Start moto's S3 server on a free loopback port; returns once it answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", process)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"moto's S3 server exited with code {process.returncode}: is moto[server] installed?")
        try:
            with urllib.request.urlopen(server.endpoint, timeout=2):
                return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    try:
        wait_until(answers, timeout=timeout, message=f"moto's S3 server to answer on {server.endpoint}")
    except BaseException:
        server.stop()
        raise
    return server
