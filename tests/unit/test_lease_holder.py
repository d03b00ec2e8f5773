"""When a lease's holder counts as gone: judged from /proc, only for a holder on this machine."""

from __future__ import annotations

import os
import signal
import subprocess

from airflow_provider_pglogical.spark.apply.lease import _start_time, holder_is_gone, this_process


def _holder(pid: int) -> dict:
    return {**this_process(), "pid": pid, "start": _start_time(pid)}


def test_a_running_holder_holds_and_a_killed_one_is_gone_even_before_it_is_reaped():
    child = subprocess.Popen(["sleep", "600"])
    try:
        holder = _holder(child.pid)
        assert holder_is_gone(holder) is False
        os.kill(child.pid, signal.SIGKILL)
        # not reaped yet: a zombie, as a killed driver is until init reaps it (never, in some containers)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        with open(f"/proc/{child.pid}/stat") as stat:
            assert stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        assert holder_is_gone(holder) is True
    finally:
        child.kill()
        child.wait()
    assert holder_is_gone(holder) is True  # reaped: no such process


def test_a_reused_pid_or_a_holder_elsewhere_is_judged_right():
    holder = _holder(os.getpid())
    assert holder_is_gone(holder) is False
    assert holder_is_gone({**holder, "start": holder["start"] - 1}) is True  # another process under that pid
    assert holder_is_gone({**holder, "boot": "another-boot"}) is False  # another machine: its lease expires
    assert holder_is_gone(None) is False
