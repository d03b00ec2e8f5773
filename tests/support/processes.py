"""Killing tasks the way a worker dies: SIGKILL, no cleanup, no ``finally``."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import NoReturn


def die_now() -> NoReturn:
    """SIGKILL this process: a task killed at exactly this point."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL was not delivered")


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL a process started with ``start_new_session=True`` and everything it started
    (spark-submit's JVM and Python driver)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended on its own meanwhile
        pass


def pids_naming(path: Path) -> list[int]:
    """The processes whose command line holds ``path`` (a standing driver: spark-submit's JVM and
    its Python, named by their socket's directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # it ended meanwhile
                continue
    return pids


def kill_naming(path: Path) -> None:
    """SIGKILL every process :func:`pids_naming` finds."""
    for pid in pids_naming(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
