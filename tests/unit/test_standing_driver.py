"""The operator's side of the standing driver: its key, its directory, and how it reads answers.

The answers come from a stand-in speaking the driver's protocol on a real Unix socket (the real
driver's behaviour is tested in tests/integration/test_standing_driver.py).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from airflow_provider_pglogical.lakehouse.standing_driver import (
    DriverError,
    StandingDriver,
    driver_key,
    private_directory,
)
from airflow_provider_pglogical.spark.apply_server import PROTOCOL


def test_the_key_follows_the_command_and_the_environment_not_their_order():
    command = ["spark-submit", "--master", "local[2]", "--conf", "a=1", "apply_server.py"]
    assert driver_key(command, {"A": "1", "B": "2"}) == driver_key(list(command), {"B": "2", "A": "1"})
    assert driver_key(command, {}) != driver_key([*command[:4], "a=2", command[5]], {})
    assert driver_key(command, {}) != driver_key(command, {"SPARK_LOCAL_IP": "127.0.0.1"})


def test_the_directory_is_private(tmp_path):
    made = private_directory(tmp_path / "drivers")
    assert made.stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(DriverError, match=r"shared must belong to uid \d+ with mode 0700 \(it is uid \d+, mode 755\)"):
        private_directory(shared)


def test_a_socket_path_too_long_for_unix_sockets_is_refused(tmp_path):
    driver = StandingDriver(tmp_path / ("d" * 120), "0123456789abcdef")
    with pytest.raises(DriverError, match="longer than 100 bytes; set PGLOGICAL_DRIVER_DIR"):
        driver.server_args(60, 10)


class StandIn:
    """Listens where the driver would, and answers each connection with the next script."""

    def __init__(self, path: Path, scripts: list[list[dict] | None]) -> None:
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(4)
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self._serve, args=(scripts,), daemon=True)
        self.thread.start()

    def _serve(self, scripts):
        for script in scripts:
            connection, _ = self.listener.accept()
            with connection:
                self.requests.append(json.loads(connection.makefile().readline()))
                for message in script or []:
                    connection.sendall(json.dumps(message).encode() + b"\n")
        self.listener.close()


@pytest.fixture
def driver():
    directory = private_directory(Path(tempfile.mkdtemp(prefix="drvu")))
    return StandingDriver(directory, "0123456789abcdef")


def _no_start():
    raise AssertionError("a stand-in listens: nothing should start")


def test_the_answer_and_the_log_lines_arrive(driver):
    stand_in = StandIn(driver.socket_path, [[{"accepted": 3, "pid": 42}, {"log": "pglogical.apply: step"},
                                             {"result": {"steps": []}, "driver": {"pid": 42, "run": 3}}]])
    lines: list[str] = []
    answer = driver.apply(["--pipeline", "p"], _no_start, lines.append)
    assert answer == {"result": {"steps": []}, "driver": {"pid": 42, "run": 3}}
    assert stand_in.requests == [{"protocol": PROTOCOL, "op": "apply", "args": ["--pipeline", "p"]}]
    assert "pglogical.apply: step" in lines


def test_an_apply_error_is_raised_with_its_message(driver):
    StandIn(driver.socket_path, [[{"accepted": 1, "pid": 7}, {"error": "ApplyError: table x: bad", "traceback": "tb"}]])
    lines: list[str] = []
    with pytest.raises(DriverError, match="the apply failed in standing driver 0123456789abcdef: ApplyError: table x: bad"):
        driver.apply([], _no_start, lines.append)
    assert "tb" in lines


def test_a_driver_that_ends_during_the_apply_fails_the_task(driver):
    StandIn(driver.socket_path, [[{"accepted": 1, "pid": 7}]])
    with pytest.raises(DriverError, match=r"\(pid 7\) ended during the apply; the state table decides"):
        driver.apply([], _no_start, lambda line: None)


def test_a_driver_that_closes_before_accepting_is_asked_again(driver):
    stand_in = StandIn(driver.socket_path, [None, [{"accepted": 2, "pid": 7},
                                                   {"result": {}, "driver": {"pid": 7, "run": 2}}]])
    assert driver.apply([], _no_start, lambda line: None)["driver"]["run"] == 2
    assert len(stand_in.requests) == 2


def test_twice_closed_before_accepting_gives_up(driver):
    StandIn(driver.socket_path, [None, None])
    with pytest.raises(DriverError, match="closed twice before accepting the apply"):
        driver.apply([], _no_start, lambda line: None)


def _stand_in_process(script: str):
    """A driver that never listens: ``script`` runs in a session of its own, as the real one."""
    return lambda: subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)


def test_a_driver_whose_output_ends_before_it_exits_is_reported_as_exited(driver):
    # its stdout reaches its end while the process still runs (the kernel reaps it later): the
    # exit code is awaited, not taken for "still starting"
    with pytest.raises(DriverError, match=r"exited before it listened \(exit code 3\); its log: .*\.log"):
        driver.apply([], _stand_in_process("exec >&-; sleep 1; exit 3"), lambda line: None, start_timeout=60)


def test_a_driver_that_never_listens_is_killed_at_the_deadline(driver):
    started = []

    def start():
        started.append(_stand_in_process("sleep 600")())
        return started[0]

    with pytest.raises(DriverError, match=r"did not listen within 0.5 s"):
        driver.apply([], start, lambda line: None, start_timeout=0.5)
    assert started[0].wait(timeout=10) == -signal.SIGKILL, "its session is killed"
