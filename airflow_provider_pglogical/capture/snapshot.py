"""Filtered, parallel COPY of published tables inside one exported snapshot, into a snapshot batch.

Each table is split into ctid ranges (work units); ``parallelism`` connections import the same
exported snapshot and run ``COPY (SELECT <published columns> FROM ONLY <t> WHERE (<row filter>)
AND ctid >= … AND ctid < …) TO STDOUT (FORMAT text)``. COPY output is streamed through a pipe into
pyarrow's C++ CSV reader (tab-separated, no quoting, with an explicit schema from the type map)
and on into Parquet, so the copy and the conversion overlap and memory stays bounded whatever the
table's size. Text format rather than CSV: PostgreSQL writes it faster, and as it escapes tabs and
newlines inside values, rows end at every newline: the stream is cut into chunks of whole rows
(about ``CSV_BLOCK_SIZE`` bytes, or one row when a row is larger, up to PostgreSQL's 1 GB), so
memory is bounded by the largest row, not by the table. String columns then have their (rare)
backslash escapes undone. A chunk whose dates, timestamps or numbers the reader cannot convert
(BC years, years past 9999, ``infinity``, ``NaN``) is read again with those columns as text and
converted by ``values.py``, exactly or with an error naming the column and its override.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import psycopg2
import pyarrow as pa
from psycopg2 import sql

from airflow_provider_pglogical.capture import copy_text, ddl
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.staging.contract import table_key
from airflow_provider_pglogical.staging.layout import TableManifest
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.typemap import MappedType, apply_overrides, map_column

log = logging.getLogger(__name__)

#: blocks per work unit below which a table is not split further
MIN_BLOCKS_PER_UNIT = 1024
CSV_BLOCK_SIZE = 8 << 20
#: parsed batches (of CSV_BLOCK_SIZE input each) waiting for the Parquet writer
PARSED_BATCHES_QUEUED = 4


@dataclass(frozen=True)
class WorkUnit:
    """One COPY: a relation (a table, or a leaf of a partitioned root) and a block range."""

    table: ResolvedTable
    source: tuple[str, str]  # the relation read (differs from ``table`` for partition leaves)
    first_block: int
    end_block: int | None  # None: to the end of the relation
    blocks: int


def manifest_columns(table: ResolvedTable, type_overrides: Mapping[str, str] | None = None) -> list[dict]:
    """The table's manifest column entries, with the ``type_overrides`` that name its columns."""
    return apply_overrides(table.qualified_name, [c.manifest_entry() for c in table.columns], type_overrides,
                           strict=True)


def column_mapping(table: ResolvedTable, type_overrides: Mapping[str, str] | None = None) -> dict[str, MappedType]:
    return {c["name"]: map_column(c) for c in manifest_columns(table, type_overrides)}


def copy_statement(unit: WorkUnit, extra_where: str | None = None) -> sql.Composed:
    """``COPY (SELECT … FROM ONLY … WHERE …) TO STDOUT (FORMAT text)`` for one work unit."""
    table = unit.table
    conditions: list[sql.Composable] = []
    if table.row_filter:
        conditions.append(sql.SQL("({})").format(sql.SQL(table.row_filter)))
    if extra_where:
        conditions.append(sql.SQL("({})").format(sql.SQL(extra_where)))
    if unit.first_block > 0:
        conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({unit.first_block},0)")))
    if unit.end_block is not None:
        conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({unit.end_block},0)")))
    where = sql.SQL(" WHERE {}").format(sql.SQL(" AND ").join(conditions)) if conditions else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM ONLY {}{}) TO STDOUT WITH (FORMAT text)").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in table.column_names),
        sql.Identifier(*unit.source),
        where,
    )


# By name, not oid: verify reads the same tables from another database (a native subscriber).
_LEAVES = """
SELECT n.nspname, c.relname, pg_relation_size(c.oid) / current_setting('block_size')::int
  FROM pg_partition_tree(format('%%I.%%I', %s, %s)::regclass) t
  JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE t.isleaf ORDER BY 1, 2
"""
_BLOCKS = "SELECT pg_relation_size(format('%%I.%%I', %s, %s)::regclass) / current_setting('block_size')::int"


def plan_work_units(cursor, tables: Sequence[ResolvedTable], parallelism: int) -> list[WorkUnit]:
    """Split every relation into block ranges so ``parallelism`` workers stay busy; largest first."""
    relations: list[tuple[ResolvedTable, tuple[str, str], int]] = []
    for table in tables:
        if table.relkind == "p":
            cursor.execute(_LEAVES, (table.schema, table.name))
            relations += [(table, (s, n), blocks) for s, n, blocks in cursor.fetchall()]
        else:
            cursor.execute(_BLOCKS, (table.schema, table.name))
            relations.append((table, (table.schema, table.name), cursor.fetchone()[0]))
    total = sum(blocks for *_, blocks in relations)
    target = max(MIN_BLOCKS_PER_UNIT, total // max(1, parallelism * 4) + 1)
    units: list[WorkUnit] = []
    for table, source, blocks in relations:
        pieces = max(1, -(-blocks // target)) if parallelism > 1 else 1
        step = -(-blocks // pieces) if blocks else 0
        for i in range(pieces):
            first = i * step
            end = None if i == pieces - 1 else (i + 1) * step
            units.append(WorkUnit(table, source, first, end, (end or blocks) - first))
    return sorted(units, key=lambda u: -u.blocks)


class Progress:
    """Per-table rows, bytes, rate and ETA in the task log (thread-safe)."""

    def __init__(self, units: Sequence[WorkUnit], report: Callable[[str], None], every: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._report = report
        self._every = every
        self._start = time.monotonic()
        self._last = 0.0
        self.blocks_total = {u.table.qualified_name: 0 for u in units}
        for u in units:
            self.blocks_total[u.table.qualified_name] += u.blocks
        self.blocks_done = dict.fromkeys(self.blocks_total, 0)
        self.rows = dict.fromkeys(self.blocks_total, 0)
        self.bytes = dict.fromkeys(self.blocks_total, 0)

    def add(self, table: str, rows: int, nbytes: int, blocks_done: int = 0, force: bool = False) -> None:
        with self._lock:
            self.rows[table] += rows
            self.bytes[table] += nbytes
            self.blocks_done[table] += blocks_done
            now = time.monotonic()
            if not force and now - self._last < self._every:
                return
            self._last = now
            elapsed = max(now - self._start, 1e-6)
            done = sum(self.blocks_done.values())
            total = sum(self.blocks_total.values()) or 1
            eta = elapsed * (total - done) / done if done else float("nan")
            for name in self.rows:
                self._report(
                    f"{name}: {self.rows[name]:,} rows, {self.bytes[name] / 1e6:,.1f} MB, "
                    f"{self.rows[name] / elapsed:,.0f} rows/s, "
                    f"{100 * self.blocks_done[name] / max(self.blocks_total[name], 1):.0f}% of blocks"
                    + (f", ETA {eta:,.0f}s" if done and done < total else "")
                )


def _session(connect_kwargs: Mapping[str, Any], snapshot_name: str):
    conn = psycopg2.connect(**connect_kwargs)
    conn.set_client_encoding(values.CLIENT_ENCODING)
    with conn.cursor() as cur:
        values.apply_session_settings(cur)
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
    return conn


def _copy_unit(conn, unit: WorkUnit, writer: BatchWriter, extra_where: str | None, progress: Progress,
               trusted_utf8: bool, mapping: dict[str, MappedType], staged_as: str, part: int | None = None,
               block_size: int | None = None) -> int:
    """Run one COPY; parse its text stream and write Parquet in two more threads; returns rows.

    Three stages, so none waits for another: this thread feeds COPY into a pipe, a parser thread
    reads the pipe into Arrow batches, a writer thread encodes them to Parquet (a bounded queue
    between the last two keeps memory bounded). Parsing and Parquet encoding release the GIL.

    String columns are read as binary and, when ``trusted_utf8`` (a UTF8 database: PostgreSQL
    validated every value on input), viewed as strings without validating them again, which
    costs as much as parsing; otherwise they are validated. ``block_size``: bytes parsed at a time
    (default :data:`CSV_BLOCK_SIZE`); a short COPY overlaps its stages better with smaller blocks.
    """
    table = unit.table
    types, strings = values.copy_read_types(mapping)
    types = {name: pa.binary() if name in strings else t for name, t in types.items()}
    schema = pa.schema([pa.field(name, m.arrow) for name, m in mapping.items()])
    read_fd, write_fd = os.pipe()
    copy_text.widen_pipe(write_fd)
    result: dict[str, Any] = {"rows": 0}
    batches: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=PARSED_BATCHES_QUEUED)

    def parse() -> None:
        try:
            with os.fdopen(read_fd, "rb", buffering=0) as source:
                for chunk in copy_text.row_chunks(source, block_size or CSV_BLOCK_SIZE):
                    if "error" in result:
                        return  # the writer failed: closing the pipe stops the COPY
                    data, as_text = copy_text.parse_chunk(chunk, mapping, types)
                    for name in strings + as_text:
                        index = data.schema.get_field_index(name)
                        raw = data.column(index).combine_chunks()
                        if name in strings:
                            raw = values.unescape_copy_text(raw.view(pa.string()) if trusted_utf8 else raw.cast(pa.string()))
                        converted = values.text_to_arrow(raw, mapping[name], name, table.qualified_name)
                        data = data.set_column(index, name, converted)
                    for batch in data.to_batches():
                        batches.put(batch.cast(schema) if batch.schema != schema else batch)
        except BaseException as err:  # noqa: BLE001 - re-raised in the copying thread
            result.setdefault("error", err)
        finally:
            batches.put(None)

    def write() -> None:
        ended = False  # the parser's end marker was taken: draining again would wait forever
        try:
            with writer.part_writer(staged_as, schema, part) as out:
                while (batch := batches.get()) is not None:
                    out.write_batch(batch)
                    result["rows"] += batch.num_rows
                    progress.add(table.qualified_name, batch.num_rows, batch.nbytes)
                ended = True
        except BaseException as err:  # noqa: BLE001 - re-raised in the copying thread
            result.setdefault("error", err)
            while not ended and batches.get() is not None:
                pass  # unblock the parser until it stops

    threads = [threading.Thread(target=parse, name=f"parse-{table.name}", daemon=True),
               threading.Thread(target=write, name=f"parquet-{table.name}", daemon=True)]
    for thread in threads:
        thread.start()
    statement = copy_statement(unit, extra_where)
    try:
        with os.fdopen(write_fd, "wb", buffering=1 << 20) as sink, conn.cursor() as cur:
            cur.copy_expert(statement, sink, size=1 << 20)
    except BrokenPipeError:
        pass  # the parser stopped and closed its end; the error is raised below
    finally:
        for thread in threads:
            thread.join()
    if "error" in result:
        raise result["error"]
    progress.add(table.qualified_name, 0, 0, blocks_done=unit.blocks, force=True)
    return result["rows"]


@dataclass
class CopyPlan:
    """What every copier needs: the work units, each table's column types and staged name."""

    units: list[WorkUnit]
    mappings: dict[str, dict[str, MappedType]]
    staged_as: dict[str, str]
    trusted_utf8: bool
    extra_where: dict[str, str]


#: runs a plan's units inside the snapshot into the writer's batch; returns rows per table
Copier = Callable[[CopyPlan, BatchWriter, str, Callable[[str], None]], dict[str, int]]


def copy_tables(
    connect_kwargs: Mapping[str, Any],
    snapshot_name: str,
    tables: Sequence[ResolvedTable],
    writer: BatchWriter,
    *,
    parallelism: int = 2,
    extra_where: Mapping[str, str] | None = None,
    type_overrides: Mapping[str, str] | None = None,
    report: Callable[[str], None] = log.info,
    identities: Mapping[str, tuple[str, str]] | None = None,
    copier: Copier | None = None,
) -> dict[str, int]:
    """Copy ``tables`` as seen by ``snapshot_name`` into ``writer``'s batch; returns rows per table.

    :param connect_kwargs: libpq keywords of the publisher.
    :param snapshot_name: an exported snapshot, valid for the whole call.
    :param parallelism: connections copying at once.
    :param extra_where: per qualified table name, an extra filter (a ranged backfill).
    :param type_overrides: ``{"schema.table.column": "string"}``: stage these columns as
        PostgreSQL's text output (docs/types.md); recorded per column in the manifest.
    :param identities: per qualified table name, the ``(schema, name)`` the pipeline stages it under
        when it was renamed since the pipeline first snapshotted it (``capture/ddl.py``).
    :param copier: runs the units elsewhere (the Spark executors, ``operators/spark_copy.py``)
        instead of this process's connections; the batch is the same.
    :raises UnrepresentableValue: a value has no exact form in its column's type and the column has
        no override; nothing of the batch is left in staging.
    """
    mappings: dict[str, dict[str, MappedType]] = {}
    staged_as: dict[str, str] = {}
    identity: dict[str, tuple[str, str]] = {}
    for table in tables:
        columns = manifest_columns(table, type_overrides)
        mappings[table.qualified_name] = {c["name"]: map_column(c) for c in columns}
        schema, name = identity[table.qualified_name] = (identities or {}).get(
            table.qualified_name, (table.schema, table.name))
        staged_as[table.qualified_name] = table_key(schema, name)
        writer.add_table(
            TableManifest(
                schema=schema, name=name,
                columns=columns, key=table.key,
                replica_identity=table.replica_identity, keyless=table.keyless,
                details={"row_filter": table.row_filter, "extra_where": (extra_where or {}).get(table.qualified_name)},
            )
        )
    setup = _session(connect_kwargs, snapshot_name)
    try:
        with setup.cursor() as cur:
            units = plan_work_units(cur, tables, parallelism)
            cur.execute("SELECT current_setting('server_encoding') = 'UTF8'")
            trusted_utf8 = bool(cur.fetchone()[0])
            # the columns (with attnums) and enum labels as of the snapshot: later pulls compare with them
            enums = ddl.enum_labels(cur, [c.type_oid for t in tables for c in t.columns])
            for table in tables:
                writer.manifest.tables[staged_as[table.qualified_name]].details["relation"] = ddl.relation_entry(
                    table, enums, identity[table.qualified_name], None)
    finally:
        setup.close()
    plan = CopyPlan(units, mappings, staged_as, trusted_utf8, dict(extra_where or {}))
    try:
        if copier is not None:
            rows = copier(plan, writer, snapshot_name, report)
        else:
            rows = _copy_here(connect_kwargs, snapshot_name, plan, writer, parallelism, report)
    except BaseException:
        remove_parts(writer)
        raise
    for name, count in rows.items():
        report(f"{name}: copied {count:,} rows")
    return rows


def _copy_here(connect_kwargs: Mapping[str, Any], snapshot_name: str, plan: CopyPlan, writer: BatchWriter,
               parallelism: int, report: Callable[[str], None]) -> dict[str, int]:
    """Run the plan's units on ``parallelism`` connections of this process."""
    units = plan.units
    progress = Progress(units, report)
    report(f"copying {len(plan.mappings)} table(s) in {len(units)} work unit(s) with {parallelism} connection(s)")
    local = threading.local()
    connections: list = []
    lock = threading.Lock()

    def run(unit: WorkUnit) -> int:
        if not hasattr(local, "conn"):
            local.conn = _session(connect_kwargs, snapshot_name)
            with lock:
                connections.append(local.conn)
        name = unit.table.qualified_name
        return _copy_unit(local.conn, unit, writer, plan.extra_where.get(name), progress, plan.trusted_utf8,
                          plan.mappings[name], plan.staged_as[name])

    stop = threading.Event()

    def run_unless_stopped(unit: WorkUnit) -> int:
        return 0 if stop.is_set() else run(unit)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallelism)) as pool:
            futures = [pool.submit(run_unless_stopped, u) for u in units]
            try:
                for future in concurrent.futures.as_completed(futures):
                    future.result()
            except BaseException:
                stop.set()  # the other units need not run: the batch will not be committed
                with lock:  # nor finish the COPYs they are running: the pool waits for them
                    for conn in connections:
                        _cancel(conn)
                raise
    finally:
        for conn in connections:
            conn.close()
    return dict(progress.rows)


def _cancel(conn) -> None:
    """Stop the statement a worker's connection runs, if any (the copy failed elsewhere)."""
    try:
        conn.cancel()
    except Exception as err:  # noqa: BLE001 - the first worker's error matters more
        log.warning("could not cancel a COPY of the failed initial copy: %s", err)


def remove_parts(writer: BatchWriter) -> None:
    """A failed copy leaves no files behind (the batch has no manifest, so it never existed)."""
    try:
        if writer.directory.exists():
            for child in writer.directory.iterdir():
                child.unlink()
            writer.directory.rmdir()
    except Exception as err:  # noqa: BLE001 - the copy's own error matters more
        log.warning("could not remove the files of the failed batch %s: %s", writer.directory, err)
