"""What the tasks measured, tick by tick: ``<root>/<pipeline>/_history_<kind>.jsonl``, capped.

The pipeline view in the Airflow UI (``airflow_provider_pglogical.ui``) draws freshness and slot
lag over time from these files; nothing else reads them. A file is rewritten whole (a temporary
name, then a rename: readers never see half of it, and object stores have no append), by the task
of its kind just after its work; one pull and one apply run at a time, so writers of one file
rarely meet, and when they do one entry may be lost, never the file. No lock is taken for it.
The file keeps the newest :data:`KEEP` entries, so it stays a few tens of kilobytes however long
the pipeline runs. Written with the staging mode (private) like every staged file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from typing import Any, Callable, Iterator, Mapping

from airflow_provider_pglogical.staging import private_files
from airflow_provider_pglogical.staging.contract import HISTORY_KEEP, HISTORY_KINDS, history_name
from airflow_provider_pglogical.staging.layout import StagingPath

#: entries kept per file: 500 ticks, about a day at a tick every three minutes (a streaming
#: window records a round every second or so: minutes of them)
KEEP = HISTORY_KEEP
KINDS = HISTORY_KINDS


def read_history(root: StagingPath, pipeline: str, kind: str) -> list[dict]:
    """The entries of ``kind``, oldest first; empty when the tasks recorded none yet."""
    path = root / pipeline / history_name(kind)
    if not path.exists():
        return []
    with path.open("rb") as fh:
        lines = fh.read().decode().splitlines()
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:  # a line cut by a crash of an older writer: skip it, keep the rest
            continue
    return entries


def record_history(root: StagingPath, pipeline: str, kind: str, entry: dict, keep: int = KEEP) -> dict:
    """Append ``entry`` (stamped ``at``, UTC, when it has none) and drop all but the newest ``keep``."""
    entry = {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"), **entry}
    entries = [*read_history(root, pipeline, kind), entry][-keep:]
    directory = root / pipeline
    private_files.make_dirs(directory)
    name = history_name(kind)
    tmp = directory / (name + ".tmp")
    with private_files.open_new(tmp) as fh:
        fh.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries).encode())
    tmp.rename(directory / name)
    return entry


def pull_entry(result: dict, seconds: float, slot: Mapping[str, Any] | None) -> dict:
    """A pull's entry: its batch, rows and time, and the slot's lag and retained WAL after it.

    :param result: what ``capture.pull.run_pull`` returned.
    :param slot: the slot's status after the pull (``management.monitoring.slot_status``), or None.
    """
    slot = slot or {}
    batch = result.get("batch")
    return {
        "seconds": round(seconds, 3), "batch": batch.rsplit("/", 1)[-1] if batch else None,
        "rows": result.get("changes", 0), "transactions": result.get("transactions", 0),
        "end_lsn": result.get("advanced_to"),
        "lag_bytes": slot.get("lag_bytes"), "retained_wal_bytes": slot.get("retained_wal_bytes"),
        # a change to what the source publishes: the tables snapshotted again, and why (issue 47)
        **{key: result[key] for key in ("resnapshotted", "orphaned") if result.get(key)},
    }


def apply_entry(root: StagingPath, pipeline: str, steps: list[dict], seconds: float,
                now: dt.datetime | None = None) -> dict:
    """An apply's entry: its rows and time, and per table the freshness it reached: from the oldest
    commit of the change batch it applied (the pull's ``first_commit_ts``) to now, when the rows are
    queryable. Batches already removed by retention only lose their freshness figure."""
    from airflow_provider_pglogical.staging.contract import CHANGE_FACTS
    from airflow_provider_pglogical.staging.layout import read_manifest

    now = now or dt.datetime.now(dt.timezone.utc)
    freshness: dict[str, float] = {}
    manifests: dict[str, object] = {}
    for step in steps:
        if step.get("kind") != "changes":
            continue
        try:
            manifest = manifests.get(step["batch"]) or read_manifest(root, pipeline, step["batch"])
        except FileNotFoundError:
            continue
        manifests[step["batch"]] = manifest
        table = manifest.tables.get(step["table"])
        first = (table.details.get(CHANGE_FACTS) or {}).get("first_commit_ts") if table else None
        if first:
            age = (now - dt.datetime.fromisoformat(first)).total_seconds()
            freshness[step["table"]] = round(max(age, freshness.get(step["table"], 0.0)), 3)
    return {"seconds": round(seconds, 3), "rows": sum(s.get("rows", 0) for s in steps), "steps": len(steps),
            "freshness_seconds": max(freshness.values()) if freshness else None, "tables": freshness}


def safely_record(root: StagingPath, pipeline: str, kind: str, entry: dict | Callable[[], dict],
                  warn: Callable[[str], None]) -> None:
    """Record ``entry`` (or what it returns); a failure only warns: the history must never fail a task."""
    try:
        record_history(root, pipeline, kind, entry() if callable(entry) else entry)
    except Exception as err:  # noqa: BLE001 - the history is for people, the task's work comes first
        warn(f"could not record the {kind} in the history of pipeline {pipeline!r}: {err}")


@contextlib.contextmanager
def errors_recorded(root: StagingPath, pipeline: str, kind: str, warn: Callable[[str], None]) -> Iterator[None]:
    """Record an error the block raises (its message names the fix) for the UI, then re-raise it;
    a skip (Airflow's ``AirflowSkipException``, by name: it moved between Airflow versions) is none."""
    try:
        yield
    except Exception as err:
        if type(err).__name__ != "AirflowSkipException":
            safely_record(root, pipeline, kind, {"error": f"{type(err).__name__}: {err}"[:2000]}, warn)
        raise
