"""A pull that keeps running for a bounded window: pull, stage a batch when there are changes, wait, repeat.

A scheduled tick pays a DAG run and a task start (seconds) per pull. Within one task a window
pulls every ``poll_interval`` seconds until it ends, so a commit waits at most about one poll for
its batch. Each pull is a whole :func:`capture.pull.run_pull`: its batch committed, then the slot
advanced, under the slot's consumer lock, so a window killed anywhere has lost nothing and a
retry continues from the slot. The lock is taken per pull, not for the window: an initial sync
or backfill of the pipeline gets its turn between two pulls.

The window paces itself to the apply: the apply pays two commits per batch whatever its size, so
while ``max_unapplied`` committed batches still wait for it, a pull is skipped and the changes
stay in the slot, to come in one larger batch a poll later (at most :data:`MAX_SKIPS` polls in a
row: an apply that stopped recording must not stop the pull).
"""

from __future__ import annotations

import time
from typing import Callable


#: pulls skipped in a row, at most, while the apply is behind
MAX_SKIPS = 10


def pull_window(pull: Callable[[], dict], seconds: float, poll_interval: float, *,
                pulled: Callable[[dict, float], None] | None = None,
                unapplied: Callable[[], int] | None = None, max_unapplied: int | None = None,
                clock: Callable[[], float] = time.monotonic, wait: Callable[[float], None] = time.sleep) -> dict:
    """Call ``pull`` until ``seconds`` have passed (one last pull at the end), starting one at most every
    ``poll_interval`` seconds (at once after a pull that took longer: a backlog); returns a summary.

    :param pull: one pull (``run_pull``'s result: ``batch``, ``start_lsn``, ``end_lsn``, ``changes``, …).
    :param pulled: called after each pull with its result and seconds (the history, the log).
    :param unapplied: how many committed change batches the apply has not applied yet.
    :param max_unapplied: skip a pull while ``unapplied()`` is at least this (None: never skip).
    """
    started = clock()
    deadline = started + seconds
    skips = 0
    summary: dict = {"pulls": 0, "batches": 0, "batch": None, "first_batch": None, "start_lsn": None,
                     "end_lsn": None, "advanced_to": None, "tables": {}, "transactions": 0, "changes": 0,
                     "recovered": False, "skipped": 0}
    while True:
        began = clock()
        if max_unapplied is not None and unapplied is not None and skips < MAX_SKIPS \
                and unapplied() >= max_unapplied:
            summary["skipped"] += 1  # the apply is behind: let the slot gather a larger batch
            skips += 1
        else:
            skips = 0
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


def unapplied_batches(committed: list[tuple[str, object, object, str]], applied_end) -> int:
    """Committed change batches that end past ``applied_end`` (the apply's position; None: unknown, 0)."""
    if applied_end is None:
        return 0
    return sum(1 for _name, _start, end, kind in committed if kind == "changes" and end > applied_end)


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
