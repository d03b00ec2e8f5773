"""Writing and reading the Parquet files of a staged batch (the layout is in :mod:`.layout`).

A writer adds tables and parts, then commits by writing the manifest last (write-then-rename), so
a batch that is not committed does not exist for any reader.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.staging.layout import MANIFEST, BatchManifest, FileEntry, StagingPath, TableManifest
from airflow_provider_pglogical.staging.private_files import make_dirs, open_new

log = logging.getLogger(__name__)


#: Parquet settings of staged files. They are read once, whole, by the apply: dictionary pages
#: and statistics cost a third of the write time and change nothing there (zstd keeps the size);
#: a snapshot's files, adopted into Iceberg as they are, keep the statistics of some columns
#: (:func:`bounded_columns`).
PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "use_dictionary": False, "write_statistics": False}


def bounded_columns(schema: pa.Schema) -> list[str]:
    """The columns whose statistics a snapshot file keeps: the apply adopts these files into Iceberg
    as they are, and Iceberg takes each file's lower and upper bounds from its footer, which let
    queries, MERGE and the row deltas' lookups by key skip files and row groups. Flat columns only
    (Iceberg keeps no bounds of nested ones), and no floating-point one: Parquet's bounds say nothing
    of NaN, which Iceberg counts apart when it writes a file itself (about 4% more copy CPU)."""
    return [field.name for field in schema
            if not pa.types.is_nested(field.type) and not pa.types.is_floating(field.type)]


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

    def _next_file(self, qualified_name: str, part: int | None = None) -> tuple[TableManifest, FileEntry]:
        with self._lock:
            table = self.manifest.tables[qualified_name]
            index = self._table_index[qualified_name]
            entry = FileEntry(table_file_name(index, len(table.files) if part is None else part))
            table.files.append(entry)
        make_dirs(self.directory)
        return table, entry

    def _count(self, table: TableManifest, entry: FileEntry, rows: int, written: "_HashingFile") -> None:
        with self._lock:
            entry.rows = rows
            entry.size = written.size
            entry.sha256 = written.sha256.hexdigest()
            table.rows += rows

    @contextlib.contextmanager
    def _open(self, entry: FileEntry) -> Iterator["_HashingFile"]:
        with open_new(self.directory / entry.path) as fh:
            yield _HashingFile(fh)

    def write_part(self, qualified_name: str, data: pa.Table) -> None:
        """Write one Parquet file of ``data`` for a table."""
        table, entry = self._next_file(qualified_name)
        with self._open(entry) as fh:
            pq.write_table(data, fh, **PARQUET_OPTIONS)
        self._count(table, entry, data.num_rows, fh)

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

        def write(item: tuple[pa.Table, tuple[TableManifest, FileEntry]]) -> None:
            part, (table, entry) = item
            with self._open(entry) as fh:
                pq.write_table(part, fh, **PARQUET_OPTIONS)
            self._count(table, entry, part.num_rows, fh)

        with ThreadPoolExecutor(len(slices)) as pool:
            list(pool.map(write, zip(slices, files)))

    @contextlib.contextmanager
    def part_writer(self, qualified_name: str, schema: pa.Schema,
                    part: int | None = None) -> Iterator["_CountingWriter"]:
        """Stream record batches into one Parquet file of a table (thread-safe across tables/parts),
        its columns numbered with the field ids a new Iceberg table of them gets (:func:`with_field_ids`).

        :param part: the file's part number when writers in several processes share the batch
            (the distributed copy numbers each work unit's file); default: the next one.
        """
        table, entry = self._next_file(qualified_name, part)
        options = {**PARQUET_OPTIONS, "write_statistics": bounded_columns(schema)}
        with self._open(entry) as fh:
            writer = _CountingWriter(pq.ParquetWriter(fh, with_field_ids(schema), **options))
            try:
                yield writer
            finally:
                writer.close()
        self._count(table, entry, writer.rows, fh)

    def commit(self) -> str:
        """Write the manifest last, through a temporary name, and return the batch path."""
        make_dirs(self.directory)
        tmp = self.directory / (MANIFEST + ".tmp")
        with open_new(tmp) as fh:
            fh.write(self.manifest.to_json().encode())
        tmp.rename(self.directory / MANIFEST)
        log.info("committed batch %s (%d tables)", self.manifest.name, len(self.manifest.tables))
        return str(self.directory)


def with_field_ids(schema: pa.Schema) -> pa.Schema:
    """``schema`` with Parquet field ids numbered as Iceberg numbers a new table's columns: the
    top-level columns 1..n in order, then the nested fields (list elements) in order.

    A snapshot's staged file whose ids equal its target table's is adopted by a link, not a
    page copy with a new footer (``spark/apply/adoption.py``); other ids only cost that copy."""
    counter = iter(range(len(schema) + 1, 1 << 31))

    def numbered(field: pa.Field, number: int) -> pa.Field:
        kind = field.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            element = numbered(kind.value_field, next(counter))
            kind = pa.list_(element) if pa.types.is_list(kind) else pa.large_list(element)
        return field.with_type(kind).with_metadata({**(field.metadata or {}), b"PARQUET:field_id": str(number).encode()})

    return pa.schema([numbered(field, index) for index, field in enumerate(schema, start=1)], metadata=schema.metadata)


class _HashingFile:
    """A file being written that counts and hashes the bytes on their way to it, so the manifest
    records each file's size and SHA-256 without reading the file again (the apply job checks
    both before it writes anything: invariant 12). ``hashlib`` releases the GIL on large writes."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.sha256.update(view)
        self.size += view.nbytes
        written = self._raw.write(data)
        return view.nbytes if written is None else written

    def tell(self) -> int:
        return self.size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _CountingWriter:
    def __init__(self, writer: pq.ParquetWriter) -> None:
        self._writer = writer
        self.rows = 0

    def write_batch(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()


def read_table(root: StagingPath, pipeline: str, name: str, table: TableManifest) -> pa.Table:
    """All rows of one table in one batch (tests and verify; Spark reads the files itself)."""
    parts = []
    for file in table.files:
        with (root / pipeline / name / file.path).open("rb") as fh:
            parts.append(pq.read_table(fh))
    return pa.concat_tables(parts) if parts else pa.table({})
