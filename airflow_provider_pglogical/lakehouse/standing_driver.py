"""The operator's side of the standing apply driver (``spark/apply_server.py``): find it, start it
when there is none, ask it for one apply and relay its log.

One driver per configuration: the key is a hash of the spark-submit command that starts it
(master, every Spark property, the job bundle, which is named by its code's hash, driver
options) and of the environment it gets, so a changed setting or upgraded code starts a new
driver and the old one ends when idle. Its socket, lock and log live in a directory of mode 0700.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.spark.apply_server import PROTOCOL, READY_PREFIX, not_private

#: how long a new driver may take to listen (JVM, Spark and Iceberg start-up on a busy machine)
DEFAULT_START_TIMEOUT = 300.0
_SOCKET_PATH_LIMIT = 100  # sun_path holds 108 bytes on Linux


class DriverError(PgLogicalError):
    """The standing driver could not be started or reached, or its apply failed (retried by
    Airflow; a setting that cannot work is raised as permanent)."""


def default_directory(env: dict[str, str] | None = None) -> Path:
    """``$PGLOGICAL_DRIVER_DIR``, else ``<tmp>/pglogical-drivers-<uid>`` (short: socket paths are)."""
    env = os.environ if env is None else env
    if env.get("PGLOGICAL_DRIVER_DIR"):
        return Path(env["PGLOGICAL_DRIVER_DIR"])
    return Path(tempfile.gettempdir()) / f"pglogical-drivers-{os.getuid()}"


def private_directory(path: Path) -> Path:
    """Create ``path`` with mode 0700, or check that it is this user's alone."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = not_private(str(path))
    if problem:
        raise DriverError(f"standing driver {problem}: fix it or set PGLOGICAL_DRIVER_DIR to another directory",
                          permanent=True)
    return path


def driver_key(command: list[str], env: dict[str, str]) -> str:
    """Names the driver a spark-submit command (without the server's own arguments) would start."""
    digest = hashlib.sha256(json.dumps({"command": command, "env": sorted(env.items())}).encode())
    return digest.hexdigest()[:16]


class StandingDriver:
    """Where one configuration's driver listens (``<key>.sock``), logs (``<key>.log``) and is
    started under a lock (``<key>.lock``), and how to ask it."""

    def __init__(self, directory: Path, key: str) -> None:
        self.directory, self.key = directory, key
        self.socket_path, self.log_path = directory / f"{key}.sock", directory / f"{key}.log"

    def server_args(self, idle_seconds: float, max_runs: int) -> list[str]:
        if len(str(self.socket_path)) > _SOCKET_PATH_LIMIT:
            raise DriverError(f"socket path {self.socket_path} is longer than {_SOCKET_PATH_LIMIT} bytes; "
                              "set PGLOGICAL_DRIVER_DIR to a shorter directory", permanent=True)
        return ["--socket", str(self.socket_path), "--idle-seconds", f"{idle_seconds:g}", "--max-runs", str(max_runs),
                "--log-file", str(self.log_path)]

    def apply(self, args: list[str], start: Callable[[], subprocess.Popen], log: Callable[[str], None],
              start_timeout: float = DEFAULT_START_TIMEOUT) -> dict:
        """Ask the driver to apply (``args``: apply_changes.py's); start one with ``start`` if none
        listens. Returns the driver's answer: ``result`` (the job's summary) and ``driver``."""
        for attempt in range(2):
            connection = self._connect() or self._start(start, log, start_timeout)
            with connection:
                answer = self._ask(connection, args, log)
            if answer is not None:
                return answer
            # it ended before accepting (idle at that moment, or killed): nothing started; once more
            log(f"standing driver {self.key} closed before accepting the apply (attempt {attempt + 1})")
        raise DriverError(f"standing driver {self.key} closed twice before accepting the apply; its log: {self.log_path}")

    def _connect(self) -> socket.socket | None:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(str(self.socket_path))
        except (FileNotFoundError, ConnectionRefusedError):
            connection.close()
            return None
        return connection

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.directory / f"{self.key}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # one starter at a time; the others then connect
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _start(self, start: Callable[[], subprocess.Popen], log: Callable[[str], None], timeout: float) -> socket.socket:
        with self._locked():
            connection = self._connect()
            if connection is not None:  # another task started it meanwhile
                return connection
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()  # left by a driver that was killed
            process = start()
            log(f"started standing driver {self.key} (pid {process.pid}, log {self.log_path})")
            outcome = _wait_ready(process, timeout)
            if outcome != "ready":
                exited = _exit_code(process) if outcome == "closed" else process.poll()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # its session: spark-submit's JVM and its Python
                if exited is not None:
                    why = f"exited before it listened (exit code {exited})"
                elif outcome == "closed":
                    why = "closed its output before it listened"
                else:
                    why = f"did not listen within {timeout:g} s"
                raise DriverError(f"standing driver {self.key} {why}; its log: {self.log_path}")
            connection = self._connect()
            if connection is None:
                raise DriverError(f"standing driver {self.key} said it listens but {self.socket_path} refused; "
                                  f"its log: {self.log_path}")
            return connection

    def _ask(self, connection: socket.socket, args: list[str], log: Callable[[str], None]) -> dict | None:
        """None when the driver closed before accepting; else its result (or an error raised)."""
        try:
            connection.sendall(json.dumps({"protocol": PROTOCOL, "op": "apply", "args": args}).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            return None
        accepted = None
        with connection.makefile("r", encoding="utf-8") as lines:
            try:
                for line in lines:
                    message = json.loads(line)
                    if "accepted" in message:
                        accepted = message
                        log(f"standing driver {self.key} (pid {message['pid']}) runs the apply, its run {message['accepted']}")
                    elif "log" in message:
                        log(message["log"])
                    elif "result" in message:
                        return message
                    elif "error" in message:
                        if message.get("traceback"):
                            log(message["traceback"])
                        raise DriverError(f"the apply failed in standing driver {self.key}: {message['error']}")
            except ConnectionResetError:
                pass
        if accepted is None:
            return None
        raise DriverError(f"standing driver {self.key} (pid {accepted['pid']}) ended during the apply; the state "
                          f"table decides what was applied, a retry applies the rest; its log: {self.log_path}")


def _wait_ready(process: subprocess.Popen, timeout: float) -> str:
    """Read the driver's stdout until its ready line (``"ready"``), its end (``"closed"``: it
    exits) or the deadline (``"timeout"``)."""
    deadline = time.monotonic() + timeout
    stdout = process.stdout
    assert stdout is not None
    buffered = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            readable, _, _ = select.select([stdout], [], [], left)
            if not readable:
                return "timeout"
            chunk = os.read(stdout.fileno(), 65536)
            if not chunk:
                return "closed"
            buffered += chunk
            if READY_PREFIX.encode() in buffered:
                return "ready"
    finally:
        stdout.close()


def _exit_code(process: subprocess.Popen, grace: float = 10.0) -> int | None:
    """The exit code of a process whose output ended: the end of its stdout comes before the
    kernel has reaped it, so ``poll()`` at that moment can still say it runs."""
    try:
        return process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        return None


def start_process(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """spark-submit in a session of its own (it outlives the task), stderr to its log file (the
    previous driver's log is kept as ``.log.1``: two at most)."""
    with contextlib.suppress(FileNotFoundError):
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    with open(log_path, "ab") as log_file:  # appended to: the driver's Python writes there too
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file,
                                env=env, start_new_session=True, close_fds=True)
