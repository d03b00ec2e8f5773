"""The chunked load's durable progress (``_chunked_load.json``) and its report in the task log.

The record says, per table, where the next chunk starts and how many chunks and rows are staged (a
table loaded whole has one chunk: done once its batch is committed, else copied again from scratch);
it is written after each chunk's batch is committed, so a killed load resumes at the first chunk
that is not staged. A kill between the batch's commit and the record's write is recognised from
the committed batch itself (its details name the load, the table and the chunk's range), so that
chunk is not copied twice either.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.contract import CHUNKED_LOAD
from airflow_provider_pglogical.staging.contract import MANIFEST
from airflow_provider_pglogical.staging.layout import (
    StagingPath,
    committed_batches,
    parse_batch_name,
    read_manifest,
    read_pipeline_file,
    write_pipeline_file,
)

#: the pipeline file holding the load's progress
LOAD_RECORD = "_chunked_load.json"
#: the batch details entry of a chunk (also of the load's initial, empty snapshot batch)
CHUNK_DETAILS = CHUNKED_LOAD


@dataclass
class TableProgress:
    """How far one table is staged."""

    next_start: Any = None
    chunks: int = 0
    rows: int = 0
    done: bool = False
    #: the table's rows as PostgreSQL estimated them when the load started (``pg_class.reltuples``)
    estimated_rows: int | None = None
    #: the column its chunks are ranges of (None: not begun, or loaded whole)
    column: str | None = None
    #: why it is loaded whole, in one exported snapshot of a temporary slot: its one "chunk" (None: in key chunks)
    whole: str | None = None


@dataclass
class LoadRecord:
    """One chunked load of a pipeline: its slot, its start LSN, and each table's progress."""

    slot: str
    created_lsn: str
    chunk_rows: int
    tables: dict[str, TableProgress] = field(default_factory=dict)
    complete: bool = False

    @property
    def chunks(self) -> int:
        return sum(t.chunks for t in self.tables.values())

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())


def load_figures(record: LoadRecord | None) -> dict[str, Any] | None:
    """The load's progress as the pipeline view and its JSON show it; None without a chunked load.
    A table loaded whole counts as one chunk; ``whole`` says why it was not chunked.

    ``estimated_rows`` is PostgreSQL's estimate at the load's start (never below what is staged),
    so ``rows`` / ``estimated_rows`` is a fair share done while the load runs, not an exact one."""
    if record is None:
        return None
    estimated = sum(t.estimated_rows or 0 for t in record.tables.values())
    return {
        "complete": record.complete, "slot": record.slot, "chunk_rows": record.chunk_rows,
        "chunks": record.chunks, "rows": record.rows,
        "estimated_rows": max(estimated, record.rows) if estimated else None,
        "tables": len(record.tables), "tables_done": sum(t.done for t in record.tables.values()),
        "tables_whole": sum(bool(t.whole) for t in record.tables.values()),
        "per_table": {name: {"chunks": t.chunks, "rows": t.rows, "done": t.done, "estimated_rows": t.estimated_rows,
                             "whole": t.whole} for name, t in sorted(record.tables.items())},
    }


def read_load(root: StagingPath, pipeline: str) -> LoadRecord | None:
    raw = read_pipeline_file(root, pipeline, LOAD_RECORD)
    if raw is None:
        return None
    raw["tables"] = {name: TableProgress(**t) for name, t in raw.get("tables", {}).items()}
    return LoadRecord(**raw)


def write_load(root: StagingPath, pipeline: str, record: LoadRecord) -> None:
    write_pipeline_file(root, pipeline, LOAD_RECORD, asdict(record))


def catch_up_with_staging(root: StagingPath, pipeline: str, record: LoadRecord) -> int:
    """Count the chunk batches committed after the record was last written (a kill in between);
    returns how many there were."""
    found = 0
    for name, start, _end, kind in committed_batches(root, pipeline):
        if kind != "snapshot" or start <= Lsn.parse(record.created_lsn):
            continue
        manifest = read_manifest(root, pipeline, name)
        details = manifest.details.get(CHUNK_DETAILS) or {}
        if details.get("slot") != record.slot or details.get("created_lsn") != record.created_lsn:
            continue
        table = record.tables.get(details["table"])
        if table is None or table.done or details["chunk"] != table.chunks or details["start"] != table.next_start:
            continue  # counted already (the record is newer than the batch)
        whole = details.get("whole")  # a table loaded whole: its one chunk holds every row
        table.chunks, table.rows = table.chunks + 1, details["rows"] + (0 if whole else table.rows)
        table.next_start, table.done = details["end"], details["end"] is None
        table.whole = whole or table.whole
        table.column = None if whole else (manifest.details.get("key_range") or {}).get("column", table.column)
        found += 1
    return found


def remove_unfinished_chunks(root: StagingPath, pipeline: str, record: LoadRecord) -> list[str]:
    """Remove the files of chunks a killed attempt began but never committed (a snapshot batch
    directory after the load's start without a manifest: it never existed); returns their names.
    Nothing else writes snapshot batches while the load holds the slot's lock and the pipeline is
    ``snapshotting`` (a backfill needs ``streaming``)."""
    removed = []
    directory = root / pipeline
    for child in directory.iterdir() if directory.exists() else []:
        parsed = parse_batch_name(child.name)
        if parsed and parsed[2] == "snapshot" and parsed[0] > Lsn.parse(record.created_lsn) \
                and not (child / MANIFEST).exists():
            for part in child.iterdir():
                part.unlink()
            child.rmdir()
            removed.append(child.name)
    return removed


class Reporter:
    """Rows, chunks, rate and ETA of the load in the task log, at most every ``every`` seconds."""

    def __init__(self, record: LoadRecord, report: Callable[[str], None], every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._record, self._report, self._every, self._clock = record, report, every, clock
        self._start, self._last = clock(), float("-inf")
        self._rows_at_start = record.rows

    def chunk_done(self, table: str, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last < self._every:
            return
        self._last = now
        elapsed = max(now - self._start, 1e-6)
        copied = self._record.rows - self._rows_at_start
        rate = copied / elapsed
        total = max(sum(t.estimated_rows or 0 for t in self._record.tables.values()), self._record.rows)
        left = sum(max((t.estimated_rows or 0) - t.rows, 0) for t in self._record.tables.values() if not t.done)
        eta = f", ETA {left / rate:,.0f}s" if rate > 0 and left else ""
        progress = self._record.tables[table]
        self._report(
            f"chunked load: {self._record.rows:,} of ~{total:,} rows in {self._record.chunks:,} chunks "
            f"({sum(t.done for t in self._record.tables.values())}/{len(self._record.tables)} tables done), "
            f"{rate:,.0f} rows/s{eta}; {table}: {progress.rows:,} rows in {progress.chunks:,} chunks"
            + (" (loaded whole)" if progress.whole else "") + (", done" if progress.done else "")
        )
