"""Staged batches: the seam between the Python side (snapshot, pull) and the Spark apply job.

A batch is ``<root>/<pipeline>/<start_lsn>-<end_lsn>-<kind>/`` (LSNs as 16 hex digits, so names
sort in LSN order whatever the kind) holding Parquet files per table and ``_manifest.json``,
written last through write-then-rename. A batch without a manifest does not exist: readers skip
it and writers may delete it.

Position semantics shared by both sides: a *position* P means "every transaction whose commit
LSN is < P is reflected, none at or after it". A change batch covers positions
``[start_lsn, end_lsn)``; a snapshot batch is a single position (``start_lsn == end_lsn``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.replication.lsn import Lsn

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
FORMAT_VERSION = 1
KINDS = ("snapshot", "changes")
_BATCH_NAME = re.compile(r"^([0-9A-F]{16})-([0-9A-F]{16})-(snapshot|changes)$")

#: metadata columns of a change row (values follow them, then ``_old_<key>`` columns)
OP = "_op"
COMMIT_LSN = "_commit_lsn"
SEQ = "_seq"
XID = "_xid"
COMMIT_TS = "_commit_ts"
UNCHANGED = "_unchanged_toast"
OLD_KEY_PREFIX = "_old_"
CHANGE_METADATA = (OP, COMMIT_LSN, SEQ, XID, COMMIT_TS, UNCHANGED)
#: marks a source column staged under another name (see :func:`staged_name`)
ESCAPE = "~"


def staged_name(column: str) -> str:
    """The name a source column has in a staged *change* file: its own, unless that is taken.

    A source column may be called anything, ``_op`` or ``_old_id`` included, and may be added at
    any time after the slot exists. Names a metadata column has or could have (a metadata name,
    ``_old_…``) and names starting with :data:`ESCAPE` are staged as ``ESCAPE + name``: no staged
    source name then starts with ``_`` when it is taken, none equals another, and none equals a
    metadata name. Snapshot files hold source columns only and keep every name as it is.
    """
    if column in CHANGE_METADATA or column.startswith(OLD_KEY_PREFIX) or column.startswith(ESCAPE):
        return ESCAPE + column
    return column


class StagingPath(Protocol):
    """What we need of a path: Airflow's ``ObjectStoragePath`` (file://, s3://, gs://, ...)."""

    def __truediv__(self, other: str) -> "StagingPath": ...
    def open(self, mode: str = ...) -> Any: ...
    def exists(self) -> bool: ...
    def iterdir(self) -> Iterator["StagingPath"]: ...
    def mkdir(self, parents: bool = ..., exist_ok: bool = ...) -> None: ...
    def rename(self, target: "StagingPath") -> Any: ...

    @property
    def name(self) -> str: ...


@dataclass
class TableManifest:
    """One source table inside a batch."""

    schema: str
    name: str
    #: ``[{"name", "type", "type_oid", "typmod", "formatted", "element_type", "key"}]``
    columns: list[dict]
    #: replica-identity key column names (all columns for REPLICA IDENTITY FULL without a key)
    key: list[str]
    replica_identity: str = "d"
    files: list[dict] = field(default_factory=list)
    rows: int = 0
    #: free-form facts the apply job needs: ``{"truncated": true, "backfill_where": ...}``
    details: dict = field(default_factory=dict)

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.name}"


@dataclass
class BatchManifest:
    pipeline: str
    kind: str
    start_lsn: str
    end_lsn: str
    tables: dict[str, TableManifest] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    format_version: int = FORMAT_VERSION
    #: schema changes seen inside the batch: ``[{"table", "lsn", "columns"}]``
    schema_changes: list[dict] = field(default_factory=list)
    #: logical messages (``pg_logical_emit_message``) decoded in the batch
    messages: list[dict] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return batch_name(Lsn.parse(self.start_lsn), Lsn.parse(self.end_lsn), self.kind)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "BatchManifest":
        raw = json.loads(text)
        raw["tables"] = {key: TableManifest(**value) for key, value in raw["tables"].items()}
        return cls(**raw)


def batch_name(start: Lsn, end: Lsn, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"batch kind must be one of {KINDS}, not {kind!r}")
    return f"{start.hex16}-{end.hex16}-{kind}"


def parse_batch_name(name: str) -> tuple[Lsn, Lsn, str] | None:
    match = _BATCH_NAME.match(name)
    if not match:
        return None
    return Lsn.parse(match.group(1)), Lsn.parse(match.group(2)), match.group(3)


#: Parquet settings of staged files. They are read once, whole, by the apply: dictionary pages
#: and statistics cost a third of the write time and change nothing there (zstd keeps the size).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": False, "write_statistics": False}


def table_file_name(index: int, part: int) -> str:
    """File names are positional: table names may hold any character, paths may not."""
    return f"table{index:04d}-part{part:05d}.parquet"


class BatchWriter:
    """Writes one batch: Parquet parts per table, then the manifest atomically.

    Parts are streamed (``write_part``) so a batch never has to fit in memory.
    """

    def __init__(self, root: StagingPath, manifest: BatchManifest) -> None:
        self.manifest = manifest
        self.pipeline_dir = root / manifest.pipeline
        self.directory = self.pipeline_dir / manifest.name
        self._table_index: dict[str, int] = {}
        self._lock = threading.Lock()

    def add_table(self, table: TableManifest) -> None:
        self._table_index.setdefault(table.qualified_name, len(self._table_index))
        self.manifest.tables[table.qualified_name] = table

    def _next_file(self, qualified_name: str) -> tuple[TableManifest, dict]:
        with self._lock:
            table = self.manifest.tables[qualified_name]
            index = self._table_index[qualified_name]
            entry = {"path": table_file_name(index, len(table.files)), "rows": 0}
            table.files.append(entry)
        self.directory.mkdir(parents=True, exist_ok=True)
        return table, entry

    def _count(self, table: TableManifest, entry: dict, rows: int) -> None:
        with self._lock:
            entry["rows"] = rows
            table.rows += rows

    def write_part(self, qualified_name: str, data: pa.Table) -> None:
        """Write one Parquet file of ``data`` for a table."""
        table, entry = self._next_file(qualified_name)
        with (self.directory / entry["path"]).open("wb") as fh:
            pq.write_table(data, fh, **PARQUET_OPTIONS)
        self._count(table, entry, data.num_rows)

    def write_parts(self, qualified_name: str, data: pa.Table, workers: int, min_rows: int) -> None:
        """Write ``data`` as up to ``workers`` Parquet files of at least ``min_rows`` rows each, in
        parallel (Parquet encoding releases the GIL); file names follow row order."""
        count = max(1, min(workers, data.num_rows // max(1, min_rows)))
        if count == 1:
            self.write_part(qualified_name, data)
            return
        size = -(-data.num_rows // count)
        slices = [data.slice(offset, size) for offset in range(0, data.num_rows, size)]
        files = [self._next_file(qualified_name) for _ in slices]

        def write(item: tuple[pa.Table, tuple[TableManifest, dict]]) -> None:
            part, (table, entry) = item
            with (self.directory / entry["path"]).open("wb") as fh:
                pq.write_table(part, fh, **PARQUET_OPTIONS)
            self._count(table, entry, part.num_rows)

        with ThreadPoolExecutor(len(slices)) as pool:
            list(pool.map(write, zip(slices, files)))

    @contextlib.contextmanager
    def part_writer(self, qualified_name: str, schema: pa.Schema) -> Iterator["_CountingWriter"]:
        """Stream record batches into one Parquet file of a table (thread-safe across tables/parts)."""
        table, entry = self._next_file(qualified_name)
        with (self.directory / entry["path"]).open("wb") as fh:
            writer = _CountingWriter(pq.ParquetWriter(fh, schema, **PARQUET_OPTIONS))
            try:
                yield writer
            finally:
                writer.close()
        self._count(table, entry, writer.rows)

    def commit(self) -> str:
        """Write the manifest last, through a temporary name, and return the batch path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / (MANIFEST + ".tmp")
        with tmp.open("wb") as fh:
            fh.write(self.manifest.to_json().encode())
        tmp.rename(self.directory / MANIFEST)
        log.info("committed batch %s (%d tables)", self.manifest.name, len(self.manifest.tables))
        return str(self.directory)


class _CountingWriter:
    def __init__(self, writer: pq.ParquetWriter) -> None:
        self._writer = writer
        self.rows = 0

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()


def committed_batches(root: StagingPath, pipeline: str) -> list[tuple[str, Lsn, Lsn, str]]:
    """``(name, start, end, kind)`` of every committed batch, in LSN order."""
    directory = root / pipeline
    if not directory.exists():
        return []
    found = []
    for child in directory.iterdir():
        parsed = parse_batch_name(child.name)
        if parsed and (child / MANIFEST).exists():
            found.append((child.name, *parsed))
    return sorted(found, key=lambda row: row[0])


def read_manifest(root: StagingPath, pipeline: str, name: str) -> BatchManifest:
    with (root / pipeline / name / MANIFEST).open("rb") as fh:
        return BatchManifest.from_json(fh.read().decode())


def read_table(root: StagingPath, pipeline: str, name: str, table: TableManifest) -> pa.Table:
    """All rows of one table in one batch (tests and verify; Spark reads the files itself)."""
    parts = []
    for file in table.files:
        with (root / pipeline / name / file["path"]).open("rb") as fh:
            parts.append(pq.read_table(fh))
    return pa.concat_tables(parts) if parts else pa.table({})
