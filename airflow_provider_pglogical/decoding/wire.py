"""The pgoutput wire format in one place: type bytes, fixed layouts, TupleData, and the COPY framing.

PostgreSQL's ``logical/proto.c`` keeps each message's byte layout in one pair of write and read
functions. Here each fixed layout is one :class:`struct.Struct` that the readers (the
message-by-message decoder, the columnar decoder) and the writers below share, so a layout can only
be wrong in one place. The writers build messages byte for byte as "Logical Replication Message
Formats" specifies them: tests and benchmarks use them for what PostgreSQL 15's SQL interface
cannot emit (protocol 4 Stream Abort, binary columns, malformed input).

A peek reaches us as ``COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(…)) TO
STDOUT (FORMAT binary)``: a 19-byte header, one row frame per message, and a trailer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

# -- message type bytes ------------------------------------------------------------------------
BEGIN, COMMIT, ORIGIN, RELATION, TYPE = b"B", b"C", b"O", b"R", b"Y"
INSERT, UPDATE, DELETE, TRUNCATE, MESSAGE = b"I", b"U", b"D", b"T", b"M"
STREAM_START, STREAM_STOP, STREAM_COMMIT, STREAM_ABORT = b"S", b"E", b"c", b"A"
BEGIN_PREPARE, PREPARE, STREAM_PREPARE, COMMIT_PREPARED, ROLLBACK_PREPARED = b"b", b"P", b"p", b"K", b"r"

MESSAGE_NAMES: Final[dict[int, str]] = {
    BEGIN[0]: "Begin", MESSAGE[0]: "Message", COMMIT[0]: "Commit", ORIGIN[0]: "Origin",
    RELATION[0]: "Relation", TYPE[0]: "Type", INSERT[0]: "Insert", UPDATE[0]: "Update",
    DELETE[0]: "Delete", TRUNCATE[0]: "Truncate", STREAM_START[0]: "Stream Start",
    STREAM_STOP[0]: "Stream Stop", STREAM_COMMIT[0]: "Stream Commit", STREAM_ABORT[0]: "Stream Abort",
    BEGIN_PREPARE[0]: "Begin Prepare", PREPARE[0]: "Prepare", COMMIT_PREPARED[0]: "Commit Prepared",
    ROLLBACK_PREPARED[0]: "Rollback Prepared", STREAM_PREPARE[0]: "Stream Prepare",
}
"""Message type byte -> the name PostgreSQL's documentation gives it."""

# -- TupleData -----------------------------------------------------------------------------------
#: a column's kind byte: NULL, unchanged TOASTed value (no data), text, binary
NULL, UNCHANGED_TOAST, TEXT, BINARY = b"n", b"u", b"t", b"b"
#: what precedes a tuple in Update/Delete: the old key, the old row (REPLICA IDENTITY FULL), the new row
OLD_KEY, OLD_ROW, NEW_ROW = b"K", b"O", b"N"

# -- fixed layouts (after the type byte, and after the xid a streamed data message carries) --------
BEGIN_FIELDS: Final = struct.Struct(">QqI")  # final_lsn, commit_ts, xid
COMMIT_FIELDS: Final = struct.Struct(">BQQq")  # flags, commit_lsn, end_lsn, commit_ts
ORIGIN_FIELDS: Final = struct.Struct(">Q")  # origin_lsn, then the name
STREAM_START_FIELDS: Final = struct.Struct(">IB")  # xid, first segment
STREAM_COMMIT_FIELDS: Final = struct.Struct(">IBQQq")  # xid, flags, commit_lsn, end_lsn, commit_ts
STREAM_ABORT_FIELDS: Final = struct.Struct(">II")  # xid, subxid
STREAM_ABORT_V4_FIELDS: Final = struct.Struct(">IIQq")  # xid, subxid, abort_lsn, abort_ts (protocol 4)
BEGIN_PREPARE_FIELDS: Final = struct.Struct(">QQqI")  # prepare_lsn, end_lsn, prepare_ts, xid, then gid
PREPARE_FIELDS: Final = struct.Struct(">BQQqI")  # flags, lsn, end_lsn, ts, xid, then gid (also K and p)
ROLLBACK_PREPARED_FIELDS: Final = struct.Struct(">BQQqqI")  # flags, 2 end LSNs, 2 timestamps, xid, gid
MESSAGE_FIELDS: Final = struct.Struct(">BQ")  # flags (1 = transactional), lsn, then prefix and content
COLUMN_FIELDS: Final = struct.Struct(">Ii")  # a Relation column's type oid and typmod, after its name
TRUNCATE_FIELDS: Final = struct.Struct(">IB")  # number of relations, options, then the oids
XID_OID: Final = struct.Struct(">II")  # a streamed data message: its (sub)transaction xid, then the relation oid
U16: Final = struct.Struct(">H")
U32: Final = struct.Struct(">I")

#: whole-message sizes and field offsets the columnar decoder reads in place
BEGIN_SIZE: Final = 1 + BEGIN_FIELDS.size
COMMIT_SIZE: Final = 1 + COMMIT_FIELDS.size
BEGIN_XID_AT: Final = 1 + 8 + 8
COMMIT_LSN_AT, COMMIT_END_LSN_AT, COMMIT_TS_AT = 2, 10, 18

#: pgoutput timestamps count microseconds from 2000-01-01 UTC; this is that instant in Unix microseconds
PG_EPOCH_UNIX_US: Final = 946_684_800_000_000

# -- binary COPY framing of a peek ---------------------------------------------------------------
COPY_SIGNATURE: Final = b"PGCOPY\n\xff\r\n\x00"
COPY_HEADER_SIZE: Final = len(COPY_SIGNATURE) + 4 + 4  # signature, flags, header extension length
COPY_TRAILER: Final = b"\xff\xff"
#: one row: field count (2), lsn length (8), lsn, data length; then the message
ROW_FRAME: Final = struct.Struct(">hiQi")
ROW_FRAME_SIZE: Final = ROW_FRAME.size


def copy_rows(chunks: Sequence[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(lsn, message)`` per row of a binary COPY of ``(lsn pg_lsn, data bytea)``.

    The fast path takes one row per chunk (what psycopg2's ``copy_expert`` delivers); anything else
    is framed from the joined stream.
    """
    if not chunks:
        return
    first = chunks[0]
    rest = [first[COPY_HEADER_SIZE:], *chunks[1:]] if len(first) > COPY_HEADER_SIZE else list(chunks[1:])
    for index, chunk in enumerate(rest):
        if len(chunk) >= ROW_FRAME_SIZE and U32.unpack_from(chunk, 14)[0] == len(chunk) - ROW_FRAME_SIZE:
            yield ROW_FRAME.unpack_from(chunk)[2], chunk[ROW_FRAME_SIZE:]
        elif chunk == COPY_TRAILER:
            return
        else:
            yield from _framed(b"".join(rest[index:]))
            return


def _framed(data: bytes) -> Iterator[tuple[int, bytes]]:
    pos, end = 0, len(data)
    while end - pos >= ROW_FRAME_SIZE:
        fields, _lsn_length, lsn, length = ROW_FRAME.unpack_from(data, pos)
        if fields == -1:
            return
        yield lsn, data[pos + ROW_FRAME_SIZE:pos + ROW_FRAME_SIZE + length]
        pos += ROW_FRAME_SIZE + length


def write_copy(rows: Iterable[tuple[int, bytes]]) -> list[bytes]:
    """The chunks psycopg2 delivers for ``rows``: the header with nothing after it, a chunk per row, the trailer."""
    header = COPY_SIGNATURE + bytes(8)
    return [header, *(ROW_FRAME.pack(2, 8, lsn, len(data)) + data for lsn, data in rows), COPY_TRAILER]


# -- writers ---------------------------------------------------------------------------------------
class Unchanged:
    """Marks a ``'u'`` column for :func:`write_tuple`."""


class Binary(bytes):
    """Marks a ``'b'`` column for :func:`write_tuple`."""


Value = None | str | bytes | Unchanged | Binary


def write_cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def write_tuple(values: Sequence[Value]) -> bytes:
    out = [U16.pack(len(values))]
    for value in values:
        if value is None:
            out.append(NULL)
        elif isinstance(value, Unchanged):
            out.append(UNCHANGED_TOAST)
        elif isinstance(value, Binary):
            out += [BINARY, U32.pack(len(value)), bytes(value)]
        else:
            data = value.encode() if isinstance(value, str) else value
            out += [TEXT, U32.pack(len(data)), data]
    return b"".join(out)


def _xid(xid: int | None) -> bytes:
    return b"" if xid is None else U32.pack(xid)


def write_begin(final_lsn: int, commit_ts: int, xid: int) -> bytes:
    return BEGIN + BEGIN_FIELDS.pack(final_lsn, commit_ts, xid)


def write_commit(commit_lsn: int, end_lsn: int, commit_ts: int, flags: int = 0) -> bytes:
    return COMMIT + COMMIT_FIELDS.pack(flags, commit_lsn, end_lsn, commit_ts)


def write_origin(origin_lsn: int, name: str) -> bytes:
    return ORIGIN + ORIGIN_FIELDS.pack(origin_lsn) + write_cstring(name)


def write_relation(oid: int, namespace: str, name: str, columns: Iterable[tuple[int, str, int, int]],
                   replica_identity: str = "d", xid: int | None = None) -> bytes:
    """``columns``: ``(flags, name, type oid, typmod)``; flags 1 marks a key column."""
    columns = list(columns)
    out = [RELATION, _xid(xid), U32.pack(oid), write_cstring(namespace), write_cstring(name),
           replica_identity.encode(), U16.pack(len(columns))]
    for flags, column, type_oid, typmod in columns:
        out += [bytes([flags]), write_cstring(column), COLUMN_FIELDS.pack(type_oid, typmod)]
    return b"".join(out)


def write_type(oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return TYPE + _xid(xid) + U32.pack(oid) + write_cstring(namespace) + write_cstring(name)


def write_insert(oid: int, new: Sequence[Value], xid: int | None = None) -> bytes:
    return INSERT + _xid(xid) + U32.pack(oid) + NEW_ROW + write_tuple(new)


def write_update(oid: int, new: Sequence[Value], old: Sequence[Value] | None = None, old_kind: str = "K",
                 xid: int | None = None) -> bytes:
    before = old_kind.encode() + write_tuple(old) if old is not None else b""
    return UPDATE + _xid(xid) + U32.pack(oid) + before + NEW_ROW + write_tuple(new)


def write_delete(oid: int, old: Sequence[Value], old_kind: str = "K", xid: int | None = None) -> bytes:
    return DELETE + _xid(xid) + U32.pack(oid) + old_kind.encode() + write_tuple(old)


def write_truncate(oids: Sequence[int], options: int, xid: int | None = None) -> bytes:
    return TRUNCATE + _xid(xid) + TRUNCATE_FIELDS.pack(len(oids), options) + struct.pack(f">{len(oids)}I", *oids)


def write_message(transactional: bool, lsn: int, prefix: str, content: bytes, xid: int | None = None) -> bytes:
    return (MESSAGE + _xid(xid) + MESSAGE_FIELDS.pack(int(transactional), lsn) + write_cstring(prefix)
            + U32.pack(len(content)) + content)


def write_stream_start(xid: int, first_segment: bool) -> bytes:
    return STREAM_START + STREAM_START_FIELDS.pack(xid, int(first_segment))


def write_stream_stop() -> bytes:
    return STREAM_STOP


def write_stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_ts: int) -> bytes:
    return STREAM_COMMIT + STREAM_COMMIT_FIELDS.pack(xid, 0, commit_lsn, end_lsn, commit_ts)


def write_stream_abort(xid: int, subxid: int, abort_lsn: int | None = None, abort_ts: int | None = None) -> bytes:
    if abort_lsn is None:
        return STREAM_ABORT + STREAM_ABORT_FIELDS.pack(xid, subxid)
    return STREAM_ABORT + STREAM_ABORT_V4_FIELDS.pack(xid, subxid, abort_lsn, abort_ts or 0)  # streaming = parallel


def write_begin_prepare(prepare_lsn: int, end_lsn: int, prepare_ts: int, xid: int, gid: str) -> bytes:
    return BEGIN_PREPARE + BEGIN_PREPARE_FIELDS.pack(prepare_lsn, end_lsn, prepare_ts, xid) + write_cstring(gid)


def write_prepare(prepare_lsn: int, end_lsn: int, prepare_ts: int, xid: int, gid: str, kind: bytes = PREPARE) -> bytes:
    """Prepare, and with ``kind`` the messages of the same layout: Stream Prepare, Commit Prepared."""
    return kind + PREPARE_FIELDS.pack(0, prepare_lsn, end_lsn, prepare_ts, xid) + write_cstring(gid)


def write_rollback_prepared(prepare_end_lsn: int, rollback_end_lsn: int, prepare_ts: int, rollback_ts: int,
                            xid: int, gid: str) -> bytes:
    return (ROLLBACK_PREPARED + ROLLBACK_PREPARED_FIELDS.pack(0, prepare_end_lsn, rollback_end_lsn, prepare_ts,
                                                              rollback_ts, xid) + write_cstring(gid))
