"""When a loopback server the demo or the tests started is ready, and how to stop it.

The S3 server (``object_store.py``) and the REST catalog (``rest_catalog.py``) are processes of
their own that take seconds to listen: their callers poll an HTTP address until it answers, give
up when the process exits first (its own error names why), and never wait without a deadline.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection

#: each probe's own limit (a server that accepted the connection but hangs must not hold the wait)
PROBE_TIMEOUT = 2.0


def wait_for_http(url: str, process: subprocess.Popen, *, timeout: float, what: str,
                  exited: Callable[[int], Exception], answering_codes: Collection[int] = (),
                  interval: float = 0.1) -> None:
    """Poll ``url`` until it answers: any response below 400, or an HTTP error whose code is in
    ``answering_codes`` (a catalog that wants a token answers 401). Raises ``exited(returncode)`` if
    ``process`` ends first, and ``TimeoutError`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise exited(process.returncode)
        remaining = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=max(0.1, min(PROBE_TIMEOUT, remaining))):
                return
        except urllib.error.HTTPError as refused:
            if refused.code in answering_codes:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or too slow to answer this probe
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what} to answer on {url}")
        time.sleep(interval)


def stop_process(process: subprocess.Popen, timeout: float = 20) -> None:
    """Ask ``process`` to end (SIGTERM), and kill it if it has not within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
