"""Operations on a whole pipeline: its status, and dropping it safely. Used by ``airflow pglogical``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from airflow_provider_pglogical.management import connector
from airflow_provider_pglogical.management.slots import invalidation_cause
from airflow_provider_pglogical.exceptions import PipelineStateError, SlotError
from airflow_provider_pglogical.staging.applied_positions import read_applied
from airflow_provider_pglogical.management.consumer_lock import slot_consumer_lock
from airflow_provider_pglogical.staging.pipeline_record import read_record
from airflow_provider_pglogical.staging.layout import StagingPath, committed_batches


@dataclass
class PipelineStatus:
    pipeline: str
    state: str
    slot: str | None
    publications: list[str]
    #: the live slot: None when it does not exist
    slot_active: bool | None = None
    wal_status: str | None = None
    #: 17+: why the slot was invalidated (``wal_removed``, 18's ``idle_timeout``, …)
    invalidation_reason: str | None = None
    confirmed_flush_lsn: str | None = None
    retained_wal_bytes: int | None = None
    lag_bytes: int | None = None
    committed_batches: int = 0
    last_batch: str | None = None
    last_batch_end_lsn: str | None = None
    #: per source table, what the apply task last applied (``_applied.json``)
    applied: dict[str, dict] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def pipeline_status(hook, root: StagingPath, pipeline: str) -> PipelineStatus:
    """The pipeline's record, its slot's lag and retained WAL, its last batch and applied positions."""
    record = read_record(root, pipeline)
    batches = committed_batches(root, pipeline)
    status = PipelineStatus(
        pipeline=pipeline, state=record.state if record else "unknown (no pipeline record)",
        slot=record.slot if record else None, publications=list(record.publications) if record else [],
        committed_batches=len(batches), applied=read_applied(root, pipeline),
    )
    if batches:
        name, _start, end, _kind = batches[-1]
        status.last_batch, status.last_batch_end_lsn = name, str(end)
    if record:
        slot = connector.get_slot(hook, record.slot)
        if slot is None:
            status.state += " (slot missing)"
        else:
            status.slot_active = slot.active
            status.wal_status = slot.wal_status
            status.invalidation_reason = slot.invalidation_reason
            if slot.invalidated:
                status.state += f" (slot invalidated: {invalidation_cause(slot)})"
            status.confirmed_flush_lsn = str(slot.confirmed_flush_lsn) if slot.confirmed_flush_lsn else None
            status.retained_wal_bytes = slot.retained_wal_bytes
            status.lag_bytes = slot.lag_bytes
    return status


def drop_pipeline(hook, root: StagingPath, pipeline: str, *, dry_run: bool = True,
                  report: Callable[[str], None] = print) -> dict:
    """Drop a pipeline: first its slot (so the publisher stops retaining WAL), then its staging
    directory. The lakehouse tables are kept.

    Refuses, changing nothing, when the pipeline has no record, when the live slot is not the one
    the record names (other plugin or database), or while anything consumes the slot (an active
    replication connection, or a pull/initial sync holding the pipeline's lock).

    :param dry_run: only report what would be dropped.
    :return: ``{"slot", "slot_dropped", "staging", "staging_removed", "batches"}``.
    """
    record = read_record(root, pipeline)
    directory = root / pipeline
    if record is None:
        raise PipelineStateError(
            f"pipeline {pipeline!r} has no record under {directory}: nothing proves which slot it created, so "
            "nothing was dropped. Check the staging root and pipeline name; drop a slot by hand with "
            "PgLogicalHook.drop_slot only if you know it is unused"
        )
    batches = committed_batches(root, pipeline)
    result = {"slot": record.slot, "slot_dropped": False, "staging": str(directory), "staging_removed": False,
              "batches": len(batches)}
    slot = connector.get_slot(hook, record.slot)
    if slot is not None and (slot.plugin != record.plugin or slot.database != record.database):
        raise SlotError(
            f"replication slot {record.slot!r} (plugin {slot.plugin}, database {slot.database}) is not the one "
            f"pipeline {pipeline!r} created (plugin {record.plugin}, database {record.database}): it is left alone, "
            "and so is the staging directory. Nothing was dropped", permanent=True,
        )
    if slot is not None and slot.active:
        raise SlotError(
            f"replication slot {record.slot!r} of pipeline {pipeline!r} is in use (pid {slot.active_pid}): stop its "
            "consumer first. Nothing was dropped"
        )
    if dry_run:
        report(f"would drop slot {record.slot} ({'exists' if slot else 'already gone'}), then remove {directory} "
               f"({len(batches)} committed batch(es)); the lakehouse tables are kept. Pass --yes to do it")
        return result
    # Hold the pipeline's lock while dropping, so no pull or initial sync runs meanwhile.
    with slot_consumer_lock(hook.connect_kwargs(), record.slot, "drop", wait_seconds=5):
        if slot is not None:
            result["slot_dropped"] = connector.drop_slot(hook, record.slot, missing_ok=True)
            report(f"dropped slot {record.slot}")
        if directory.exists():
            directory.rmdir(recursive=True)
            result["staging_removed"] = True
            report(f"removed {directory}")
    return result

