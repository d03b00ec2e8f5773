"""Killing tasks the way a worker dies: SIGKILL, no cleanup, no ``finally``."""

from __future__ import annotations

import os
import signal
import subprocess
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

