"""Incremental pull: bounded peek of the slot → decode → one committed change batch → advance.

Exactly once: the slot is advanced only after the batch's manifest is committed (invariant 2),
and a run first looks for a committed batch that starts at the slot's position (a run that died
between commit and advance) and only advances past it, staging nothing twice. Batches end on
transaction boundaries (``upto_nchanges`` never splits a transaction; invariant 4). Reading and
decoding the window is :mod:`.peek`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Sequence

import psycopg2

from airflow_provider_pglogical.management import connector, slots
from airflow_provider_pglogical.management.connector import Connector
from airflow_provider_pglogical.exceptions import InvalidInputError, PipelineStateError, SlotError, SlotLostError
from airflow_provider_pglogical.decoding import staged_tables
from airflow_provider_pglogical.decoding import columnar
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.capture import ddl, published_changes, toast
from airflow_provider_pglogical.capture.backfill import published_by_name, snapshot_tables
from airflow_provider_pglogical.management.consumer_lock import slot_consumer_lock
from airflow_provider_pglogical.capture.initial_sync import check_sync_arguments, lost_slot_message, resync
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.capture.peek import peek_window
from airflow_provider_pglogical.decoding.window import DecodedWindow
from airflow_provider_pglogical.staging.pipeline_record import (
    PipelineRecord,
    read_record,
    record_staged,
    require_streaming,
    write_record,
)
from airflow_provider_pglogical.management.slots import advance_slot, assert_slot_usable, require_logical_wal
from airflow_provider_pglogical.staging import private_files, values
from airflow_provider_pglogical.staging.layout import BatchManifest, Column, StagingPath, TableManifest
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.change_facts import change_facts
from airflow_provider_pglogical.management.validation import check_count
from airflow_provider_pglogical.management.published import require_publications

log = logging.getLogger(__name__)


def find_staged(root: StagingPath, pipeline: str, position: Lsn,
                batches: list[tuple[str, Lsn, Lsn, str]] | None = None) -> tuple[str, Lsn] | None:
    """A committed change batch that covers ``position`` (a run died before advancing past it)."""
    for name, start, end, kind in layout.committed_batches(root, pipeline) if batches is None else batches:
        if kind == "changes" and start <= position < end:
            return name, end
    return None


def previous_end(root: StagingPath, pipeline: str, batches: list[tuple[str, Lsn, Lsn, str]], position: Lsn) -> Lsn:
    """Where the pipeline's chain of change batches ends, for the next batch (at ``position``) to
    record as its ``previous_end`` (invariant 12): the end of the newest committed change batch, or
    of the newest one the pipeline's record knows of, or the slot's creation (initial sync or
    resync), whichever is latest. Between there and ``position`` the slot decoded nothing (empty
    windows advance it without a batch)."""
    ends = [end for _name, _start, end, kind in batches if kind == "changes"]
    record = read_record(root, pipeline)
    if record is not None:
        ends.append(Lsn.parse(record.created_lsn))
        if record.staged_through:
            ends.append(Lsn.parse(record.staged_through))
    return min(max(ends, default=position), position)


def run_pull(
    hook: Connector, *, slot: str, publications: Sequence[str], root: StagingPath, pipeline: str, max_changes: int = 200_000,
    max_bytes: int | None = None, report: Callable[[str], None] = log.info,
    before_advance: Callable[[str], None] | None = None, lock_wait_seconds: float = 60.0,
    new_tables: str = "snapshot", on_slot_lost: str = "fail", type_overrides: Mapping[str, str] | None = None,
    on_ddl: str = "snapshot", streaming: bool = False, append_only: bool = False, orphaned_tables: str = "mark",
) -> dict:
    """Stage the slot's next window of changes as one batch, then advance the slot past it.

    Refuses (changing nothing) before the pipeline's initial snapshot is committed, and when the
    slot or the publications differ from the pipeline's record. Holds the slot's consumer lock
    from the peek to the advance, so concurrent runs never stage overlapping batches.

    :param max_changes: ``upto_nchanges`` of the peek: decoded messages per batch (a larger
        transaction still comes whole).
    :param max_bytes: stop reading (at a transaction boundary) once this many bytes were decoded.
    :param before_advance: test hook, called with the batch path between commit and advance.
    :param lock_wait_seconds: how long to wait for another run of the slot before failing.
    :param new_tables: what to do with changes of a table the pipeline never snapshotted (added to a
        publication later): ``"snapshot"`` it first (a backfill ordered before its changes), or
        ``"fail"`` naming the backfill to run. Either way it is never applied as a partial table.
    :param on_slot_lost: when the pipeline's slot was invalidated or dropped: ``"fail"`` (default) with
        :class:`SlotLostError`, or ``"resync"``: recreate the slot and re-snapshot every table.
    :param type_overrides: ``{"schema.table.column": "string"}``: stage these columns as PostgreSQL's
        text (docs/types.md); the same mapping as the pipeline's initial sync and backfills.
    :param on_ddl: DDL the lakehouse cannot follow exactly (``capture/ddl.py``: a re-created table, a
        column added with a default, a type change Iceberg cannot promote, a renamed enum label):
        ``"snapshot"`` the table again (the apply replaces its Iceberg table), or ``"fail"`` naming
        the backfill to run. Renamed tables and columns, dropped and added columns are followed.
    :param streaming: have PostgreSQL stream transactions larger than ``logical_decoding_work_mem``
        while they run instead of spilling them to disk (``capture/peek.py``); the batch still holds
        exactly the committed changes.
    :param append_only: accept publications that do not publish updates and deletes (the lakehouse
        keeps rows the source updated or deleted); otherwise such a publication stops the pull.
    :param orphaned_tables: a table whose rows a ``publish_via_partition_root`` flip moved to another
        table: ``"mark"`` its Iceberg table (property ``pglogical.orphaned``) or ``"drop"`` it.
    """
    if on_slot_lost not in SLOT_LOST_POLICIES:
        raise InvalidInputError(f"on_slot_lost must be one of {SLOT_LOST_POLICIES}, not {on_slot_lost!r}")
    if new_tables not in NEW_TABLE_POLICIES:
        raise InvalidInputError(f"new_tables must be one of {NEW_TABLE_POLICIES}, not {new_tables!r}")
    policy = published_changes.SourceChangePolicy(on_ddl, append_only, orphaned_tables)
    publications = check_sync_arguments(slot, publications, root, pipeline)
    max_changes = check_count(max_changes, "max_changes")
    max_bytes = check_count(max_bytes, "max_bytes", optional=True)
    with hook.autocommit_cursor() as cursor:
        require_logical_wal(cursor)
    record = require_streaming(root, pipeline, publications, "pull", slot=slot)
    with hook.autocommit_cursor() as cursor:
        require_publications(cursor, publications, slot, pipeline)
    with slot_consumer_lock(hook.connect_kwargs(), slot, "pull", lock_wait_seconds):
        lost = _lost(hook, record)
        if lost is not None:
            if on_slot_lost == "fail":
                raise SlotLostError(lost_slot_message(slot, pipeline, lost))
            result = resync(hook, record, publications, root, pipeline, report, type_overrides=type_overrides)
            return {"batch": result["batch"], "start_lsn": result["lsn"], "end_lsn": result["lsn"],
                    "advanced_to": result["lsn"], "tables": result["tables"], "transactions": 0, "changes": 0,
                    "recovered": False, "resynced": True}
        try:
            return _pull_locked(hook, record, publications, root, pipeline, max_changes, max_bytes, report,
                                before_advance, new_tables, type_overrides, policy, streaming)
        except OSError as err:
            if private_files.out_of_space(err):
                raise private_files.staging_full(root / pipeline, f"pull {slot} staged a batch") from err
            raise


SLOT_LOST_POLICIES = ("fail", "resync")


def _lost(hook, record: PipelineRecord) -> str | None:
    """Why the pipeline's slot is lost ("was invalidated …", "no longer exists"), or None."""
    slot = connector.get_slot(hook, record.slot)
    if slot is None:
        return "no longer exists"
    if slot.invalidated:
        return f"was invalidated ({slots.invalidation_cause(slot)})"
    return None


def _pull_locked(hook, record: PipelineRecord, publications: list[str], root: StagingPath, pipeline: str,
                 max_changes: int, max_bytes: int | None, report: Callable[[str], None],
                 before_advance: Callable[[str], None] | None, new_tables: str,
                 type_overrides: Mapping[str, str] | None, policy: published_changes.SourceChangePolicy,
                 streaming: bool = False) -> dict:
    started = time.monotonic()
    slot = record.slot
    with hook.autocommit_cursor() as cursor:
        slot_info = assert_slot_usable(cursor, slot)
        position = slot_info.confirmed_flush_lsn
        batches = layout.committed_batches(root, pipeline)
        staged = find_staged(root, pipeline, position, batches)
        if staged is not None:
            name, end = staged
            record_staged(root, pipeline, end)
            advance_slot(cursor, slot, end)
            report(f"batch {name} was committed by an earlier run that died before advancing the slot; "
                   f"advanced {slot} to {end}, staged nothing new")
            return _pull_result(root, layout.read_manifest(root, pipeline, name), recovered=True, advanced_to=end)
        cursor.execute("SELECT pg_current_wal_flush_lsn()::text")
        upto = Lsn.parse(cursor.fetchone()[0])

    try:
        window = peek_window(hook.connect_kwargs(), slot, publications, upto, max_changes, max_bytes,
                             streaming=streaming)
    except psycopg2.errors.UndefinedObject:
        with hook.autocommit_cursor() as cursor:  # dropped after the check: say so, not the driver's words
            require_publications(cursor, publications, slot, pipeline)
        raise
    with hook.autocommit_cursor() as cursor:  # PostgreSQL 18 skips a dropped one: refuse before staging
        require_publications(cursor, publications, slot, pipeline)
    if window.limited or window.held_back:
        end = Lsn(window.last_end_lsn) if window.transaction_count else position
    else:
        end = max(upto, position)

    followed = _follow_ddl(hook, record, window, publications, root, pipeline, position, end, policy, report,
                           type_overrides)
    if not window.transaction_count:
        with hook.autocommit_cursor() as cursor:
            moved = advance_slot(cursor, slot, end) if end > position else position
        report(f"no changes in [{position}, {upto}); slot {slot} advanced to {moved}")
        return {"batch": None, "start_lsn": str(position), "end_lsn": str(moved), "advanced_to": str(moved),
                "tables": {}, "transactions": 0, "changes": 0, "recovered": False, **followed.summary}

    _snapshot_new_tables(hook, record, window, publications, root, pipeline, new_tables, report, type_overrides)
    manifest = stage_batch(hook, root, pipeline, position, end, window, type_overrides, followed,
                           previous=previous_end(root, pipeline, batches, position))
    staged = set(window.tables)
    kept = {key: entry for key, entry in followed.relations.items()
            if int(key) in staged or key not in record.relations}
    if kept:  # only now that the batch holds the renames and drops: a crash before re-detects them
        record.relations.update(kept)
        write_record(root, pipeline, record)
    record_staged(root, pipeline, end)  # after write_record: it only moves staged_through forward
    path = str(root / pipeline / manifest.name)
    if before_advance is not None:
        before_advance(path)
    with hook.autocommit_cursor() as cursor:
        advanced = advance_slot(cursor, slot, end)
    seconds = time.monotonic() - started
    report(f"staged {sum(t.rows for t in manifest.tables.values()):,} change rows of {window.transaction_count:,} "
           f"transactions in {seconds:.1f}s as {manifest.name}; slot {slot} advanced to {advanced}")
    return {**_pull_result(root, manifest, recovered=False, advanced_to=advanced), **followed.summary}


NEW_TABLE_POLICIES = ("snapshot", "fail")


def _snapshot_new_tables(hook, record: PipelineRecord, window: DecodedWindow, publications: list[str],
                         root: StagingPath, pipeline: str, policy: str, report: Callable[[str], None],
                         type_overrides: Mapping[str, str] | None = None) -> None:
    """Give tables the pipeline never snapshotted a snapshot batch before their changes are staged.

    The snapshot is taken now, after the window was decoded, so it sits at an LSN past every
    change of the window: the apply replaces the table at that LSN and ignores older changes of
    it. It is committed before the change batch, so no apply ever sees the changes alone. A table
    that is no longer published (added and removed again) has its changes dropped: it was never
    part of the pipeline.
    """
    unknown = {oid: t.relation.qualified_name for oid, t in window.tables.items()
               if not record.knows(oid, t.relation.qualified_name)}
    if not unknown:
        return
    names = sorted(set(unknown.values()))
    if policy == "fail":
        raise PipelineStateError(
            f"table(s) {', '.join(names)} have changes in slot {record.slot!r} but pipeline {pipeline!r} never "
            "snapshotted them (added to a publication after the initial sync); applying the changes alone would "
            f"give partial tables. Run a backfill of them (PgBackfillOperator(tables={names})), or pull with "
            "new_tables='snapshot'. Nothing was changed"
        )
    published_now = {t.qualified_name for t in connector.published_tables(hook, publications)}
    gone = [oid for oid, name in unknown.items() if name not in published_now]
    for oid in gone:
        log.warning("dropping the changes of %s: it is no longer published and the pipeline never snapshotted it",
                    unknown[oid])
        window.tables.pop(oid)
    added = sorted({name for oid, name in unknown.items() if oid not in gone})
    if added:
        report(f"table(s) {', '.join(added)} joined the publications after the pipeline's snapshot: "
               "snapshotting them before their changes are staged")
        snapshot_tables(hook, record, published_by_name(hook, publications, added), root, pipeline, parallelism=1,
                        report=report, reason="added to a publication", type_overrides=type_overrides)


def stage_batch(hook, root: StagingPath, pipeline: str, start: Lsn, end: Lsn, window: DecodedWindow,
                type_overrides: Mapping[str, str] | None = None, followed: ddl.Review | None = None,
                previous: Lsn | None = None) -> BatchManifest:
    """Build, TOAST-fill and write the batch; the manifest is written last.

    :param followed: the renames and drops the pull's DDL review proved (``capture/ddl.py``).
    :param previous: where the change batch before this one ended (:func:`previous_end`).
    """
    tables = window.tables
    followed = followed or ddl.Review()
    manifest = BatchManifest(pipeline=pipeline, kind="changes", start_lsn=str(start), end_lsn=str(end),
                             previous_end=None if previous is None else str(previous))
    manifest.details = {"transactions": window.transaction_count, "decoded_rows": window.rows,
                        "decoded_bytes": window.bytes}
    manifest.messages = window.messages
    manifest.schema_changes = window.schema_changes
    writer = BatchWriter(root, manifest)
    _clear_uncommitted(writer)
    conn = psycopg2.connect(**hook.connect_kwargs())
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            values.apply_session_settings(cursor)
            types = staged_tables.lookup_types(cursor, staged_tables.relations_of(tables))
            partitioned = _partitioned(cursor, [b.relation.oid for b in tables.values()])
            for oid, batch in tables.items():
                data = batch.build(types, type_overrides)
                rel = batch.relation
                schema, name = followed.identities.get(oid, (rel.namespace, rel.name))
                table = TableManifest(
                    schema=schema, name=name, columns=batch.columns, key=batch.key,
                    replica_identity=rel.replica_identity, keyless=batch.keyless,
                    details={"partitioned": oid in partitioned,
                             "truncated": batch.truncated},
                )
                if oid in followed.identities:
                    table.details[contract.SOURCE_NAME] = rel.qualified_name
                if oid in followed.columns:
                    data, columns = ddl.restage(data, [c.to_dict() for c in table.columns], followed.columns[oid])
                    table.columns = [Column.from_dict(c) for c in columns]
                if oid in followed.evolution:
                    table.details[contract.COLUMN_EVOLUTION] = followed.evolution[oid]
                writer.add_table(table)
                data, fetched = toast.fill_unchanged_toast(cursor, data, table, relation_oid=rel.oid)
                if fetched:
                    table.details["toast_fetch"] = fetched
                table.details[contract.CHANGE_FACTS] = change_facts(data, table.key)
                writer.write_parts(table.qualified_name, data, columnar.WORKERS, columnar.PART_ROWS)
    except BaseException:
        _remove_uncommitted(writer)  # e.g. a value without an exact form: leave no parts behind
        raise
    finally:
        conn.close()
    writer.commit()
    return manifest


def _follow_ddl(hook, record: PipelineRecord, window: DecodedWindow, publications: list[str], root: StagingPath,
                pipeline: str, start: Lsn, end: Lsn, policy: published_changes.SourceChangePolicy,
                report: Callable[[str], None], type_overrides: Mapping[str, str] | None) -> ddl.Review:
    """Compare the window and the catalog with what the pipeline saw of its tables (``capture/ddl.py``,
    ``capture/published_changes.py``).

    Before anything is staged: a table whose DDL or publication change cannot be followed is
    snapshotted again (a batch that replaces its Iceberg table, at an LSN past the window, whose
    changes of it are dropped), or, with ``on_ddl="fail"``, the pull stops naming the backfill,
    with the slot untouched. A publish set without update/delete stops it (unless append-only).
    """
    published = connector.published_tables(hook, publications)
    published_changes.refuse_partial_publish(record, published, policy.append_only, pipeline,
                                             lambda: write_record(root, pipeline, record))
    versions = {oid: table.versions for oid, table in window.tables.items()}
    truncated = {oid for oid, table in window.tables.items() if table.truncated}
    with hook.autocommit_cursor() as cursor:
        found = ddl.catalog_review(cursor, record, published, versions, start, end, truncated)
    if found.refused:
        raise PipelineStateError("; ".join(found.refused) + ". Nothing was changed")
    if found.resnapshot:
        by_oid = {t.oid: t for t in published}
        whys = "; ".join(f"{by_oid[oid].qualified_name}: {why}" for oid, why in sorted(found.resnapshot.items()))
        names = sorted(by_oid[oid].qualified_name for oid in found.resnapshot)
        if policy.on_ddl == "fail":
            raise PipelineStateError(
                f"DDL or a publication change at the source that pipeline {pipeline!r} cannot follow exactly "
                f"({whys}). Run a backfill of them (PgBackfillOperator(tables={names})), which replaces their "
                "Iceberg tables, or pull with on_ddl='snapshot'. Nothing was changed"
            )
        report(f"DDL or a publication change at the source ({whys}): snapshotting {', '.join(names)} again before "
               "staging the changes")
        orphans = published_changes.forget_orphans(record, found.orphaned, policy.orphaned_tables, report)
        found.summary = {"resnapshotted": {by_oid[oid].qualified_name: why for oid, why in found.resnapshot.items()},
                         "orphaned": orphans}
        snapshot_tables(hook, record, [by_oid[oid] for oid in sorted(found.resnapshot)], root, pipeline,
                        parallelism=1, report=report, reason="DDL or a publication change at the source",
                        type_overrides=type_overrides, replace=found.resnapshot)
    for oid in found.superseded:
        window.tables.pop(oid, None)
    return found


def _partitioned(cursor, oids: list[int]) -> set[int]:
    cursor.execute("SELECT oid FROM pg_class WHERE oid = ANY(%s::oid[]) AND relkind = 'p'", (oids,))
    return {r[0] for r in cursor.fetchall()}


def _clear_uncommitted(writer: BatchWriter) -> None:
    """A directory without a manifest is a dead attempt's leftovers: start it afresh."""
    directory = writer.directory
    if directory.exists():
        for child in directory.iterdir():
            child.unlink()


def _remove_uncommitted(writer: BatchWriter) -> None:
    """A failed staging leaves no files behind (the batch has no manifest, so it never existed)."""
    try:
        _clear_uncommitted(writer)
        if writer.directory.exists():
            writer.directory.rmdir()
    except Exception as err:  # noqa: BLE001 - the staging's own error matters more
        log.warning("could not remove the files of the failed batch %s: %s", writer.directory, err)


def _pull_result(root: StagingPath, manifest: BatchManifest, *, recovered: bool, advanced_to: Lsn) -> dict:
    return {
        "batch": str(root / manifest.pipeline / manifest.name),
        "start_lsn": manifest.start_lsn, "end_lsn": manifest.end_lsn, "advanced_to": str(advanced_to),
        "tables": {name: t.rows for name, t in manifest.tables.items()},
        "transactions": manifest.details.get("transactions", 0),
        "changes": sum(t.rows for t in manifest.tables.values()), "recovered": recovered,
    }
