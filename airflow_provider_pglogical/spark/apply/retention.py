"""Staging retention: batches the lakehouse has applied are removed (or archived) once they are old.

Without it staging only grows (a batch directory per tick: about 52,000 a year on a 10-minute
schedule) and every listing gets slower. It runs in the apply job, after the run's last state
commit, because the Iceberg state table it has just written is the truth about what is applied.

A batch is removed only when all of these hold (:func:`removable`):

- it was committed longer ago than the retention (default a week: re-applies, verifies and
  backfills that run long find what they need);
- every table it holds has applied it: a change batch ends at or before the table's position, a
  snapshot batch is among the table's applied (or superseded) snapshots;
- it is not the newest change batch (a pull that died before advancing its slot finds its batch
  there).

Before it deletes anything, the job writes ``_retention.json`` (:data:`RETENTION_RECORD`): per
source table, the end of the last removed batch that held it, and the names it is about to remove
(a killed run finishes them next time). A plan that would need a removed batch - a dropped
Iceberg table rebuilt from staging, a backfill whose snapshot is older than what was removed -
fails before anything changes, naming the backfill that rebuilds the table
(:func:`missing_history`). The manifest of a removed initial snapshot is kept in the record, so a
re-run of the initial sync still finds its work done. The record also keeps the WAL ranges the
removed change batches covered (``removed_chain``), so the chain of change batches is still
proven complete after they are gone (:func:`prove_staging`).
"""

from __future__ import annotations

import logging
import os
import signal
import time

from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.plan import (
    Batch,
    Step,
    TableState,
    chain_holes,
    chain_intervals,
    files_read,
    merged,
    needed_from,
)
from airflow_provider_pglogical.staging.contract import (
    ARCHIVE_DIRECTORY,
    RETENTION_RECORD,
    STAGED_THROUGH,
    parse_lsn,
)

log = logging.getLogger("pglogical.retention")


def applied_by(batch: Batch, source: str, state: TableState | None) -> bool:
    """Whether ``source``'s lakehouse table has applied (or no longer needs) ``batch``."""
    if state is None:
        return False
    if batch.kind == "snapshot":
        return batch.name in state.snapshots and state.position >= batch.start
    return state.position >= batch.end


def removable(batches: list[Batch], states: dict[str, TableState], now_ms: int, retention_ms: int) -> list[Batch]:
    """The batches retention may remove (manifests read for the old ones; pure otherwise)."""
    changes = [batch for batch in batches if batch.kind == "changes"]
    newest = max(changes, key=lambda batch: batch.end).name if changes else None
    out = []
    for batch in batches:
        if batch.name == newest or batch.committed_ms is None or now_ms - batch.committed_ms < retention_ms:
            continue
        if all(applied_by(batch, source, states.get(source)) for source in batch.manifest.tables):
            out.append(batch)
    return out


def missing_history(plans: dict[str, list[Step]], record: dict | None) -> list[str]:
    """Tables whose plan needs change rows that retention removed, each with the fix."""
    removed = (record or {}).get("removed_through", {})
    problems = []
    for source, steps in plans.items():
        needed = [step.position for step in steps if step.kind == "changes" or step.window is not None]
        if needed and removed.get(source, 0) > min(needed):
            problems.append(
                f"table {source}: the lakehouse needs its changes from LSN {_lsn(min(needed))}, but staging retention "
                f"removed batches of it up to LSN {_lsn(removed[source])} (its Iceberg table was dropped, or a "
                "backfill's snapshot is older than what was removed). Run a backfill of the whole table "
                f"(PgBackfillOperator(tables=[{source!r}])): it supersedes what is missing"
            )
    return problems


#: what mends a staging the apply cannot prove (each problem names its batches and tables)
STAGING_FIX = ("restore the missing or damaged batches if you have them, else run PgBackfillOperator for the "
               "tables named: its snapshot supersedes what is missing")


def prove_staging(staging, pipeline: str, batches: list[Batch], plans: dict[str, list[Step]],
                  states: dict[str, TableState], record: dict | None, pipeline_record: dict) -> None:
    """Invariant 12, before anything is written: staging holds every change each table needs (the
    chain of change batches from its position to the end of staging has no hole, counting what
    retention removed as held) and every file the steps read is the one staged. Raises
    :class:`ApplyError` naming each batch, LSN range and fix.

    :param record: the retention record; :param pipeline_record: the pipeline's (``PIPELINE_RECORD``).
    """
    problems = missing_history(plans, record)
    if not problems:
        through = pipeline_record.get(STAGED_THROUGH)
        needed = {source: needed_from(steps, states[source]) for source, steps in plans.items()}
        removed, end = (record or {}).get("removed_chain", []), parse_lsn(through) if through else None
        problems = chain_holes(pipeline, batches, needed, removed, end, [])
        if problems:  # list the directories without a manifest only to name them
            problems = chain_holes(pipeline, batches, needed, removed, end, staging.uncommitted(batches))
        problems += staging.damaged_files(files_read(plans))
    if problems:
        raise ApplyError("; ".join(problems) + ". Nothing was applied", fix=STAGING_FIX)


def apply_retention(staging, batches: list[Batch], states: dict[str, TableState], retention_hours: float,
                    archive: bool = False) -> dict:
    """Remove (or archive) what :func:`removable` allows; returns what it did."""
    record = staging.read_file(RETENTION_RECORD) or {}
    target = ARCHIVE_DIRECTORY if archive else None
    leftovers = record.get("removing", [])
    for name in leftovers:  # a killed run's removals, decided then: finish them
        staging.remove_batch(name, target)
    batches = [batch for batch in batches if batch.name not in set(leftovers)]
    now_ms = int(time.time() * 1000)
    retention_ms = int(retention_hours * 3_600_000)
    for batch in batches:
        if not batch.manifest and batch.committed_ms is not None and now_ms - batch.committed_ms >= retention_ms:
            batch.manifest = staging.read_manifest(batch)
    chosen = removable(batches, states, now_ms, retention_ms)
    if not chosen and not leftovers:
        return {"removed": 0}
    gone = {batch.name for batch in chosen}
    record["removed_chain"] = merged([tuple(r) for r in record.get("removed_chain", [])] + [
        (low, high) for batch, low, high in chain_intervals(batches) if batch.name in gone])
    through = record.setdefault("removed_through", {})
    for batch in chosen:
        for source in batch.manifest.tables:
            through[source] = max(through.get(source, 0), batch.end)
        if batch.kind == "snapshot" and batch.manifest.initial:
            record.setdefault("initial_snapshots", {})[batch.name] = batch.manifest.without_files().to_dict()
    record["removing"] = [batch.name for batch in chosen]
    record["removed_batches"] = record.get("removed_batches", 0) + len(chosen)
    staging.write_file(RETENTION_RECORD, record)  # decided and recorded before anything is removed
    _crash_point(0)
    for done, batch in enumerate(chosen, start=1):
        staging.remove_batch(batch.name, target)
        _crash_point(done)
    record["removing"] = []
    staging.write_file(RETENTION_RECORD, record)
    log.info("staging retention %s %d applied batch(es) older than %sh", "archived" if archive else "removed",
             len(chosen), retention_hours)
    return {"removed": len(chosen), "archived": archive, "oldest_kept": _oldest_kept(batches, chosen)}


def _oldest_kept(batches: list[Batch], chosen: list[Batch]) -> str | None:
    gone = {batch.name for batch in chosen}
    kept = [batch.name for batch in batches if batch.name not in gone]
    return kept[0] if kept else None


def _lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def _crash_point(removed: int) -> None:
    """Tests only: die like a killed driver after ``removed`` batches are gone."""
    if os.environ.get("PGLOGICAL_RETENTION_CRASH_AFTER") == str(removed):
        log.error("crash point reached after removing %d batch(es)", removed)
        os.kill(os.getpid(), signal.SIGKILL)
