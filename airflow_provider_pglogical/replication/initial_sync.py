"""Initial sync and backfill: a snapshot batch positioned exactly where the change stream continues.

Initial sync creates the pipeline's slot with an exported snapshot and copies the published
tables inside that snapshot: the batch sits at the slot's consistent LSN, so the slot's first
change batch continues it with no gap and no overlap. A backfill re-snapshots some tables while
the pipeline keeps flowing: a *temporary* slot gives a fresh snapshot and its consistent LSN C;
the apply job replaces those tables at C and re-applies change rows committed at or after C.
"""

from __future__ import annotations

import contextlib
import json
import logging
import types
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from psycopg2 import sql

from airflow_provider_pglogical.exceptions import PublicationError, SlotError
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

PIPELINE_MARKER = "_pipeline.json"


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


def _marker(root: StagingPath, pipeline: str) -> dict | None:
    path = root / pipeline / PIPELINE_MARKER
    if not path.exists():
        return None
    with path.open("rb") as fh:
        return json.loads(fh.read().decode())


def _write_marker(root: StagingPath, pipeline: str, content: dict) -> None:
    directory = root / pipeline
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (PIPELINE_MARKER + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(json.dumps(content, indent=1).encode())
    tmp.rename(directory / PIPELINE_MARKER)


def _initial_snapshot_batch(root: StagingPath, pipeline: str, slot: str) -> BatchManifest | None:
    for name, _start, _end, kind in committed_batches(root, pipeline):
        if kind == "snapshot":
            manifest = read_manifest(root, pipeline, name)
            if manifest.details.get("initial") and manifest.details.get("slot") == slot:
                return manifest
    return None


def run_initial_sync(
    hook, *, slot: str, publications: Sequence[str], root: StagingPath, pipeline: str, parallelism: int = 2,
    type_overrides: Mapping[str, str] | None = None, report: Callable[[str], None] = log.info,
) -> dict:
    """Create ``slot`` and stage a snapshot batch of everything ``publications`` publish.

    Re-running is safe: when this pipeline's snapshot batch for ``slot`` is committed already it
    is returned as is; when an earlier attempt died before committing, its slot is recreated.
    All checks run before the slot is created.
    """
    tables = require_tables(hook.published_tables(publications), publications)
    existing_slot = hook.get_slot(slot)
    if existing_slot is not None:
        if existing_slot.active:
            raise SlotError(
                f"replication slot {slot!r} is in use by an active consumer (pid {existing_slot.active_pid}): "
                "choose another slot name, or stop that consumer"
            )
        done = _initial_snapshot_batch(root, pipeline, slot)
        if done is not None:
            report(f"initial sync of slot {slot} is committed already as batch {done.name}; nothing to do")
            return _summary(root, done)
        marker = _marker(root, pipeline)
        if not marker or marker.get("slot") != slot:
            raise SlotError(
                f"replication slot {slot!r} exists but pipeline {pipeline!r} did not create it: drop it "
                "(PgLogicalHook.drop_slot) if it is unused, or choose another slot name"
            )
        report(f"slot {slot} exists without a committed snapshot (an earlier attempt died): recreating it")
        hook.drop_slot(slot)
    _write_marker(root, pipeline, {"slot": slot, "publications": list(publications)})
    with _drop_slot_on_failure(hook, slot) as guard, hook.exported_snapshot(slot) as snapshot:
        guard.created = True
        lsn = str(snapshot.consistent_lsn)
        manifest = BatchManifest(
            pipeline=pipeline, kind="snapshot", start_lsn=lsn, end_lsn=lsn,
            details={"initial": True, "slot": slot, "publications": list(publications)},
        )
        writer = BatchWriter(root, manifest)
        copy_tables(hook.connect_kwargs(), snapshot.snapshot_name, tables, writer, parallelism=parallelism,
                    type_overrides=type_overrides, report=report)
        writer.commit()
    return _summary(root, manifest)


def run_backfill(
    hook, *, tables: Sequence[str], publications: Sequence[str], root: StagingPath, pipeline: str,
    key_range: KeyRange | None = None, parallelism: int = 2, type_overrides: Mapping[str, str] | None = None,
    report: Callable[[str], None] = log.info,
) -> dict:
    """Re-snapshot ``tables`` (``schema.table``) at a fresh LSN while the pipeline keeps flowing."""
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
                    extra_where=extra, type_overrides=type_overrides, report=report)
        writer.commit()
    return _summary(root, manifest)


def _summary(root: StagingPath, manifest: BatchManifest) -> dict:
    """What an operator returns to XCom: small, never row data."""
    return {
        "batch": str(root / manifest.pipeline / manifest.name),
        "lsn": manifest.start_lsn,
        "tables": {name: table.rows for name, table in manifest.tables.items()},
    }


@contextlib.contextmanager
def _drop_slot_on_failure(hook, slot: str):
    """Drop ``slot`` when the block fails after creating it (set ``guard.created``), once the
    replication connection holding it closed: an initial sync that committed no snapshot must not
    leave a slot pinning WAL. A slot the block did not create is never touched."""
    guard = types.SimpleNamespace(created=False)
    try:
        yield guard
    except BaseException:
        if guard.created:
            hook.drop_slot(slot)
        raise
