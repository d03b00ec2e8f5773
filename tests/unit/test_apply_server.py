"""The standing driver's request loop (``spark/apply_server.py``) on a real Unix socket.

Only requests that never reach Spark are sent here (none is given); the applies themselves are
tested with a real driver in tests/integration/test_standing_driver.py.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
from pathlib import Path

from airflow_provider_pglogical.spark.apply_server import PROTOCOL, listen, serve


def _ask(path: Path, request: dict) -> dict:
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(10)  # a driver stuck on an earlier client would fail the test here
        client.connect(str(path))
        client.sendall(json.dumps(request).encode() + b"\n")
        return json.loads(client.makefile().readline())


def test_a_silent_client_is_dropped_and_the_next_one_answered():
    directory = Path(tempfile.mkdtemp(prefix="srv"))  # mkdtemp makes it 0700, as listen requires
    path = directory / "d.sock"
    listener = listen(str(path))
    stopped: list[str] = []
    loop = threading.Thread(target=lambda: stopped.append(serve(None, listener, 30, 3, request_timeout=0.5)))
    loop.start()
    try:
        with socket.socket(socket.AF_UNIX) as silent:
            silent.connect(str(path))  # connects, never sends: must not hold up the next client
            answer = _ask(path, {"protocol": PROTOCOL + 1, "op": "apply"})
            assert "this driver speaks protocol" in answer["error"]
            assert silent.recv(1) == b"", "the silent client's connection is closed by the driver"
        answer = _ask(path, {"protocol": PROTOCOL, "op": "apply", "args": ["--no-such-option"]})
        assert answer["error"].startswith("bad apply arguments ['--no-such-option']")
    finally:
        loop.join(30)
        listener.close()
    assert stopped == ["3 runs served"]
