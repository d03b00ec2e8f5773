"""Peek one bounded window of the slot and decode it: what a pull stages, before anything is written.

The rows travel as a binary ``COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(…))``
and are decoded column-wise (:mod:`.columnar`), or message by message (:mod:`.changes`) when a
window needs it. Nothing here writes staging or moves the slot: :mod:`.pull` does, under the
slot's consumer lock.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import psycopg2
from psycopg2 import sql

from airflow_provider_pglogical.decoding import staged_tables
from airflow_provider_pglogical.decoding import columnar, wire
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.decoding.assembler import ChangeAssembler, Transaction
from airflow_provider_pglogical.decoding.window import DecodedWindow, message_record, schema_change_record
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.slots import changes_sql

log = logging.getLogger(__name__)

#: the highest pgoutput protocol the decoders read (4: PostgreSQL 16's parallel-streaming abort fields)
DECODER_PROTO_VERSION = 4
FETCH_ROWS = 20_000
#: a window cut inside a streamed transaction that has no commit yet is read again this many times larger
STREAM_GROWTH = 4
_MAX_CHANGES = 2**31 - 1  # upto_nchanges is an int4


def negotiated_proto_version(server_version: int) -> int:
    """The highest pgoutput protocol both the server and the decoders speak.

    PostgreSQL 15 offers 1-3 (3: two-phase), 16 and later 1-4 (4: parallel streaming). For
    complete transactions every version sends the same bytes; streaming needs 2 or more.

    :param server_version: ``server_version_num``, e.g. ``150004``.
    """
    server = 3 if server_version < 160000 else 4
    return min(server, DECODER_PROTO_VERSION)


def pgoutput_options(publications: Sequence[str], proto_version: int = 1, streaming: bool = False) -> dict[str, str]:
    """The peek's output-plugin options; ``streaming`` sends large in-progress transactions in blocks."""
    options = {"proto_version": str(proto_version), "publication_names": ",".join(publications), "messages": "true"}
    if streaming:
        options["streaming"] = "on"
    return options


class _WindowFull(Exception):
    """Raised from the COPY sink to stop reading once max_bytes is reached at a commit."""


class _BoundedSink:
    """A ``copy_expert`` sink that stops the COPY after the first commit past ``max_bytes``.

    psycopg2 hands over one COPY data message, i.e. one ``(lsn, data)`` row, per ``write``.
    """

    def __init__(self, max_bytes: int) -> None:
        self.chunks: list[bytes] = []
        self.max_bytes = max_bytes
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        if self.size >= self.max_bytes and len(self.chunks) > 1 and \
                chunk[wire.ROW_FRAME_SIZE:wire.ROW_FRAME_SIZE + 1] in _COMMITS:
            raise _WindowFull


_COMMITS = (wire.COMMIT, wire.STREAM_COMMIT)


def _assemble(chunks: list[bytes], assembler: ChangeAssembler) -> tuple[list[Transaction], list[dict], int, int]:
    transactions: list[Transaction] = []
    messages: list[dict] = []
    rows = nbytes = 0
    pending: list[tuple[int, None, bytes]] = []

    def flush() -> None:
        for item in assembler.feed(pending):
            if isinstance(item, Transaction):
                transactions.append(item)
            else:
                messages.append(message_record(item, transactional=False))
        pending.clear()

    for lsn, data in wire.copy_rows(chunks):
        pending.append((lsn, None, data))
        nbytes += len(data)
        rows += 1
        if len(pending) >= FETCH_ROWS:
            flush()
    flush()
    return transactions, messages, rows, nbytes


def peek_window(
    connect_kwargs: Mapping[str, Any], slot: str, publications: Sequence[str], upto: Lsn, max_changes: int,
    max_bytes: int | None, *, vectorised: bool = True, streaming: bool = False,
) -> DecodedWindow:
    """Peek ``[confirmed, upto)`` bounded by ``max_changes`` messages (and ``max_bytes``), and decode it.

    The rows travel as binary ``COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(…))``:
    no text-encoded bytea to decode, no per-row cursor or Python-level write overhead. They are
    decoded column-wise (:mod:`.columnar`); a window that needs more (streamed or two-phase
    messages, or malformed input) goes through the message-by-message assembler instead. The slot
    is read with the highest protocol the server offers (:func:`negotiated_proto_version`).

    :param vectorised: False forces the message-by-message assembler (for comparisons).
    :param streaming: ask PostgreSQL to stream in-progress transactions larger than
        ``logical_decoding_work_mem`` instead of spilling them to disk; only their committed
        changes are staged (aborted transactions and subtransactions are dropped). A streamed
        transaction larger than ``max_changes`` is read whole with a larger window.
    """
    while True:
        window = _peek_once(connect_kwargs, slot, publications, upto, max_changes, max_bytes, vectorised, streaming)
        # A window cut inside a streamed transaction holds none of it: never advance, read it whole.
        if not (streaming and window.limited and not window.transaction_count and window.open_streams) \
                or max_changes >= _MAX_CHANGES:
            return window
        max_changes = min(max_changes * STREAM_GROWTH, _MAX_CHANGES)
        log.info("a streamed transaction is larger than the window: reading up to %d changes", max_changes)


def _peek_once(connect_kwargs: Mapping[str, Any], slot: str, publications: Sequence[str], upto: Lsn,
               max_changes: int, max_bytes: int | None, vectorised: bool, streaming: bool) -> DecodedWindow:
    conn = psycopg2.connect(**connect_kwargs)
    conn.set_client_encoding(values.CLIENT_ENCODING)  # pgoutput sends values in the session's encoding
    conn.autocommit = True
    proto_version = negotiated_proto_version(conn.server_version)
    try:
        with conn.cursor() as cursor:
            values.apply_session_settings(cursor)
            query, args = changes_sql(slot, binary=True, consume=False, upto_lsn=upto, upto_nchanges=max_changes,
                                      options=pgoutput_options(publications, proto_version, streaming),
                                      columns=("lsn", "data"))
            copy = sql.SQL("COPY ({}) TO STDOUT (FORMAT binary)").format(sql.SQL(cursor.mogrify(query, args).decode()))
            chunks: list[bytes] = []
            sink: Any = _BoundedSink(max_bytes) if max_bytes else _ListSink(chunks)
            limited = False
            try:
                cursor.copy_expert(copy, sink, size=1 << 20)
            except _WindowFull:
                limited = True  # the rows after this commit are read again by the next pull
            if max_bytes:
                chunks = sink.chunks
    finally:
        conn.close()
    window = None
    if vectorised:
        try:
            window = columnar.decode_window(chunks, proto_version)
            window.limited = limited
        except columnar.NeedsAssembler as why:
            log.info("decoding this window message by message: %s", why)
    if window is None:
        window = _assembled_window(chunks, limited, proto_version)
    if window.rows >= max_changes:
        window.limited = True
    return window


def _assembled_window(chunks: list[bytes], limited: bool, proto_version: int) -> DecodedWindow:
    """The message-by-message path: every message of protocols 1-4, precise errors."""
    assembler = ChangeAssembler(proto_version)
    transactions, messages, rows, nbytes = _assemble(chunks, assembler)
    limit = assembler.advance_limit
    if limit is not None:
        transactions = [t for t in transactions if t.end_lsn is not None and t.end_lsn <= limit]
    messages = messages + [
        message_record(m.message, transactional=True, commit_lsn=t.commit_lsn) for t in transactions for m in t.messages
    ]
    schema_changes = [schema_change_record(c.new, c.old, c.lsn) for t in transactions for c in t.schema_changes]
    return DecodedWindow(
        staged_tables.group_by_table(transactions, assembler.relations), len(transactions),
        transactions[-1].end_lsn if transactions else None, messages, schema_changes, rows, nbytes, limited,
        held_back=limit is not None, open_streams=bool(assembler.open_stream_xids),
    )


class _ListSink:
    """``copy_expert`` calls ``write`` once per row: bind it to ``list.append`` (C, no Python frame)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.write = chunks.append
