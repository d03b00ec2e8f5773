"""Initial sync and backfill: a snapshot batch positioned exactly where the change stream continues.

Initial sync creates the pipeline's slot with an exported snapshot and copies the published
tables inside that snapshot: the batch sits at the slot's consistent LSN, so the slot's first
change batch continues it with no gap and no overlap. A backfill re-snapshots some tables while
the pipeline keeps flowing: a *temporary* slot gives a fresh snapshot and its consistent LSN C;
the apply job replaces those tables at C and re-applies change rows committed at or after C.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from psycopg2 import sql

from airflow_provider_pglogical.exceptions import (
    PipelineStateError,
    PublicationError,
    PublisherCheckError,
    SlotError,
)
from airflow_provider_pglogical.replication import health, validation
from airflow_provider_pglogical.replication.consumer_lock import slot_consumer_lock
from airflow_provider_pglogical.replication.pipeline_record import (
    STREAMING,
    PipelineRecord,
    read_record,
    write_record,
)
from airflow_provider_pglogical.replication.published import ResolvedTable
from airflow_provider_pglogical.replication.snapshot import copy_tables
from airflow_provider_pglogical.replication.staging import (
    BatchManifest,
    BatchWriter,
    StagingPath,
    committed_batches,
    read_manifest,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyRange:
    """A half-open key range ``[start, end)`` of one column, for a ranged backfill."""

    column: str
    start: Any = None
    end: Any = None

    def where(self) -> sql.Composed:
        parts = []
        if self.start is not None:
            parts.append(sql.SQL("{} >= {}").format(sql.Identifier(self.column), sql.Literal(self.start)))
        if self.end is not None:
            parts.append(sql.SQL("{} < {}").format(sql.Identifier(self.column), sql.Literal(self.end)))
        if not parts:
            raise ValueError(f"key range on {self.column!r} needs a start or an end")
        return sql.SQL(" AND ").join(parts)

    def as_details(self) -> dict:
        return {"column": self.column, "start": self.start, "end": self.end}


def require_tables(tables: list[ResolvedTable], publications: Sequence[str]) -> list[ResolvedTable]:
    if not tables:
        raise PublicationError(
            f"publication(s) {', '.join(publications)} publish no tables: add tables "
            "(PgLogicalHook.add_publication_tables / ALTER PUBLICATION … ADD TABLE) before syncing"
        )
    return tables


def _initial_snapshot_batch(root: StagingPath, pipeline: str, slot: str) -> BatchManifest | None:
    for name, _start, _end, kind in committed_batches(root, pipeline):
        if kind == "snapshot":
            manifest = read_manifest(root, pipeline, name)
            if manifest.details.get("initial") and manifest.details.get("slot") == slot:
                return manifest
    return None


def check_sync_arguments(slot: str, publications: Sequence[str], root: StagingPath, pipeline: str) -> list[str]:
    """Validate what every snapshot or pull run is given; returns the publications as a list."""
    validation.check_slot_name(slot)
    validation.check_pipeline_name(pipeline)
    validation.check_staging_root(root)
    return validation.check_identifiers(publications, "publication")


def require_streaming(root: StagingPath, pipeline: str, publications: Sequence[str], what: str,
                      slot: str | None = None) -> PipelineRecord:
    """The pipeline's record, when its initial snapshot is committed and the arguments match it."""
    record = read_record(root, pipeline)
    where = str(root / pipeline)
    if record is None or record.state != STREAMING:
        raise PipelineStateError(
            f"pipeline {pipeline!r} has no committed initial snapshot under {where} "
            f"({'no pipeline record' if record is None else 'its initial sync has not finished'}), so a {what} "
            "would stage changes with nothing to apply them to: run (or re-run, it resumes) the initial sync "
            "(PgInitialSyncOperator) first. Nothing was changed"
        )
    if slot is not None and record.slot != slot:
        raise PipelineStateError(
            f"pipeline {pipeline!r} consumes slot {record.slot!r}, not {slot!r}: pass slot={record.slot!r}. "
            "Nothing was changed"
        )
    if not record.same_publications(publications):
        added = sorted(set(publications) - set(record.publications))
        missing = sorted(set(record.publications) - set(publications))
        raise PipelineStateError(
            f"pipeline {pipeline!r} was snapshotted from publication(s) {record.publications}, but this {what} "
            f"names {list(publications)} (added: {added or 'none'}; left out: {missing or 'none'}). Decoding with "
            "another set would move the slot past changes the pipeline needs, or apply tables it never "
            f"snapshotted. Pass publications={record.publications}; to replicate more tables, add them to those "
            "publications (ALTER PUBLICATION … ADD TABLE) and run a backfill (PgBackfillOperator) of them. "
            "Nothing was changed"
        )
    return record


def _database(hook) -> str:
    with hook._cursor() as cursor:
        cursor.execute("SELECT current_database()")
        return cursor.fetchone()[0]


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
    hook.drop_slot(slot)


def run_initial_sync(
    hook, *, slot: str, publications: Sequence[str], root: StagingPath, pipeline: str, parallelism: int = 2,
    report: Callable[[str], None] = log.info, lock_wait_seconds: float = 60.0,
) -> dict:
    """Create ``slot`` and stage a snapshot batch of everything ``publications`` publish.

    Re-running is safe: when this pipeline's snapshot batch for ``slot`` is committed already it
    is returned as is; when an earlier attempt died before committing, the slot it provably
    created (see :mod:`.pipeline_record`) is recreated. A slot the pipeline cannot prove it
    created is never dropped. All checks run before the slot is created, and a copy that fails
    drops the slot it made.
    """
    publications = check_sync_arguments(slot, publications, root, pipeline)
    validation.check_count(parallelism, "parallelism")
    with slot_consumer_lock(hook.connect_kwargs(), slot, "initial sync", lock_wait_seconds):
        tables = require_tables(hook.published_tables(publications), publications)
        record = read_record(root, pipeline)
        if record is not None and record.slot != slot:
            raise PipelineStateError(
                f"pipeline {pipeline!r} was set up with slot {record.slot!r}, not {slot!r}: pass slot={record.slot!r}, "
                "or use another pipeline name for a second pipeline. Nothing was changed"
            )
        done = _initial_snapshot_batch(root, pipeline, slot)
        existing_slot = hook.get_slot(slot)
        if done is not None and existing_slot is not None:
            if record is not None and record.state != STREAMING:
                record.state, record.snapshot_batch = STREAMING, done.name
                write_record(root, pipeline, record)
            report(f"initial sync of slot {slot} is committed already as batch {done.name}; nothing to do")
            return _summary(root, done)
        if done is not None:
            raise PipelineStateError(
                f"pipeline {pipeline!r} committed its initial snapshot ({done.name}) but its slot {slot!r} no longer "
                "exists, so the changes since are lost to it: re-sync the pipeline into a new pipeline name (or "
                "remove this pipeline's staging directory and lakehouse tables first). Nothing was changed"
            )
        with hook._cursor() as cursor:  # what would stop replication, found before a slot exists
            problems = health.find_publisher_problems(cursor, publications, replica_identity=False)
        if problems:
            raise PublisherCheckError(problems)
        if existing_slot is not None:
            _claim_existing_slot(hook, existing_slot, record, slot, pipeline, report)
        return _snapshot_into_new_slot(hook, slot, publications, tables, root, pipeline, parallelism, report)


def _snapshot_into_new_slot(hook, slot: str, publications: list[str], tables: list[ResolvedTable],
                            root: StagingPath, pipeline: str, parallelism: int,
                            report: Callable[[str], None]) -> dict:
    database = _database(hook)
    created = False
    try:
        with hook.exported_snapshot(slot) as snapshot:
            created = True
            lsn = str(snapshot.consistent_lsn)
            record = PipelineRecord(slot=slot, plugin=snapshot.plugin, database=database, created_lsn=lsn,
                                    publications=list(publications))
            write_record(root, pipeline, record)
            manifest = BatchManifest(
                pipeline=pipeline, kind="snapshot", start_lsn=lsn, end_lsn=lsn,
                details={"initial": True, "slot": slot, "publications": list(publications)},
            )
            writer = BatchWriter(root, manifest)
            copy_tables(hook.connect_kwargs(), snapshot.snapshot_name, tables, writer, parallelism=parallelism,
                        report=report)
            writer.commit()
    except BaseException:
        if created:
            _drop_own_slot(hook, slot)
        raise
    record.state, record.snapshot_batch = STREAMING, manifest.name
    write_record(root, pipeline, record)
    return _summary(root, manifest)


def _drop_own_slot(hook, slot: str) -> None:
    """The copy failed: the slot this run created must not stay behind pinning WAL."""
    try:
        hook.drop_slot(slot)
        log.warning("the initial sync failed; dropped the slot %s it had created", slot)
    except Exception as err:  # the original error matters more; say what remains
        log.error("the initial sync failed and could not drop the slot %s it created (%s): drop it by hand",
                  slot, err)


def run_backfill(
    hook, *, tables: Sequence[str], publications: Sequence[str], root: StagingPath, pipeline: str,
    key_range: KeyRange | None = None, parallelism: int = 2, report: Callable[[str], None] = log.info,
) -> dict:
    """Re-snapshot ``tables`` (``schema.table``) at a fresh LSN while the pipeline keeps flowing.

    It takes no consumer lock: it reads through a temporary slot of its own, and pulls of the
    pipeline's slot go on meanwhile by design (the apply orders the batches by LSN).
    """
    publications = validation.check_identifiers(publications, "publication")
    validation.check_pipeline_name(pipeline)
    validation.check_staging_root(root)
    validation.check_count(parallelism, "parallelism")
    require_streaming(root, pipeline, publications, "backfill")
    published = {t.qualified_name: t for t in require_tables(hook.published_tables(publications), publications)}
    wanted = [name if "." in name else f"public.{name}" for name in tables]
    unknown = [name for name in wanted if name not in published]
    if unknown:
        raise PublicationError(
            f"table(s) {', '.join(unknown)} are not published by {', '.join(publications)}: published are "
            f"{', '.join(sorted(published))}"
        )
    chosen = [published[name] for name in wanted]
    if key_range is not None:
        for table in chosen:
            if key_range.column not in table.column_names:
                raise PublicationError(
                    f"key range column {key_range.column!r} is not a published column of {table.qualified_name}"
                )
    extra = None
    if key_range is not None:
        with hook._cursor() as cursor:
            text = key_range.where().as_string(cursor)
        extra = {table.qualified_name: text for table in chosen}
    temporary_slot = f"pglogical_backfill_{uuid.uuid4().hex[:12]}"
    with hook.exported_snapshot(temporary_slot, temporary=True) as snapshot:
        lsn = str(snapshot.consistent_lsn)
        manifest = BatchManifest(
            pipeline=pipeline, kind="snapshot", start_lsn=lsn, end_lsn=lsn,
            details={"backfill": True, "key_range": key_range.as_details() if key_range else None,
                     "publications": list(publications)},
        )
        writer = BatchWriter(root, manifest)
        copy_tables(hook.connect_kwargs(), snapshot.snapshot_name, chosen, writer, parallelism=parallelism,
                    extra_where=extra, report=report)
        writer.commit()
    return _summary(root, manifest)


def _summary(root: StagingPath, manifest: BatchManifest) -> dict:
    """What an operator returns to XCom: small, never row data."""
    return {
        "batch": str(root / manifest.pipeline / manifest.name),
        "lsn": manifest.start_lsn,
        "tables": {name: table.rows for name, table in manifest.tables.items()},
    }
