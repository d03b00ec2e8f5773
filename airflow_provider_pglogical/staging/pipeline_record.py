"""The pipeline's own record of what it created and where it stands, kept under staging.

``<root>/<pipeline>/_pipeline.json`` names the slot the pipeline created, with the slot's plugin,
database and creation LSN (its consistent point), the publications it snapshotted, the tables it
holds a full snapshot of, and its state:

- ``snapshotting``: the slot exists and the initial snapshot is being copied; nothing may pull.
- ``streaming``: the initial snapshot batch is committed; pulls continue it.

The record is written only *after* the slot exists, so an attempt that failed earlier leaves no
claim on a slot name that another tool may later take. A slot is the pipeline's only when the
record names it and the live slot still has the recorded plugin and database, and, while the
snapshot is unfinished, a confirmed position equal to the recorded creation LSN (nothing has
consumed it since): only then may the initial sync drop and recreate it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from airflow_provider_pglogical.exceptions import PipelineStateError
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.contract import PIPELINE_RECORD

if TYPE_CHECKING:  # a type only: staging sits below management
    from airflow_provider_pglogical.management.slots import SlotInfo
from airflow_provider_pglogical.staging.layout import (
    StagingPath,
    committed_batches,
    read_manifest,
    read_pipeline_file,
    write_pipeline_file,
)

RECORD = PIPELINE_RECORD
SNAPSHOTTING = "snapshotting"
STREAMING = "streaming"


@dataclass
class PipelineRecord:
    slot: str
    plugin: str
    database: str
    created_lsn: str
    publications: list[str]
    state: str = SNAPSHOTTING
    #: the committed initial snapshot batch (state ``streaming``)
    snapshot_batch: str | None = None
    #: tables with a full snapshot in staging: ``{"schema.table": relation oid or None}``
    tables: dict[str, int | None] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    #: the end of the newest change batch a pull committed (``contract.STAGED_THROUGH``): the
    #: apply refuses a staging whose change batches end before it (the newest one was removed)
    staged_through: str | None = None
    #: per table OID (a string): its identity, columns with attnums, key and enum labels as the
    #: pipeline last saw them (``capture/ddl.py`` compares the catalog with them)
    relations: dict[str, dict] = field(default_factory=dict)

    def same_publications(self, publications: Sequence[str]) -> bool:
        return sorted(set(self.publications)) == sorted(set(publications))

    def created(self, slot: SlotInfo) -> bool:
        """Whether ``slot`` is provably the one this record describes, still unconsumed."""
        return (
            slot.name == self.slot and slot.plugin == self.plugin and slot.database == self.database
            and slot.slot_type == "logical" and slot.confirmed_flush_lsn == Lsn.parse(self.created_lsn)
        )

    def knows(self, oid: int, qualified_name: str) -> bool:
        """Whether the pipeline snapshotted this relation (by OID, so a rename is still known)."""
        return oid in set(self.tables.values()) or qualified_name in self.tables

    def add_tables(self, tables: Iterable[tuple[str, int | None]]) -> bool:
        """Record fully snapshotted tables; returns whether that changed anything."""
        changed = False
        for name, oid in tables:
            changed |= self.tables.get(name, -1) != oid
            self.tables[name] = oid
        return changed


def read_record(root: StagingPath, pipeline: str) -> PipelineRecord | None:
    raw = _read_json(root, pipeline)
    if raw is None or "plugin" not in raw:
        return None
    return PipelineRecord(**raw)


def _read_json(root: StagingPath, pipeline: str) -> dict | None:
    return read_pipeline_file(root, pipeline, RECORD)


def write_record(root: StagingPath, pipeline: str, record: PipelineRecord) -> None:
    """Write the record through a temporary name and a rename, so readers never see half of it."""
    write_pipeline_file(root, pipeline, RECORD, asdict(record))


def record_staged(root: StagingPath, pipeline: str, end: Lsn) -> None:
    """Note that change batches are committed up to ``end`` (the pull holds the consumer lock)."""
    record = read_record(root, pipeline)
    if record is not None and (record.staged_through is None or Lsn.parse(record.staged_through) < end):
        record.staged_through = str(end)
        write_record(root, pipeline, record)


def upgraded_legacy_record(root: StagingPath, pipeline: str) -> PipelineRecord | None:
    """A pipeline set up by version 0.1.0 kept ``{"slot", "publications"}`` only. When its initial
    snapshot batch is committed, that batch proves the slot is the pipeline's: write a full record."""
    raw = _read_json(root, pipeline)
    if raw is None or "plugin" in raw or "slot" not in raw:
        return None
    for name, start, _end, kind in committed_batches(root, pipeline):
        if kind != "snapshot":
            continue
        manifest = read_manifest(root, pipeline, name)
        if manifest.details.get("initial") and manifest.details.get("slot") == raw["slot"]:
            record = PipelineRecord(
                slot=raw["slot"], plugin="pgoutput", database="", created_lsn=str(start),
                publications=list(manifest.details.get("publications") or raw.get("publications") or []),
                state=STREAMING, snapshot_batch=name, tables={t: None for t in manifest.tables},
                extra={"upgraded_from": "0.1.0"},
            )
            write_record(root, pipeline, record)
            return record
    return None


def require_streaming(root: StagingPath, pipeline: str, publications: Sequence[str], what: str,
                      slot: str | None = None) -> PipelineRecord:
    """The pipeline's record, when its initial snapshot is committed and the arguments match it."""
    record = read_record(root, pipeline) or upgraded_legacy_record(root, pipeline)
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
            "publications (ALTER PUBLICATION … ADD TABLE): the next pull snapshots them. "
            "Nothing was changed"
        )
    return record
