"""Initial sync: a snapshot batch positioned exactly where the change stream continues.

Initial sync creates the pipeline's slot with an exported snapshot and copies the published
tables inside that snapshot: the batch sits at the slot's consistent LSN, so the slot's first
change batch continues it with no gap and no overlap. (Backfills: :mod:`.backfill`.)
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Mapping, Sequence

from airflow_provider_pglogical.capture import ddl, published_changes
from airflow_provider_pglogical.management import connector, slots
from airflow_provider_pglogical.management.connector import Connector
from airflow_provider_pglogical.exceptions import (
    PipelineStateError,
    PublicationError,
    PublisherCheckError,
    SlotError,
    SlotLostError,
)
from airflow_provider_pglogical.management import health
from airflow_provider_pglogical.management import validation
from airflow_provider_pglogical.management.consumer_lock import slot_consumer_lock
from airflow_provider_pglogical.staging.pipeline_record import (
    STREAMING,
    PipelineRecord,
    read_record,
    write_record,
)
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.capture.snapshot import Copier, copy_tables
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.contract import RETENTION_RECORD, SOURCE_IDENTITY, column_name_problems
from airflow_provider_pglogical.staging.layout import (
    BatchManifest,
    StagingPath,
    committed_batches,
    read_manifest,
    read_pipeline_file,
)

log = logging.getLogger(__name__)


def require_tables(tables: list[ResolvedTable], publications: Sequence[str]) -> list[ResolvedTable]:
    if not tables:
        raise PublicationError(
            f"publication(s) {', '.join(publications)} publish no tables: add tables "
            "(PgLogicalHook.add_publication_tables / ALTER PUBLICATION … ADD TABLE) before syncing"
        )
    problems = [problem for t in tables
                for problem in column_name_problems(t.qualified_name, t.column_names,
                                                    multiset=t.keyless or t.replica_identity == "f")]
    if problems:  # an Iceberg table of these columns could not be read: refused before a slot exists
        raise PublicationError("; ".join(problems) + ". Nothing was changed")
    return tables


def _initial_snapshot_batch(root: StagingPath, pipeline: str, slot: str,
                            record: PipelineRecord | None) -> BatchManifest | None:
    """The committed snapshot batch of the slot the record describes (its creation LSN), if any.

    After a resync the pipeline has several initial batches for one slot name: only the one at
    the current slot's creation LSN counts.
    """
    for name, start, _end, kind in committed_batches(root, pipeline):
        if kind == "snapshot" and (record is None or start == Lsn.parse(record.created_lsn)):
            manifest = read_manifest(root, pipeline, name)
            if manifest.details.get("initial") and manifest.details.get("slot") == slot:
                return manifest
    if record is not None and record.snapshot_batch:
        # applied and removed by staging retention since: its manifest (without files) is kept
        removed = (read_pipeline_file(root, pipeline, RETENTION_RECORD) or {}).get("initial_snapshots", {})
        if record.snapshot_batch in removed:
            manifest = BatchManifest.from_json(json.dumps(removed[record.snapshot_batch]))
            if manifest.details.get("slot") == slot and Lsn.parse(manifest.start_lsn) == Lsn.parse(record.created_lsn):
                return manifest
    return None


def check_sync_arguments(slot: str, publications: Sequence[str], root: StagingPath, pipeline: str) -> list[str]:
    """Validate what every snapshot or pull run is given; returns the publications as a list."""
    validation.check_slot_name(slot)
    validation.check_pipeline_name(pipeline)
    validation.check_staging_root(root)
    return validation.check_identifiers(publications, "publication")


def source_identity(hook) -> dict:
    """Which database the pipeline reads, for the owner of its Iceberg tables (``pglogical.owner``):
    the cluster's ``system_identifier`` (None where ``pg_control_system()`` is not granted), the
    database's name and OID. Two clusters, or two databases of one, never share it."""
    with hook.autocommit_cursor() as cursor:
        cursor.execute("SELECT current_database(), (SELECT oid FROM pg_database WHERE datname = current_database()),"
                       " has_function_privilege('pg_control_system()', 'EXECUTE')")
        database, oid, allowed = cursor.fetchone()
        system = None
        if allowed:
            cursor.execute("SELECT system_identifier::text FROM pg_control_system()")
            system = cursor.fetchone()[0]
    return {"system_identifier": system, "database": database, "database_oid": int(oid)}


def _claim_existing_slot(hook, existing, record: PipelineRecord | None, slot: str, pipeline: str,
                         report: Callable[[str], None]) -> None:
    """Drop ``existing`` only when the pipeline's record proves it created it and nothing consumed it."""
    if existing.active:
        raise SlotError(
            f"replication slot {slot!r} is in use by an active consumer (pid {existing.active_pid}): "
            "choose another slot name, or stop that consumer. Nothing was changed"
        )
    live = (f"slot {slot!r} (plugin {existing.plugin}, database {existing.database}, confirmed up to "
            f"{existing.confirmed_flush_lsn})")
    if record is None or record.slot != slot:
        raise SlotError(
            f"replication slot {slot!r} exists but pipeline {pipeline!r} did not create it ({live}; the pipeline "
            f"has {'no record of a slot' if record is None else 'a record of slot ' + repr(record.slot)}): it may "
            "belong to another consumer, so it is left alone. Choose another slot name, or drop that slot "
            "yourself (PgLogicalHook.drop_slot) if you know it is unused. Nothing was changed", permanent=True,
        )
    if not record.created(existing):
        raise SlotError(
            f"replication slot {slot!r} is not the one pipeline {pipeline!r} created: the pipeline created it with "
            f"plugin {record.plugin} in database {record.database} at {record.created_lsn}, the live one is {live}. "
            "It was dropped and re-created by someone else, or consumed meanwhile, so it is left alone. Choose "
            "another slot name, or drop that slot yourself if you know it is unused. Nothing was changed",
            permanent=True,
        )
    report(f"slot {slot} was created by an earlier attempt of pipeline {pipeline} that died before committing "
           f"its snapshot (created at {record.created_lsn}, never consumed): recreating it")
    connector.drop_slot(hook, slot)


def run_initial_sync(
    hook: Connector, *, slot: str, publications: Sequence[str], root: StagingPath, pipeline: str, parallelism: int = 2,
    type_overrides: Mapping[str, str] | None = None, report: Callable[[str], None] = log.info,
    lock_wait_seconds: float = 60.0, failover: bool = False, copier: Copier | None = None, append_only: bool = False,
) -> dict:
    """Create ``slot`` and stage a snapshot batch of everything ``publications`` publish.

    ``failover=True`` (PostgreSQL 17+) creates the slot with ``FAILOVER``, so a standby that syncs
    slots keeps it across a promotion; refused before anything is created on 15/16 or when the
    primary's ``synchronized_standby_slots`` is empty (see :func:`health.failover_problems`).

    Re-running is safe: when this pipeline's snapshot batch for ``slot`` is committed already it
    is returned as is; when an earlier attempt died before committing, the slot it provably
    created (see :mod:`.pipeline_record`) is recreated. A slot the pipeline cannot prove it
    created is never dropped. All checks run before the slot is created, and a copy that fails
    drops the slot it made. ``copier`` runs the copy's work units elsewhere (on Spark:
    ``operators/spark_copy.py``) while this call holds the session that exported the snapshot.
    A publication that does not publish updates and deletes is refused before the slot exists,
    unless ``append_only`` (``capture/published_changes.py``).
    """
    publications = check_sync_arguments(slot, publications, root, pipeline)
    validation.check_count(parallelism, "parallelism")
    with slot_consumer_lock(hook.connect_kwargs(), slot, "initial sync", lock_wait_seconds):
        tables = require_tables(connector.published_tables(hook, publications), publications)
        record = read_record(root, pipeline)
        if record is not None and record.slot != slot:
            raise PipelineStateError(
                f"pipeline {pipeline!r} was set up with slot {record.slot!r}, not {slot!r}: pass slot={record.slot!r}, "
                "or use another pipeline name for a second pipeline. Nothing was changed"
            )
        if record is not None and record.state != STREAMING and unfinished_chunked_load(root, pipeline, record):
            raise PipelineStateError(
                f"pipeline {pipeline!r} has an unfinished chunked load of slot {slot!r}: re-run the initial sync with "
                "snapshot_mode='chunked' to resume it (nothing staged is copied again), or drop the slot and the "
                "pipeline's staging to start over with an exported snapshot. Nothing was changed")
        done = _initial_snapshot_batch(root, pipeline, slot, record)
        existing_slot = connector.get_slot(hook, slot)
        if done is not None and existing_slot is not None and existing_slot.invalidated:
            raise SlotLostError(lost_slot_message(
                slot, pipeline, f"was invalidated ({slots.invalidation_cause(existing_slot)})"))
        if done is not None and existing_slot is not None:
            if record is not None and record.state != STREAMING:
                record.state, record.snapshot_batch = STREAMING, done.name
                write_record(root, pipeline, record)
            report(f"initial sync of slot {slot} is committed already as batch {done.name}; nothing to do")
            return snapshot_result(root, done)
        if done is not None:
            raise SlotLostError(lost_slot_message(slot, pipeline, "no longer exists"))
        with hook.autocommit_cursor() as cursor:  # what would stop replication, found before a slot exists
            problems = health.find_publisher_problems(cursor, publications, replica_identity=False)
            if failover:
                problems += health.failover_problems(cursor)
        problems += published_changes.publish_problems(tables, append_only)
        if problems:
            raise PublisherCheckError(problems)
        if existing_slot is not None:
            _claim_existing_slot(hook, existing_slot, record, slot, pipeline, report)
        return _snapshot_into_new_slot(hook, slot, publications, tables, root, pipeline, parallelism, report,
                                       type_overrides=type_overrides, failover=failover, copier=copier)


def unfinished_chunked_load(root: StagingPath, pipeline: str, record: PipelineRecord) -> bool:
    """Whether the pipeline's slot is being loaded in chunks (``capture/chunked/``), not yet complete."""
    from airflow_provider_pglogical.capture.chunked.progress import read_load  # the chunked load imports this module

    load = read_load(root, pipeline)
    return load is not None and load.slot == record.slot and load.created_lsn == record.created_lsn \
        and not load.complete


def lost_slot_message(slot: str, pipeline: str, what: str) -> str:
    return (
        f"replication slot {slot!r} of pipeline {pipeline!r} {what}: the changes since the pipeline's last batch "
        "are gone for it, and retrying cannot bring them back. Resync: run the pull with on_slot_lost='resync' "
        "(PgSlotPullOperator(on_slot_lost='resync')), which recreates the slot and re-snapshots every table of "
        "the pipeline, replacing the lakehouse tables at the new snapshot. Nothing was changed"
    )


def resync(hook: Connector, record: PipelineRecord, publications: list[str], root: StagingPath, pipeline: str,
           report: Callable[[str], None], parallelism: int = 2,
           type_overrides: Mapping[str, str] | None = None) -> dict:
    """Recreate the pipeline's lost slot and re-snapshot every published table at its new position.

    The caller holds the slot's consumer lock. An invalidated slot is dropped only when it has the
    plugin and database the record names; the apply replaces each table at the new snapshot (a
    later full snapshot supersedes everything before it).
    """
    slot = record.slot
    existing = connector.get_slot(hook, slot)
    if existing is not None:
        if not existing.invalidated or existing.plugin != record.plugin or existing.database != record.database:
            raise SlotError(
                f"replication slot {slot!r} exists and is not pipeline {pipeline!r}'s lost slot (wal_status "
                f"{existing.wal_status}, plugin {existing.plugin}, database {existing.database}): a resync replaces "
                "only an invalidated slot of the pipeline. Nothing was changed"
            )
        report(f"dropping the invalidated slot {slot} (wal_status = lost) to resync pipeline {pipeline}")
        connector.drop_slot(hook, slot)
    tables = require_tables(connector.published_tables(hook, publications), publications)
    report(f"resyncing pipeline {pipeline}: new slot {slot}, new snapshot of {len(tables)} table(s)")
    return _snapshot_into_new_slot(hook, slot, publications, tables, root, pipeline, parallelism, report,
                                   resync=True, type_overrides=type_overrides)


def _snapshot_into_new_slot(hook, slot: str, publications: list[str], tables: list[ResolvedTable],
                            root: StagingPath, pipeline: str, parallelism: int,
                            report: Callable[[str], None], resync: bool = False,
                            type_overrides: Mapping[str, str] | None = None, failover: bool = False,
                            copier: Copier | None = None) -> dict:
    identity = source_identity(hook)
    created = False
    try:
        with connector.exported_snapshot(hook, slot, failover=failover) as snapshot:
            created = True
            lsn = str(snapshot.consistent_lsn)
            record = PipelineRecord(slot=slot, plugin=snapshot.plugin, database=identity["database"], created_lsn=lsn,
                                    publications=list(publications),
                                    tables={t.qualified_name: t.oid for t in tables},
                                    extra={SOURCE_IDENTITY: identity})
            write_record(root, pipeline, record)
            manifest = BatchManifest(
                pipeline=pipeline, kind="snapshot", start_lsn=lsn, end_lsn=lsn,
                details={"initial": True, "slot": slot, "publications": list(publications), "resync": resync},
            )
            writer = BatchWriter(root, manifest)
            copy_tables(hook.connect_kwargs(), snapshot.snapshot_name, tables, writer, parallelism=parallelism,
                        type_overrides=type_overrides, report=report, copier=copier)
            writer.commit()
    except BaseException:
        if created:
            _drop_own_slot(hook, slot)
        raise
    record.state, record.snapshot_batch = STREAMING, manifest.name
    ddl.record_snapshot(record, manifest)
    write_record(root, pipeline, record)
    return snapshot_result(root, manifest)


def _drop_own_slot(hook, slot: str) -> None:
    """The copy failed: the slot this run created must not stay behind pinning WAL."""
    try:
        connector.drop_slot(hook, slot)
        log.warning("the initial sync failed; dropped the slot %s it had created", slot)
    except Exception as err:  # the original error matters more; say what remains
        log.error("the initial sync failed and could not drop the slot %s it created (%s): drop it by hand",
                  slot, err)


def snapshot_result(root: StagingPath, manifest: BatchManifest) -> dict:
    """What an operator returns to XCom: small, never row data."""
    return {
        "batch": str(root / manifest.pipeline / manifest.name),
        "lsn": manifest.start_lsn,
        "tables": {name: table.rows for name, table in manifest.tables.items()},
    }
