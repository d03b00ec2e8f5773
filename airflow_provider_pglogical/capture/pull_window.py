"""A pull that keeps running for a bounded window: pull, stage a batch when there are changes, wait, repeat.

A scheduled tick pays a DAG run and a task start (seconds) per pull. Within one task a window
pulls every ``poll_interval`` seconds until it ends, so a commit waits at most about one poll for
its batch. Each pull is a whole :func:`capture.pull.run_pull`: its batch committed, then the slot
advanced, under the slot's consumer lock, so a window killed anywhere has lost nothing and a
retry continues from the slot. The lock is taken per pull, not for the window: an initial sync
or backfill of the pipeline gets its turn between two pulls.
"""

from __future__ import annotations

import time
from typing import Callable


def pull_window(pull: Callable[[], dict], seconds: float, poll_interval: float, *,
                pulled: Callable[[dict, float], None] | None = None,
                clock: Callable[[], float] = time.monotonic, wait: Callable[[float], None] = time.sleep) -> dict:
    """Call ``pull`` until ``seconds`` have passed (one last pull at the end), starting one at most every
    ``poll_interval`` seconds (at once after a pull that took longer: a backlog); returns a summary.

    :param pull: one pull (``run_pull``'s result: ``batch``, ``start_lsn``, ``end_lsn``, ``changes``, …).
    :param pulled: called after each pull with its result and seconds (the history, the log).
    """
    started = clock()
    deadline = started + seconds
    summary: dict = {"pulls": 0, "batches": 0, "batch": None, "first_batch": None, "start_lsn": None,
                     "end_lsn": None, "advanced_to": None, "tables": {}, "transactions": 0, "changes": 0,
                     "recovered": False}
    while True:
        began = clock()
        result = pull()
        add_pull(summary, result)
        if pulled is not None:
            pulled(result, clock() - began)
        remaining = deadline - clock()
        if remaining <= 0:
            break
        wait(min(remaining, max(0.0, poll_interval - (clock() - began))))
    summary["seconds"] = round(clock() - started, 3)
    return summary


def add_pull(summary: dict, result: dict) -> dict:
    """Fold one pull's result into the window's summary (counts summed, the last positions kept)."""
    summary["pulls"] += 1
    if result.get("batch"):
        summary["batches"] += 1
        summary["batch"] = result["batch"]
        summary["first_batch"] = summary["first_batch"] or result["batch"]
    summary["start_lsn"] = summary["start_lsn"] or result.get("start_lsn")
    summary["end_lsn"], summary["advanced_to"] = result.get("end_lsn"), result.get("advanced_to")
    for table, rows in (result.get("tables") or {}).items():
        summary["tables"][table] = summary["tables"].get(table, 0) + rows
    summary["transactions"] += result.get("transactions", 0)
    summary["changes"] += result.get("changes", 0)
    summary["recovered"] = summary["recovered"] or bool(result.get("recovered"))
    if result.get("resynced"):
        summary["resynced"] = True
    return summary
