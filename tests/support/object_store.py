"""A real S3 server on loopback (moto's server mode), started by the tests that need object storage.

The server itself is the package's (``airflow_provider_pglogical/embedded/object_store.py``, which
the demo's ``--lakehouse s3`` starts too); here it runs in the tests' environment. One per test
session; it holds everything in memory and ends with the session.
"""

from __future__ import annotations

from pathlib import Path

from airflow_provider_pglogical.embedded.object_store import S3Server, free_port
from airflow_provider_pglogical.embedded.object_store import start_s3_server as _start_s3_server
from tests.support.environment import subprocess_env

__all__ = ["S3Server", "free_port", "start_s3_server"]


def start_s3_server(timeout: float = 60, log_path: Path | None = None) -> S3Server:
    """Start moto's S3 server on a free loopback port; returns once it answers. ``log_path``: its
    request log (``embedded/request_logs.py`` counts it)."""
    return _start_s3_server(env=subprocess_env(), timeout=timeout, log_path=log_path)
