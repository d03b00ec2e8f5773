"""A standing apply driver: one Spark session that applies pipelines on request, tick after tick.

    spark-submit --py-files pglogical_job.zip apply_server.py --socket /run/x/driver.sock \\
        [--idle-seconds 900] [--max-runs 1000] [--log-level WARN] [--log-file /run/x/driver.log]

A spark-submit per tick pays a JVM start and the first Iceberg queries of a cold JVM every time
(docs/benchmarks.md: most of a small tick). This program is the same apply job in a session
that outlives the tick: it listens on a Unix socket (in a directory only its user can open) and
runs ``apply_changes.run`` for each request, one request at a time, so two applies never overlap.
Nothing about exactly-once changes: every run reads the state table and commits it as a
spark-submit run does, so a driver killed in the middle leaves what a killed spark-submit leaves.

It ends by itself after ``--idle-seconds`` without a request, and after ``--max-runs`` runs (so
the JVM's heap and Spark's bookkeeping start afresh now and then); the operator starts a new
one when it finds none (``lakehouse/standing_driver.py``).

Protocol, one JSON object per line (``PROTOCOL``): the client sends
``{"op": "apply", "args": [<apply_changes.py arguments>]}``; the driver answers
``{"accepted": <run number>, "pid": ...}`` before it starts, then ``{"log": "..."}`` lines, then
``{"result": <summary>}`` or ``{"error": "...", "traceback": "..."}``. A client that sees no
``accepted`` line may retry elsewhere: nothing was started for it. A client that closes its end
after ``accepted`` and before the answer (its task was killed) ends the driver, and so the apply.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

from airflow_provider_pglogical.spark import apply_changes

#: the first line the driver prints on stdout once it listens, followed by its pid
READY_PREFIX = "PGLOGICAL_APPLY_DRIVER_READY "
PROTOCOL = 1
#: seconds a client has to send its request once connected
REQUEST_TIMEOUT = 30.0
log = logging.getLogger("pglogical.apply_server")


class _Forward(logging.Handler):
    """Sends the apply's log records to the client that asked for the run (lost if it left)."""

    def __init__(self, connection: socket.socket) -> None:
        super().__init__(logging.INFO)
        self.connection = connection
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            send(self.connection, {"log": self.format(record)})
        except OSError:
            pass  # the task that asked went away: the run goes on, its state commit decides


def send(connection: socket.socket, message: dict) -> None:
    connection.sendall(json.dumps(message).encode() + b"\n")


def read_request(connection: socket.socket, limit: int = 1 << 20) -> dict:
    """One JSON line from the client (at most ``limit`` bytes)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = connection.recv(65536)
        if not chunk:
            raise ValueError("the client closed the connection before its request ended")
        data += chunk
        if len(data) > limit:
            raise ValueError(f"request longer than {limit} bytes")
    return json.loads(data)


@contextlib.contextmanager
def _client_watched(connection: socket.socket, on_client_left: Callable[[], None] | None) -> Iterator[None]:
    """While the block runs, ``on_client_left`` is called if the client closes its end (it sends
    nothing after its request, so readable means closed); once the block is over, nothing is."""
    if on_client_left is None:
        yield
        return
    wake, waker = socket.socketpair()

    def watch() -> None:
        readable, _, _ = select.select([connection, wake], [], [])
        if wake not in readable:
            on_client_left()

    watcher = threading.Thread(target=watch, name="pglogical-client-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        waker.send(b"x")  # the block is over: a client leaving now changes nothing
        watcher.join()
        wake.close()
        waker.close()


def end_driver(socket_path: str) -> Callable[[], None]:
    """What happens when the task that asked for an apply left during it (killed, timed out,
    marked failed): this driver ends at once, as a killed spark-submit would, so the apply stops
    instead of running on for nobody. The state table decides what the retry applies."""

    def end() -> None:
        log.warning("the task that asked for this apply left during it: the driver ends, so the apply stops")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)  # the next task finds no driver and starts one
        os._exit(3)

    return end


def handle(spark, connection: socket.socket, run_number: int,
           on_client_left: Callable[[], None] | None = None) -> bool:
    """Run one request: the apply it names, with its log lines and result sent back. False when
    the apply failed and Spark itself is no longer usable (the driver should end). If the client
    leaves while its apply runs, ``on_client_left`` is called (the driver ends)."""
    request = read_request(connection)
    connection.settimeout(None)  # the request is in: the apply takes what it takes
    if request.get("protocol") != PROTOCOL or request.get("op") != "apply":
        send(connection, {"error": f"unknown request (protocol {request.get('protocol')}, op {request.get('op')}); "
                                   f"this driver speaks protocol {PROTOCOL}"})
        return True
    try:
        args = apply_changes.parse_args([str(arg) for arg in request.get("args", [])])
    except SystemExit:  # argparse said why on stderr (the driver's log)
        send(connection, {"error": f"bad apply arguments {request.get('args')}: see the driver's log"})
        return True
    send(connection, {"accepted": run_number, "pid": os.getpid()})
    forward = _Forward(connection)
    root = logging.getLogger()
    root.addHandler(forward)
    failure = None
    try:
        with _client_watched(connection, on_client_left):
            summary = apply_changes.run_with_args(spark, args)
    except Exception as error:  # the driver outlives a failed apply, as the next spark-submit would start
        failure = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    finally:
        root.removeHandler(forward)  # our own lines below stay out of the client's log
    if failure:
        log.warning("apply of %s failed: %s", args.pipeline, failure["error"])
        with contextlib.suppress(OSError):
            send(connection, failure)
        return usable(spark)
    send(connection, {"result": summary, "driver": {"pid": os.getpid(), "run": run_number}})
    return True


def usable(spark) -> bool:
    """False once the SparkContext has stopped or its JVM cannot be reached."""
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:  # py4j: the JVM is gone
        return False


def serve(spark, listener: socket.socket, idle_seconds: float, max_runs: int,
          request_timeout: float = REQUEST_TIMEOUT, on_client_left: Callable[[], None] | None = None) -> str:
    """Answer requests one at a time until idle or worn; returns why it stopped. A client that
    connects but sends no request within ``request_timeout`` is dropped, so it cannot hold up
    the others."""
    runs = 0
    listener.settimeout(idle_seconds)
    while True:
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            return f"no request for {idle_seconds:g} s"
        runs += 1
        with connection:
            connection.settimeout(request_timeout)
            try:
                if not handle(spark, connection, runs, on_client_left):
                    return "Spark is no longer usable after a failed apply"
            except (OSError, ValueError) as error:
                log.warning("request %d: %s", runs, error)
        if runs >= max_runs:
            return f"{runs} runs served"


def not_private(directory: str) -> str | None:
    """Why ``directory`` is not this user's alone (so others could ask the driver), or None.
    The operator checks it before starting a driver, the driver again before it listens."""
    status = os.stat(directory)
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        return (f"directory {directory} must belong to uid {os.getuid()} with mode 0700 "
                f"(it is uid {status.st_uid}, mode {status.st_mode & 0o777:o})")
    return None


def listen(path: str) -> socket.socket:
    """Listen on ``path``, whose directory must be this user's alone (nobody else may ask)."""
    problem = not_private(os.path.dirname(path) or ".")
    if problem:
        raise SystemExit(f"apply driver: {problem}; nothing was started")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # fails if another driver listens there: the operator starts one at a time
    listener.listen(16)
    return listener


def write_to_log(log_file: str | None) -> None:
    """From now on this process's stdout and stderr go to ``log_file`` (appended to).

    spark-submit passes the Python driver's stdout and stderr on through its own stdout, which
    the starter reads only until the ready line: without this, every later line (this driver's
    warnings, a traceback) would be lost. The JVM's own log goes to the file as its stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not log_file:
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        return
    descriptor = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(descriptor, sys.stdout.fileno())
    os.dup2(descriptor, sys.stderr.fileno())
    os.close(descriptor)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="Unix socket path, in a directory of mode 0700")
    parser.add_argument("--idle-seconds", type=float, default=900.0, help="end after this long without a request")
    parser.add_argument("--max-runs", type=int, default=1000, help="end after this many runs")
    parser.add_argument("--log-level", default="WARN", help="Spark's log level (default WARN)")
    parser.add_argument("--log-file", help="where this driver's own output goes once it listens (appended to)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pglogical").setLevel(logging.INFO)  # forwarded to the client; WARNING+ also logged here
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
    spark = apply_changes.create_session("pglogical-apply-driver", args.log_level)
    listener = listen(args.socket)
    started = time.monotonic()
    try:
        print(f"{READY_PREFIX}{os.getpid()}", flush=True)
        write_to_log(args.log_file)
        why = serve(spark, listener, args.idle_seconds, args.max_runs, on_client_left=end_driver(args.socket))
    finally:
        try:
            os.unlink(args.socket)  # before closing: a client now finds no driver, not a dead one
        except FileNotFoundError:
            pass
        listener.close()
    log.warning("apply driver %d stops after %.0f s: %s", os.getpid(), time.monotonic() - started, why)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
