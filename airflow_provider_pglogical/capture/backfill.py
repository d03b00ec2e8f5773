"""Backfill: re-snapshot tables at a fresh LSN while the pipeline's slot keeps flowing.

A *temporary* slot gives a fresh exported snapshot and its consistent LSN C; the snapshot batch
sits at C, and the apply job replaces those tables (or a key range of them) at C and re-applies
change rows committed at or after C. A pull that meets a table the pipeline never snapshotted
(added to a publication later) backfills it the same way before it commits the changes, so the
table is never applied partially.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from psycopg2 import sql

from airflow_provider_pglogical.capture import ddl
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management import connector, slots
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.management.connector import Connector
from airflow_provider_pglogical.exceptions import PipelineStateError, PublicationError
from airflow_provider_pglogical.management import validation
from airflow_provider_pglogical.capture.initial_sync import require_tables, snapshot_result
from airflow_provider_pglogical.staging.contract import override_key
from airflow_provider_pglogical.staging.column_types import decimal_of
from airflow_provider_pglogical.staging.typemap import check_overrides
from airflow_provider_pglogical.staging.pipeline_record import PipelineRecord, require_streaming, write_record
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.capture.snapshot import Copier, copy_tables, remove_parts
from airflow_provider_pglogical.staging.layout import BatchManifest, StagingPath
from airflow_provider_pglogical.staging.batches import BatchWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyRange:
    """A half-open key range ``[start, end)`` of one column, for a ranged backfill."""

    column: str
    start: Any = None
    end: Any = None

    def where(self, text: bool = False) -> sql.Composed:
        """The copy's filter; ``text``: compare in byte order (``COLLATE "C"``), as Spark compares
        strings when the apply replaces the range in the lakehouse."""
        column = sql.Identifier(self.column)
        if text:
            column = sql.SQL('{} COLLATE "C"').format(column)
        parts = []
        if self.start is not None:
            parts.append(sql.SQL("{} >= {}").format(column, sql.Literal(self.start)))
        if self.end is not None:
            parts.append(sql.SQL("{} < {}").format(column, sql.Literal(self.end)))
        if not parts:
            raise ValueError(f"key range on {self.column!r} needs a start or an end")
        return sql.SQL(" AND ").join(parts)

    def as_details(self) -> dict:
        return {"column": self.column, "start": self.start, "end": self.end}


def run_backfill(
    hook: Connector, *, tables: Sequence[str], publications: Sequence[str], root: StagingPath, pipeline: str,
    key_range: KeyRange | None = None, parallelism: int = 2, type_overrides: Mapping[str, str] | None = None,
    report: Callable[[str], None] = log.info, copier: Copier | None = None,
) -> dict:
    """Re-snapshot ``tables`` (``schema.table``) at a fresh LSN while the pipeline keeps flowing.

    It takes no consumer lock: it reads through a temporary slot of its own, and pulls of the
    pipeline's slot go on meanwhile by design (the apply orders the batches by LSN). ``copier``
    runs the copy's work units elsewhere (on Spark: ``operators/spark_copy.py``) while this call
    holds the temporary slot's session.
    """
    publications = validation.check_identifiers(publications, "publication")
    validation.check_pipeline_name(pipeline)
    validation.check_staging_root(root)
    validation.check_count(parallelism, "parallelism")
    record = require_streaming(root, pipeline, publications, "backfill")
    chosen = published_by_name(hook, publications, [name if "." in name else f"public.{name}" for name in tables])
    extra = None
    if key_range is not None:
        extra = {}
        with hook.autocommit_cursor() as cursor:
            for table in chosen:
                text = range_column_is_text(table, key_range.column, type_overrides)
                extra[table.qualified_name] = key_range.where(text).as_string(cursor)
    replace = None
    if key_range is None:  # a table with DDL since the pipeline saw it is replaced whole (capture/ddl.py)
        with hook.autocommit_cursor() as cursor:
            found = ddl.catalog_review(cursor, record, connector.published_tables(hook, publications), {},
                                       Lsn(0), Lsn(0))
        if found.refused:
            raise PipelineStateError("; ".join(found.refused) + ". Nothing was changed")
        wanted = {t.oid for t in chosen}
        replace = {oid: why for oid, why in found.resnapshot.items() if oid in wanted}
        replace.update({oid: "its columns were renamed or dropped" for oid in found.evolution if oid in wanted})
    return snapshot_tables(hook, record, chosen, root, pipeline, key_range=key_range, extra_where=extra,
                           parallelism=parallelism, type_overrides=type_overrides, report=report, replace=replace,
                           copier=copier)


#: column types whose order PostgreSQL and Spark agree on (text-like ones compared in byte order);
#: the apply replaces the range with Spark's comparison, the copy selects it with PostgreSQL's
_ORDERED_TYPES = {"int2", "int4", "int8", "float4", "float8", "date", "timestamp", "timestamptz"}
_TEXT_TYPES = {"text", "varchar"}


def range_column_is_text(table: ResolvedTable, column: str, type_overrides: Mapping[str, str] | None) -> bool:
    """Check that ``column`` can bound a ranged backfill of ``table``; whether it is text.

    A range is selected by PostgreSQL and replaced in the lakehouse by Spark: both must order the
    column alike, or rows would be lost or duplicated at the edges.
    """
    info = next((c for c in table.columns if c.name == column), None)
    if info is None:
        raise PublicationError(f"key range column {column!r} is not a published column of {table.qualified_name}")
    overridden = override_key(table.qualified_name, column) in check_overrides(type_overrides)
    if not overridden and info.element_type is None:
        if info.type in _TEXT_TYPES:
            return True
        if info.type in _ORDERED_TYPES or (info.type == "numeric" and decimal_of(info.formatted)):
            return False
    raise PublicationError(
        f"key range column {column!r} of {table.qualified_name} has type {info.formatted}"
        f"{' (staged as text by type_overrides)' if overridden else ''}, which PostgreSQL and the lakehouse "
        "order differently, so the range could not be replaced exactly: choose an integer, numeric(p,s), "
        "float, date, timestamp or text/varchar column for key_range, or backfill the whole table. Nothing was changed"
    )


def published_by_name(hook, publications: Sequence[str], wanted: Sequence[str]) -> list[ResolvedTable]:
    """The published tables named ``wanted`` (``schema.table``); an error names any that is not."""
    published = {t.qualified_name: t for t in require_tables(connector.published_tables(hook, publications), publications)}
    unknown = [name for name in wanted if name not in published]
    if unknown:
        raise PublicationError(
            f"table(s) {', '.join(unknown)} are not published by {', '.join(publications)}: published are "
            f"{', '.join(sorted(published))}"
        )
    return [published[name] for name in wanted]


def snapshot_tables(
    hook, record: PipelineRecord, tables: list[ResolvedTable], root: StagingPath, pipeline: str, *,
    key_range: KeyRange | None = None, extra_where: dict[str, str] | None = None, parallelism: int = 2,
    report: Callable[[str], None] = log.info, reason: str = "backfill",
    type_overrides: Mapping[str, str] | None = None, replace: Mapping[int, str] | None = None,
    copier: Copier | None = None,
) -> dict:
    """Stage a snapshot batch of ``tables`` at a fresh LSN; a whole-table one joins the record's tables.

    A table is staged under its identity (the name the pipeline first snapshotted it by: a renamed
    table keeps its Iceberg target). ``replace``: table OID -> why the apply must replace the Iceberg
    table itself (DDL it cannot follow), not only its rows.
    """
    identities = {t.qualified_name: tuple(record.relations[str(t.oid)]["identity"]) for t in tables
                  if str(t.oid) in record.relations}
    details = {"backfill": True, "key_range": key_range.as_details() if key_range else None,
               "publications": list(record.publications), "reason": reason}

    def mark_replaced(manifest: BatchManifest, _rows: dict[str, int]) -> None:
        for table in tables:
            if (replace or {}).get(table.oid):
                name = contract.table_key(*identities.get(table.qualified_name, (table.schema, table.name)))
                manifest.tables[name].details[contract.REPLACE_TABLE] = replace[table.oid]

    manifest, _rows = stage_fresh_snapshot(hook.connect_kwargs(), tables, root, pipeline, details,
                                           extra_where=extra_where, parallelism=parallelism,
                                           type_overrides=type_overrides, report=report, identities=identities,
                                           copier=copier, copied=mark_replaced)
    if key_range is None:
        ddl.record_snapshot(record, manifest)
        write_record(root, pipeline, record)
    return snapshot_result(root, manifest)


def stage_fresh_snapshot(
    connect_kwargs: Mapping[str, Any], tables: Sequence[ResolvedTable], root: StagingPath, pipeline: str,
    details: dict, *, slot_prefix: str = "pglogical_backfill", extra_where: Mapping[str, str] | None = None,
    parallelism: int = 2, type_overrides: Mapping[str, str] | None = None, report: Callable[[str], None] = log.info,
    identities: Mapping[str, tuple[str, str]] | None = None, copier: Copier | None = None,
    exported: Callable[[Lsn], None] | None = None,
    copied: Callable[[BatchManifest, dict[str, int]], None] | None = None,
) -> tuple[BatchManifest, dict[str, int]]:
    """Copy ``tables`` in the exported snapshot of a new *temporary* slot and commit them as one
    snapshot batch at its consistent LSN ``C_t`` (what PostgreSQL's own tablesync does per table):
    the snapshot sees exactly the commits before ``C_t``, so the apply replaces the tables at ``C_t``
    and re-applies the changes from there, exactly, keyless tables included. The snapshot (so the
    primary's xmin) is held from the slot's creation to the batch's commit only: the slot is dropped
    when this returns. ``exported``: told ``C_t`` before the copy; ``copied``: called with the
    manifest and the rows per table after the copy, inside the snapshot, before the commit.
    A failure (or ``copied`` raising) leaves no file of the batch behind.
    """
    slot = f"{slot_prefix}_{uuid.uuid4().hex[:12]}"
    with slots.exported_snapshot({**connect_kwargs, "replication": "database"}, slot, temporary=True) as snapshot:
        if exported is not None:
            exported(snapshot.consistent_lsn)
        lsn = str(snapshot.consistent_lsn)
        manifest = BatchManifest(pipeline=pipeline, kind="snapshot", start_lsn=lsn, end_lsn=lsn, details=details)
        writer = BatchWriter(root, manifest)
        rows = copy_tables(connect_kwargs, snapshot.snapshot_name, tables, writer, parallelism=parallelism,
                           extra_where=extra_where, type_overrides=type_overrides, report=report,
                           identities=identities, copier=copier)
        if copied is not None:
            try:
                copied(manifest, rows)
            except BaseException:
                remove_parts(writer)
                raise
        writer.commit()
    return manifest, rows
