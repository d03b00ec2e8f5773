"""The apply job's streaming window (``ApplyOptions.keep_running``).

A tick that submits the job pays a JVM start and a session (5-10 s) for one apply. In a window
the same session keeps the pipeline's apply lease (renewed by its thread) for ``--keep-running``
seconds after the first round (what was pending at the start),
lists the committed batches every ``--poll-interval`` seconds (one listing of the staging
directory: no Spark job, no Iceberg read while nothing is new) and applies the new ones in a
round of their own, until the window ends; then it lists once more, applies what is there, and
exits. Each round is a whole apply: every step is committed and recorded in the state table as in
a single run, so a window killed anywhere resumes exactly where its last state commit left it.

Two windows overlap at a boundary (the streaming DAG starts the next before the previous ends):
the next one's session waits for the lease (``lease.ApplyLease``, the handover), and the time it
waited counts as part of its window, so windows keep their length and do not drift
(:func:`window_after_handover`). A round that meets a commit of the housekeeping on the same
files (a compaction's replace) commits nothing (every commit validates) and is run again at the
next poll, at most :data:`MAX_CONFLICTS` times in a row (:func:`commit_conflict`).

Each round adds an entry to the pipeline's apply history (``<root>/<pipeline>/_history_apply.jsonl``,
the UI's freshness chart): its rows and time, where the time went (``phases``), ``end_lsn`` (every commit before it is queryable
now) and, per table, the age of the oldest commit it applied.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from typing import Callable

from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.staging.contract import (
    DEFAULT_POLL_INTERVAL,
    HISTORY_KEEP,
    history_name,
)
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest

log = logging.getLogger("pglogical.apply")

#: rounds in a row that may meet another commit (the housekeeping's) before the window fails
MAX_CONFLICTS = 5


def window_after_handover(keep_running: float, waited: float, poll_interval: float) -> float:
    """A window's length after it waited ``waited`` seconds for the lease: ``keep_running`` less the
    wait (the window started when its session was ready), at least one poll."""
    return max(poll_interval, keep_running - waited)


def commit_conflict(error: BaseException) -> bool:
    """Whether a round failed because another commit changed a table it wrote (nothing of the step
    was committed): ``ConcurrentCommit`` from the driver's commits, or Iceberg's
    ``ValidationException`` behind a Spark MERGE or write."""
    from airflow_provider_pglogical.spark.row_delta.driver_commits import ConcurrentCommit, java_exception_class

    if isinstance(error, ConcurrentCommit):
        return True
    if java_exception_class(error) is None:
        return False
    cause = error.java_exception
    while cause is not None:
        if cause.getClass().getName() == "org.apache.iceberg.exceptions.ValidationException":
            return True
        cause = cause.getCause()
    return False


def keep_applying(apply_round: Callable[[], dict], committed: Callable[[], list[str]], seconds: float,
                  poll_interval: float = DEFAULT_POLL_INTERVAL, *, record: Callable[[dict], None] | None = None,
                  until: Callable[[dict], bool] | None = None, idle: Callable[[], float | None] | None = None,
                  promise: Callable[[float], None] | None = None, conflict: Callable[[BaseException], bool] | None = None,
                  clock: Callable[[], float] = time.monotonic, wait: Callable[[float], None] = time.sleep) -> dict:
    """Apply a first round, then a round whenever ``committed()`` lists a batch no round has seen,
    until ``seconds`` have passed since the first round ended; a last listing at the end. Returns the rounds' summaries merged.

    :param apply_round: one apply of everything committed now (``apply_changes.apply_pending``).
    :param committed: the committed batch names now (raises when the lease is lost).
    :param record: called with each round's history entry (:func:`round_entry`).
    :param until: ends the window after the first round whose summary it holds true (an initial
        load: :func:`loaded`); then a window that reaches its end without such a round raises.
    :param idle: run once, in a thread of its own, when the first round applied nothing (``warm_up.py``):
        the window polls meanwhile, so a batch committed during it is applied at once; its result
        (seconds, or None) is the summary's ``warm_up_seconds``, waited for at the window's end.
    :param promise: called once with the window's remaining seconds when its deadline is known (after
        the first round): the lease says it (``ApplyLease.promise``), for the next window's handover.
    :param conflict: whether a round's error is a commit conflict, run again at the next poll
        (:func:`commit_conflict`; at most :data:`MAX_CONFLICTS` in a row).
    :raises ApplyError: ``until`` was given and no round satisfied it within ``seconds``.
    """
    if not seconds > 0:
        raise ApplyError(f"--keep-running must be a positive number of seconds, not {seconds}")
    if not poll_interval > 0:
        raise ApplyError(f"--poll-interval must be a positive number of seconds, not {poll_interval}")
    started = clock()
    warmed: list[float | None] = []
    warming = None
    deadline = None  # the window counts from the end of the first round (what was pending at the start)
    rounds: list[dict] = []
    seen: set[str] = set()
    polls = conflicts = met = 0
    while True:
        closing = deadline is not None and clock() >= deadline
        if rounds:
            polls += 1
        if not rounds or conflicts or not seen.issuperset(committed()):
            round_started = clock()
            try:
                summary = apply_round()
            except Exception as error:
                if conflict is None or not conflict(error) or conflicts >= MAX_CONFLICTS:
                    raise
                conflicts += 1
                met += 1
                log.warning("a round met another commit (the housekeeping's?) and committed nothing of that step; "
                            "applying it again at the next poll: %s", error)
                wait(poll_interval)
                continue
            conflicts = 0
            summary["round_seconds"] = round(clock() - round_started, 3)
            rounds.append(summary)
            seen.update(summary["seen"])
            if record is not None:
                record(round_entry(summary, len(rounds)))
            if until is not None and until(summary):
                break
            if idle is not None and len(rounds) == 1 and not summary["steps"]:
                warming = threading.Thread(target=lambda: warmed.append(idle()), name="pglogical-warm-up", daemon=True)
                warming.start()
        if deadline is None:
            deadline = clock() + seconds
            if promise is not None:
                promise(seconds)
        if closing:
            if until is not None:
                raise ApplyError(
                    f"no snapshot batch was committed in the {seconds:g} s this initial load waited "
                    "(--keep-running): the initial sync started beside it failed or is still copying; "
                    "see the sync task's log, then run the apply again (a longer keep_running if the copy "
                    "takes longer)", permanent=False)
            break
        wait(max(0.0, min(poll_interval, deadline - clock())))
    if warming is not None:
        warming.join()
    summary = merge_rounds(rounds, polls, clock() - started)
    summary["window"]["warm_up_seconds"] = warmed[0] if warmed else None
    summary["window"]["conflicts"] = met
    return summary


def loaded(summary: dict) -> bool:
    """Whether a round left the pipeline's tables in the lakehouse: every source it knows has its
    target (a snapshot applied by this round or an earlier run); a round before the initial sync
    committed its snapshot knows no table."""
    targets = summary.get("targets") or {}
    return bool(targets) and all(targets.values())


def merge_rounds(rounds: list[dict], polls: int, seconds: float) -> dict:
    """One summary for the window: every round's steps, the last round's listing and targets."""
    last = rounds[-1]
    costs = [r["round_seconds"] for r in rounds]
    return {
        **{key: value for key, value in last.items() if key not in ("round_seconds", "first_commits", "round_phases")},
        "steps": [step for r in rounds for step in r["steps"]],
        "retention": {"removed": sum((r.get("retention") or {}).get("removed", 0) for r in rounds)},
        "compactions": [entry for r in rounds for entry in r.get("compactions", [])],
        "window": {"rounds": len(rounds), "polls": polls, "seconds": round(seconds, 3),
                   "round_seconds_first": costs[0], "round_seconds_max": max(costs)},
    }


def first_commits(steps: list[dict], manifests: dict[str, BatchManifest]) -> dict[str, str]:
    """Per source table, the oldest commit time (ISO) of the change batches ``steps`` applied,
    from each manifest's change facts (the pull's ``first_commit_ts``)."""
    out: dict[str, str] = {}
    for step in steps:
        if step.get("kind") != "changes":
            continue
        manifest = manifests.get(step["batch"])
        table = manifest.tables.get(step["table"]) if manifest else None
        facts = table.change_facts if table else None
        first = facts.first_commit_ts if facts else None
        if first and (step["table"] not in out or _instant(first) < _instant(out[step["table"]])):
            out[step["table"]] = first
    return out


def round_entry(summary: dict, number: int, now: dt.datetime | None = None) -> dict:
    """A round's history entry (the shape of ``ui.history.apply_entry``, plus the round's number and
    ``end_lsn``): freshness per table is now minus the oldest commit the round applied."""
    now = now or dt.datetime.now(dt.timezone.utc)
    tables = {name: round(max(0.0, (now - _instant(first)).total_seconds()), 3)
              for name, first in (summary.get("first_commits") or {}).items()}
    steps = summary.get("steps", [])
    return {"at": now.isoformat(timespec="milliseconds"), "seconds": summary.get("round_seconds"),
            "rows": sum(step.get("rows", 0) for step in steps), "steps": len(steps), "round": number,
            "end_lsn": summary.get("end_lsn"), "freshness_seconds": max(tables.values()) if tables else None,
            "tables": tables, "phases": summary.get("round_phases", {}),
            "compactions": len(summary.get("compactions", []))}


def record_round(staging, entry: dict, keep: int = HISTORY_KEEP) -> None:
    """Add ``entry`` to the apply history (whole file rewritten, newest ``keep`` kept); a failure only
    warns: the history is for people, the apply comes first."""
    name = history_name("apply")
    try:
        lines = [line for line in (staging.read_text(name) or "").splitlines() if line.strip()]
        lines = [*lines, json.dumps(entry, sort_keys=True)][-keep:]
        staging.write_text(name, "\n".join(lines) + "\n")
    except Exception as error:  # noqa: BLE001
        log.warning("could not record the apply round in the history: %s", error)


def _instant(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


class Phases:
    """Seconds per phase of a run, summed over rounds: each :meth:`end` closes the time since the last."""

    def __init__(self, started: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.last, self.clock = started, clock
        self.seconds: dict[str, float] = {}

    def end(self, name: str) -> None:
        now = self.clock()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self.last, 3)
        self.last = now

    def restart(self) -> dict[str, float]:
        """Count from now (the time since the last :meth:`end` is no phase's); returns the sums so far."""
        self.last = self.clock()
        return dict(self.seconds)

    def since(self, before: dict[str, float]) -> dict[str, float]:
        """Each phase's seconds since :meth:`restart` returned ``before``."""
        return {name: round(total - before.get(name, 0.0), 3) for name, total in self.seconds.items()
                if total > before.get(name, 0.0)}
