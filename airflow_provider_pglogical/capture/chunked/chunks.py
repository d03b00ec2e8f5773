"""One chunk: low watermark, the writers' wait, the read in its own short transaction, high watermark,
then a committed ranged snapshot batch positioned at the low watermark.

The read reuses the exported-snapshot copy's code (``snapshot._copy_unit``: COPY streamed into
Arrow and Parquet, memory bounded), so a chunk's rows are staged exactly as a snapshot's are and
the apply lands them as it lands a ranged backfill: it replaces the chunk's key range and
re-applies the changes committed at or after the low watermark (``spark/apply/plan.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import psycopg2
import pyarrow as pa

from airflow_provider_pglogical.capture import snapshot
from airflow_provider_pglogical.capture.chunked import plan, watermarks
from airflow_provider_pglogical.capture.chunked.progress import CHUNK_DETAILS
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.layout import BatchManifest, StagingPath, TableManifest


#: the ``application_name`` of every session of the load (its loader, a whole table's copy and temporary slot)
APPLICATION_NAME = "pglogical chunked load"

#: bytes of COPY text parsed at a time: a chunk is a short COPY, whose read, parse and Parquet stages
#: overlap better in small blocks (1 MB: 0.48-0.58x raw COPY against 0.35-0.38x with the exported
#: copy's 8 MB, 200k-row chunks, CHANGELOG's Benchmark history)
BLOCK_SIZE = 1 << 20


@dataclass(frozen=True)
class ChunkEvent:
    """What a hook is told about a chunk (tests synchronise on these; never row data)."""

    table: str
    chunk: int
    start: Any
    end: Any
    #: the loader's backend, for ``pg_stat_activity``
    pid: int
    rows: int = 0
    low: str | None = None


@dataclass
class ChunkHooks:
    """Called at the chunk's moments: ``low`` after the low watermark, ``read`` inside the chunk's
    transaction once its rows are read, ``staged`` after its batch is committed (between chunks).
    A table loaded whole (``whole.py``) is one chunk, 0: ``low`` once its snapshot is exported."""

    low: Callable[[ChunkEvent], None] = lambda event: None
    read: Callable[[ChunkEvent], None] = lambda event: None
    staged: Callable[[ChunkEvent], None] = lambda event: None


@dataclass
class TableSpec:
    """What every chunk batch of one table carries: its manifest entry, Arrow mapping, staged name."""

    chunked: plan.ChunkedTable
    manifest: TableManifest
    mapping: dict
    staged_as: str


@dataclass
class ChunkReader:
    """The loader's one session: autocommit between chunks, one short transaction per chunk."""

    connect_kwargs: Mapping[str, Any]
    root: StagingPath
    pipeline: str
    details: dict
    writer_wait_seconds: float
    hooks: ChunkHooks = field(default_factory=ChunkHooks)

    def __post_init__(self) -> None:
        self.conn = psycopg2.connect(**self.connect_kwargs, application_name=APPLICATION_NAME)
        self.conn.autocommit = True
        self.conn.set_client_encoding(values.CLIENT_ENCODING)
        with self.conn.cursor() as cur:
            values.apply_session_settings(cur)
            cur.execute("SELECT current_setting('server_encoding') = 'UTF8'")
            self.trusted_utf8 = bool(cur.fetchone()[0])
        self.pid = self.conn.get_backend_pid()

    def close(self) -> None:
        self.conn.close()

    def boundary(self, spec: TableSpec, start: Any, rows: int) -> Any:
        with self.conn.cursor() as cur:
            return plan.next_boundary(cur, spec.chunked, start, rows)

    def copy(self, spec: TableSpec, number: int, start: Any, end: Any) -> tuple[int, str]:
        """Stage the chunk ``[start, end)`` as a committed batch; returns its rows and the batch's name."""
        table = spec.chunked.table
        event = ChunkEvent(spec.chunked.name, number, start, end, self.pid)
        content = {"table": spec.chunked.name, "chunk": number, "start": start, "end": end}
        with self.conn.cursor() as cur:
            low = watermarks.emit(cur, "low", **content)
            self.hooks.low(ChunkEvent(**{**event.__dict__, "low": str(low)}))
            watermarks.wait_for_writers(cur, table.oid, spec.chunked.name, self.writer_wait_seconds)
            where = plan.range_condition(spec.chunked, start, end).as_string(cur)
        manifest = BatchManifest(pipeline=self.pipeline, kind="snapshot", start_lsn=str(low), end_lsn=str(low),
                                 details={**self.details, "key_range": plan.key_range(spec.chunked, start, end)})
        writer = BatchWriter(self.root, manifest)
        writer.add_table(TableManifest(**{**spec.manifest.__dict__, "files": [], "rows": 0,
                                          "details": {**spec.manifest.details, "extra_where": where}}))
        try:
            with self.conn.cursor() as cur:
                cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                units = [snapshot.WorkUnit(table, source, 0, None, 0) for source in plan.relations_read(cur, spec.chunked)]
            progress = snapshot.Progress(units, lambda line: None, every=float("inf"))
            try:
                rows = sum(snapshot._copy_unit(self.conn, unit, writer, where, progress, self.trusted_utf8,
                                               spec.mapping, spec.staged_as, block_size=BLOCK_SIZE) for unit in units)
                if not units:  # a partitioned table without partitions: an empty part, as the exported copy has
                    with writer.part_writer(spec.staged_as, pa.schema([pa.field(n, m.arrow) for n, m in spec.mapping.items()])):
                        pass
                self.hooks.read(ChunkEvent(**{**event.__dict__, "rows": rows, "low": str(low)}))
            finally:
                with self.conn.cursor() as cur:
                    cur.execute("COMMIT")  # read only: ends the snapshot, whatever happened
            with self.conn.cursor() as cur:
                high = watermarks.emit(cur, "high", **content)
        except BaseException:
            snapshot.remove_parts(writer)
            raise
        manifest.details[CHUNK_DETAILS] = {**self.details[CHUNK_DETAILS], **content, "rows": rows,
                                           "low": str(low), "high": str(high)}
        writer.commit()
        self.hooks.staged(ChunkEvent(**{**event.__dict__, "rows": rows, "low": str(low)}))
        return rows, manifest.name
