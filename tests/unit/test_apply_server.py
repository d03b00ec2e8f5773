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

from airflow_provider_pglogical.spark import apply_server
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


class _HeldApply:
    """Stands in for the job's own ``run_with_args`` (no Spark here): it runs until released."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, spark, args):
        self.started.set()
        assert self.release.wait(30), "the test never released the apply"
        return {"pipeline": args.pipeline, "steps": []}


def _serve_one(monkeypatch, path: Path, on_client_left) -> tuple[_HeldApply, threading.Thread]:
    held = _HeldApply()
    monkeypatch.setattr(apply_server.apply_changes, "run_with_args", held)
    listener = listen(str(path))
    loop = threading.Thread(target=lambda: (serve(None, listener, 30, 1, on_client_left=on_client_left),
                                            listener.close()))
    loop.start()
    return held, loop


APPLY = {"protocol": PROTOCOL, "op": "apply", "args": ["--staging-root", "file:///s", "--pipeline", "p", "--namespace", "n"]}


def test_a_client_that_leaves_during_its_apply_ends_the_driver(monkeypatch):
    path = Path(tempfile.mkdtemp(prefix="srv")) / "d.sock"
    left = threading.Event()
    held, loop = _serve_one(monkeypatch, path, left.set)
    with socket.socket(socket.AF_UNIX) as client:  # a task killed once its apply started
        client.connect(str(path))
        client.sendall(json.dumps(APPLY).encode() + b"\n")
        assert "accepted" in json.loads(client.makefile().readline())
        assert held.started.wait(30)
    assert left.wait(30), "the driver must be told while the apply still runs"
    held.release.set()
    loop.join(30)


def test_a_client_that_stays_gets_its_answer_and_the_driver_stays(monkeypatch):
    path = Path(tempfile.mkdtemp(prefix="srv")) / "d.sock"
    left = threading.Event()
    held, loop = _serve_one(monkeypatch, path, left.set)
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(30)
        client.connect(str(path))
        client.sendall(json.dumps(APPLY).encode() + b"\n")
        lines = client.makefile()
        assert "accepted" in json.loads(lines.readline())
        held.release.set()
        assert json.loads(lines.readline())["result"] == {"pipeline": "p", "steps": []}
    loop.join(30)
    assert not loop.is_alive() and not left.is_set(), "a client closing after its answer changes nothing"
