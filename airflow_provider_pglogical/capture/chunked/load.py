"""The chunked initial sync: a slot without an exported snapshot, then every table in key chunks
(or whole, in a temporary slot's exported snapshot, when it has no key a chunk can be a range of).

1. Under the slot's consumer lock, every check runs first (a load whose whole tables could not get
   a temporary slot is refused, ``plan.py``), then the slot is created with
   ``pg_create_logical_replication_slot`` (no snapshot is exported or held) at its consistent LSN
   ``C``, and an *empty* full snapshot batch of every table is committed at ``C``: the lakehouse
   tables start empty at ``C`` and the slot's changes from ``C`` continue them.
2. Each table is read in chunks (``chunks.py``); each chunk is a ranged snapshot batch at its low
   watermark, which replaces its key range and re-applies the changes from there. The ranges tile
   the key space, so once every chunk is staged every row of the table is the source's. A table
   without such a key (a keyless multiset, ``plan.whole_reason``) is staged whole instead, as one
   snapshot batch at the consistent LSN of a temporary slot's exported snapshot (``whole.py``):
   the primary's xmin is held for that table's copy only.
3. The progress record (``progress.py``) is written after each chunk; a re-run with the same slot
   resumes at the first chunk not staged. When every table is done the pipeline record moves to
   ``streaming`` and pulls may start (until then they are refused, as during an exported copy).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Mapping, Sequence

import pyarrow as pa

from airflow_provider_pglogical.capture import ddl, published_changes, snapshot
from airflow_provider_pglogical.capture.chunked import plan
from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks, ChunkReader, TableSpec
from airflow_provider_pglogical.capture.chunked.whole import copy_whole
from airflow_provider_pglogical.capture.chunked.progress import (
    CHUNK_DETAILS, LoadRecord, Reporter, TableProgress, catch_up_with_staging, read_load, remove_unfinished_chunks,
    write_load,
)
from airflow_provider_pglogical.capture.initial_sync import (
    _claim_existing_slot, _initial_snapshot_batch, check_sync_arguments, lost_slot_message, require_tables,
    snapshot_result, source_identity,
)
from airflow_provider_pglogical.exceptions import PipelineStateError, PublisherCheckError, SlotLostError
from airflow_provider_pglogical.management import connector, health, validation
from airflow_provider_pglogical.management.consumer_lock import slot_consumer_lock
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.contract import SOURCE_IDENTITY, table_key
from airflow_provider_pglogical.staging.layout import BatchManifest, StagingPath, TableManifest, read_manifest
from airflow_provider_pglogical.staging.pipeline_record import STREAMING, PipelineRecord, read_record, write_record

log = logging.getLogger(__name__)

DEFAULT_CHUNK_ROWS = 100_000


def run_chunked_sync(
    hook, *, slot: str, publications: Sequence[str], root: StagingPath, pipeline: str,
    chunk_rows: int = DEFAULT_CHUNK_ROWS, type_overrides: Mapping[str, str] | None = None,
    report: Callable[[str], None] = log.info, lock_wait_seconds: float = 60.0, writer_wait_seconds: float = 600.0,
    append_only: bool = False, hooks: ChunkHooks | None = None,
) -> dict:
    """Create ``slot`` and stage every published table in chunks of about ``chunk_rows`` rows, or
    resume the pipeline's unfinished chunked load of ``slot``. Returns what the exported sync returns.

    :param writer_wait_seconds: how long a chunk waits for the transactions writing its table when
        its low watermark is written (``watermarks.py``) before the load fails (resumably).
    """
    publications = check_sync_arguments(slot, publications, root, pipeline)
    validation.check_count(chunk_rows, "chunk_rows")
    with slot_consumer_lock(hook.connect_kwargs(), slot, "initial sync", lock_wait_seconds):
        tables = require_tables(connector.published_tables(hook, publications), publications)
        with hook.autocommit_cursor() as cursor:
            planned = plan.plan_tables(cursor, tables)  # in key chunks, or whole (and why)
        record = read_record(root, pipeline)
        if record is not None and record.slot != slot:
            raise PipelineStateError(
                f"pipeline {pipeline!r} was set up with slot {record.slot!r}, not {slot!r}: pass slot={record.slot!r}, "
                "or use another pipeline name for a second pipeline. Nothing was changed")
        load = read_load(root, pipeline)
        existing = connector.get_slot(hook, slot)
        ours = load is not None and record is not None and load.slot == slot and load.created_lsn == record.created_lsn
        if ours and load.complete:
            report(f"the chunked load of slot {slot} is complete already; nothing to do")
            done = _initial_snapshot_batch(root, pipeline, slot, record)  # kept by retention when applied
            result = snapshot_result(root, done) if done is not None else {"batch": None, "lsn": record.created_lsn}
            return {**result, "tables": {name: t.rows for name, t in load.tables.items()}}
        with hook.autocommit_cursor() as cursor:  # a whole table's temporary slot: refused here if no room
            plan.check_temporary_slot_room(cursor, planned, creating=existing is None)
        if not ours:
            done = _initial_snapshot_batch(root, pipeline, slot, record)
            if done is not None and existing is not None and record is not None and record.state == STREAMING:
                report(f"initial sync of slot {slot} is committed already as batch {done.name}; nothing to do")
                return snapshot_result(root, done)
            with hook.autocommit_cursor() as cursor:
                problems = health.find_publisher_problems(cursor, publications, replica_identity=False)
            problems += published_changes.publish_problems(tables, append_only)
            if problems:
                raise PublisherCheckError(problems)
            if existing is not None:
                _claim_existing_slot(hook, existing, record, slot, pipeline, report)
            record, load = _start(hook, slot, publications, tables, root, pipeline, chunk_rows, type_overrides)
            report(f"created slot {slot} at {record.created_lsn} (no exported snapshot); loading "
                   f"{sum(not t.whole for t in planned)} table(s) in chunks of about {chunk_rows:,} rows"
                   + plan.whole_tables_line(planned))
        else:
            if existing is None or existing.invalidated or not record.created(existing):
                raise SlotLostError(lost_slot_message(slot, pipeline, "is gone, invalidated or consumed during its "
                                                      "chunked load"))
            _check_same_tables(load, planned, pipeline)
            caught = catch_up_with_staging(root, pipeline, load)
            unfinished = remove_unfinished_chunks(root, pipeline, load)
            report(f"resuming the chunked load of slot {slot}: {load.chunks:,} chunk(s) and {load.rows:,} rows are "
                   f"staged already ({caught} found committed after the last progress record); nothing of them is "
                   f"copied again"
                   + (f"; removed the uncommitted chunk(s) {', '.join(unfinished)}" if unfinished else "")
                   + plan.whole_tables_line([t for t in planned if not load.tables[t.name].done]))
        initial = read_manifest(root, pipeline, record.snapshot_batch)
        _load_tables(hook, planned, initial, load, root, pipeline, type_overrides, report, writer_wait_seconds,
                     hooks or ChunkHooks(), publications)
        load.complete = True
        write_load(root, pipeline, load)
        record.state = STREAMING
        ddl.record_snapshot(record, initial)
        write_record(root, pipeline, record)
        whole = sum(bool(t.whole) for t in load.tables.values())
        report(f"chunked load of slot {slot} complete: {load.rows:,} rows in {load.chunks:,} chunks"
               + (f" ({whole} table(s) loaded whole, one chunk each)" if whole else ""))
        result = snapshot_result(root, initial)
        result["tables"] = {name: t.rows for name, t in load.tables.items()}
        return result


def _check_same_tables(load: LoadRecord, planned: list[plan.ChunkedTable], pipeline: str) -> None:
    published = sorted(t.name for t in planned)
    if published != sorted(load.tables):
        raise PipelineStateError(
            f"pipeline {pipeline!r}: the publications now publish {', '.join(published)}, but its unfinished chunked "
            f"load is of {', '.join(sorted(load.tables))}: restore the publications and re-run to finish the load, "
            "or drop the slot and the pipeline's staging to start over. Nothing was changed")


def _start(hook, slot: str, publications: list[str], tables: list[ResolvedTable], root: StagingPath,
           pipeline: str, chunk_rows: int, type_overrides) -> tuple[PipelineRecord, LoadRecord]:
    """Create the slot, record it, commit the empty initial batch at its LSN, then the load record."""
    identity = source_identity(hook)
    with hook.autocommit_cursor() as cursor:
        cursor.execute("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        lsn = cursor.fetchone()[0]
        enums = ddl.enum_labels(cursor, [c.type_oid for t in tables for c in t.columns])
    record = PipelineRecord(slot=slot, plugin="pgoutput", database=identity["database"], created_lsn=lsn,
                            publications=list(publications), tables={t.qualified_name: t.oid for t in tables},
                            extra={SOURCE_IDENTITY: identity})
    write_record(root, pipeline, record)
    manifest = BatchManifest(pipeline=pipeline, kind="snapshot", start_lsn=lsn, end_lsn=lsn, details={
        "initial": True, "slot": slot, "publications": list(publications), "resync": False,
        CHUNK_DETAILS: {"slot": slot, "created_lsn": lsn, "empty_start": True}})
    writer = BatchWriter(root, manifest)
    for table in tables:
        entry = _table_manifest(table, type_overrides)
        entry.details["relation"] = ddl.relation_entry(table, enums, (table.schema, table.name), None)
        writer.add_table(entry)
        mapping = snapshot.column_mapping(table, type_overrides)
        schema = pa.schema([pa.field(name, m.arrow) for name, m in mapping.items()])
        with writer.part_writer(table.qualified_name, schema):
            pass  # an empty part: the table holds no row at C until its chunks replace their ranges
    writer.commit()
    record.snapshot_batch = manifest.name
    write_record(root, pipeline, record)
    load = LoadRecord(slot=slot, created_lsn=lsn, chunk_rows=chunk_rows,
                      tables={t.qualified_name: TableProgress() for t in tables})
    write_load(root, pipeline, load)
    return record, load


def _table_manifest(table: ResolvedTable, type_overrides) -> TableManifest:
    return TableManifest(schema=table.schema, name=table.name, columns=snapshot.manifest_columns(table, type_overrides),
                         key=table.key, replica_identity=table.replica_identity, keyless=table.keyless,
                         details={"row_filter": table.row_filter, "extra_where": None})


def _estimated_rows(hook, planned: list[plan.ChunkedTable]) -> dict[str, int]:
    with hook.autocommit_cursor() as cursor:
        cursor.execute("SELECT oid, greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = ANY(%s::oid[])",
                       ([p.table.oid for p in planned],))
        by_oid = dict(cursor.fetchall())
    return {p.name: int(by_oid.get(p.table.oid, 0)) for p in planned}


def _load_tables(hook, planned: list[plan.ChunkedTable], initial: BatchManifest, load: LoadRecord,
                 root: StagingPath, pipeline: str, type_overrides, report: Callable[[str], None],
                 writer_wait_seconds: float, hooks: ChunkHooks, publications: list[str]) -> None:
    for name, rows in _estimated_rows(hook, planned).items():  # the log's ETA and the pipeline view
        if name in load.tables and load.tables[name].estimated_rows is None:
            load.tables[name].estimated_rows = rows
    reporter = Reporter(load, report)
    details = {"publications": list(publications), "initial": False,
               CHUNK_DETAILS: {"slot": load.slot, "created_lsn": load.created_lsn}}
    reader = ChunkReader(hook.connect_kwargs(), root, pipeline, details, writer_wait_seconds, hooks)
    try:
        for chunked in planned:
            progress = load.tables[chunked.name]
            if progress.done:
                continue
            if chunked.column is not None and progress.column not in (None, chunked.column):
                # its chunks so far are ranges of another column: a whole copy replaces them all, exactly
                chunked = dataclasses.replace(chunked, column=None, whole=(
                    f"its chunk column changed from {progress.column!r} to {chunked.column!r} during the load"))
            if (progress.column, progress.whole) != (chunked.column, chunked.whole):
                progress.column, progress.whole = chunked.column, chunked.whole
                progress.next_start = progress.next_start if chunked.column else None
                write_load(root, pipeline, load)  # how it is loaded, before its first chunk (and the view)
            if chunked.whole:
                rows, _name = copy_whole(hook.connect_kwargs(), chunked, progress.chunks, root, pipeline, details,
                                         reader.pid, hooks, type_overrides, report)
                progress.chunks, progress.rows, progress.done = progress.chunks + 1, rows, True
                write_load(root, pipeline, load)
                reporter.chunk_done(chunked.name, force=True)
                continue
            staged_as = table_key(chunked.table.schema, chunked.table.name)
            base = initial.tables[staged_as]
            spec = TableSpec(chunked, TableManifest(**{**base.__dict__, "files": [], "rows": 0,
                                                       "details": dict(base.details)}),
                             snapshot.column_mapping(chunked.table, type_overrides), staged_as)
            while not progress.done:
                end = reader.boundary(spec, progress.next_start, load.chunk_rows)
                rows, _name = reader.copy(spec, progress.chunks, progress.next_start, end)
                progress.chunks, progress.rows, progress.next_start = progress.chunks + 1, progress.rows + rows, end
                progress.done = end is None
                write_load(root, pipeline, load)
                reporter.chunk_done(chunked.name, force=progress.done)
    finally:
        reader.close()
