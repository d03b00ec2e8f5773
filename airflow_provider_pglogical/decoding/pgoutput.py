"""Decoder of PostgreSQL's ``pgoutput`` logical replication messages, protocol versions 1 to 4.

One ``bytes`` value of ``pg_logical_slot_peek_binary_changes`` (or one CopyData ``w`` payload of
the walsender) is one message; :meth:`PgOutputDecoder.decode` turns it into one of the classes of
:mod:`.pgoutput_messages`. The decoder is stateful only for streaming: between Stream Start and
Stream Stop, data messages carry the (sub)transaction xid right after the type byte.

What the decoder does *not* do is assemble transactions: that is :mod:`.changes`. See
:mod:`.pgoutput_tuples` for the row representation (raw ``bytes`` values, :data:`UNCHANGED_TOAST`)
and :mod:`.pgoutput_messages` for units (LSNs and timestamps are ints, on purpose).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.decoding.messages import (
    PG_EPOCH,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    pg_timestamp,
)
from airflow_provider_pglogical.decoding.tuples import (
    INSERT_DECODERS,
    PAD,
    UNCHANGED_TOAST,
    UPDATE_DECODERS,
    BinaryValue,
    parse_tuple,
)

__all__ = [
    "PgOutputDecoder", "PgOutputDecodeError", "UNCHANGED_TOAST", "BinaryValue", "Message",
    "PG_EPOCH", "pg_timestamp", "Begin", "Commit", "Origin", "Relation", "Column", "Type", "Insert",
    "Update", "Delete", "Truncate", "LogicalMessage", "StreamStart", "StreamStop", "StreamCommit",
    "StreamAbort", "BeginPrepare", "Prepare", "StreamPrepare", "CommitPrepared", "RollbackPrepared",
    "MESSAGE_NAMES",
]

MESSAGE_NAMES: dict[int, str] = {
    ord("B"): "Begin", ord("M"): "Message", ord("C"): "Commit", ord("O"): "Origin",
    ord("R"): "Relation", ord("Y"): "Type", ord("I"): "Insert", ord("U"): "Update",
    ord("D"): "Delete", ord("T"): "Truncate", ord("S"): "Stream Start", ord("E"): "Stream Stop",
    ord("c"): "Stream Commit", ord("A"): "Stream Abort", ord("b"): "Begin Prepare",
    ord("P"): "Prepare", ord("K"): "Commit Prepared", ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}
"""Message type byte -> the name PostgreSQL's documentation gives it."""


class PgOutputDecodeError(ValueError):
    """A pgoutput message could not be decoded (unknown type byte, truncated or malformed).

    Carries ``type_byte`` and ``lsn`` (as given to :meth:`PgOutputDecoder.decode`). Never
    swallowed: a skipped message would silently lose changes.
    """

    def __init__(self, problem: str, *, type_byte: int | None = None,
                 lsn: str | int | Lsn | None = None) -> None:
        self.type_byte = type_byte
        self.lsn = lsn
        where = f" at LSN {_format_lsn(lsn)}" if lsn is not None else ""
        what = f" in {_describe(type_byte)}" if type_byte is not None else ""
        super().__init__(f"pgoutput: {problem}{what}{where}")


class _Malformed(ValueError):
    """Raised by the message parsers; :meth:`PgOutputDecoder.decode` adds type byte and LSN."""


def _format_lsn(lsn: str | int | Lsn) -> str:
    return str(Lsn(lsn)) if isinstance(lsn, int) else str(lsn)


def _describe(type_byte: int) -> str:
    name = MESSAGE_NAMES.get(type_byte)
    char = chr(type_byte) if 32 <= type_byte < 127 else f"\\x{type_byte:02x}"
    return f"{name} message '{char}'" if name else f"message with type byte '{char}' (0x{type_byte:02x})"


_U32 = struct.Struct(">I").unpack_from
_U32_U32 = struct.Struct(">II").unpack_from
_BEGIN = struct.Struct(">QqI").unpack_from              # final_lsn, commit_ts, xid
_COMMIT = struct.Struct(">BQQq").unpack_from            # flags, commit_lsn, end_lsn, commit_ts
_STREAM_COMMIT = struct.Struct(">IBQQq").unpack_from    # xid, flags, commit_lsn, end_lsn, ts
_STREAM_ABORT_V4 = struct.Struct(">IIQq").unpack_from   # xid, subxid, abort_lsn, abort_ts
_BEGIN_PREPARE = struct.Struct(">QQqI").unpack_from     # prepare_lsn, end_lsn, prepare_ts, xid
_PREPARE = struct.Struct(">BQQqI").unpack_from          # flags, lsn, end_lsn, ts, xid
_ROLLBACK_PREPARED = struct.Struct(">BQQqqI").unpack_from
_MESSAGE = struct.Struct(">BQ").unpack_from             # flags, lsn
_COLUMN = struct.Struct(">Ii").unpack_from              # type oid, typmod
_TRUNCATE = struct.Struct(">IB").unpack_from            # nrelids, options
_Q = struct.Struct(">Q").unpack_from
_new = tuple.__new__


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(0, pos)
    return buf[pos:end].decode("utf-8", "surrogateescape"), end + 1


def _expect_end(buf: bytes, pos: int) -> None:
    if pos != len(buf):
        raise _Malformed(f"message is {len(buf)} bytes but its fields end at byte {pos}")


class PgOutputDecoder:
    """Decodes pgoutput messages one by one.

    :param proto_version: the ``proto_version`` the slot was read with (1-4). It gates Stream
        Start (>= 2) and the protocol 4 Stream Abort fields; two-phase messages are accepted at any
        version because a ``two_phase`` slot sends them even with protocol 1 (PostgreSQL 15).

    One decoder per stream of messages: it remembers whether it is inside a streamed block.
    """

    __slots__ = ("proto_version", "in_stream", "stream_xid")

    def __init__(self, proto_version: int = 1) -> None:
        if not 1 <= proto_version <= 4:
            raise ValueError(f"pgoutput proto_version must be 1 to 4, got {proto_version!r}")
        self.proto_version = proto_version
        self.in_stream = False
        self.stream_xid: int | None = None

    def decode(self, data: bytes | bytearray | memoryview, lsn: str | int | Lsn | None = None) -> Message:
        """Decode one message; ``lsn`` (the row's LSN) is only used to name it in errors."""
        buf = data if data.__class__ is bytes else bytes(data)
        if not buf:
            raise PgOutputDecodeError("empty message", lsn=lsn)
        kind = buf[0]
        try:
            # Data messages first: they are nearly all of any stream.
            if kind == 73:  # Insert: 'I' [xid] oid 'N' ncols ...
                if self.in_stream:
                    return INSERT_DECODERS[(buf[10] << 8) | buf[11]](buf, 5, _U32(buf, 1)[0])
                return INSERT_DECODERS[(buf[6] << 8) | buf[7]](buf, 1, None)
            if kind == 85:  # Update: 'U' [xid] oid ('K'|'O' old tuple)? 'N' new tuple
                if self.in_stream:
                    if buf[9] == 78:
                        return UPDATE_DECODERS[(buf[10] << 8) | buf[11]](buf, 5, _U32(buf, 1)[0])
                elif buf[5] == 78:
                    return UPDATE_DECODERS[(buf[6] << 8) | buf[7]](buf, 1, None)
                return self._update(buf)
            if kind == 68:
                return self._delete(buf)
            handler = _HANDLERS.get(kind)
            if handler is None:
                raise PgOutputDecodeError("unknown message type", type_byte=kind, lsn=lsn)
            return handler(self, buf)
        except PgOutputDecodeError:
            raise
        except (struct.error, IndexError, ValueError) as exc:  # ValueError: _Malformed, TupleDataError
            raise PgOutputDecodeError(f"malformed message ({exc})", type_byte=kind, lsn=lsn) from exc

    # -- data messages (hot path) ------------------------------------------------------------
    def _xid_oid(self, buf: bytes) -> tuple[int | None, int, int]:
        if self.in_stream:
            xid, oid = _U32_U32(buf, 1)
            return xid, oid, 9
        return None, _U32(buf, 1)[0], 5

    def _update(self, buf: bytes) -> Update:
        xid, oid, pos = self._xid_oid(buf)
        padded = buf + PAD
        action = buf[pos]
        old = old_kind = None
        if action == 75 or action == 79:  # 'K' old key, 'O' old row
            old_kind = "K" if action == 75 else "O"
            old, _, pos = parse_tuple(padded, pos + 1)
            action = buf[pos]
        if action != 78:
            raise _Malformed(f"expected 'K', 'O' or 'N' tuple, got {bytes([action])!r}")
        new, unchanged, end = parse_tuple(padded, pos + 1)
        _expect_end(buf, end)
        return _new(Update, (oid, new, unchanged, old, old_kind, xid))

    def _delete(self, buf: bytes) -> Delete:
        xid, oid, pos = self._xid_oid(buf)
        action = buf[pos]
        if action != 75 and action != 79:
            raise _Malformed(f"expected 'K' or 'O' tuple, got {bytes([action])!r}")
        old, _, end = parse_tuple(buf + PAD, pos + 1)
        _expect_end(buf, end)
        return _new(Delete, (oid, old, "K" if action == 75 else "O", xid))

    # -- everything else -----------------------------------------------------------------------
    def _stream_xid(self, buf: bytes) -> tuple[int | None, int]:
        return (_U32(buf, 1)[0], 5) if self.in_stream else (None, 1)

    def _begin(self, buf: bytes) -> Begin:
        _expect_end(buf, 21)
        return _new(Begin, _BEGIN(buf, 1))

    def _commit(self, buf: bytes) -> Commit:
        _expect_end(buf, 26)
        return _new(Commit, _COMMIT(buf, 1))

    def _origin(self, buf: bytes) -> Origin:
        (origin_lsn,) = _Q(buf, 1)
        name, end = _cstring(buf, 9)
        _expect_end(buf, end)
        return Origin(origin_lsn, name)

    def _relation(self, buf: bytes) -> Relation:
        xid, pos = self._stream_xid(buf)
        (oid,) = _U32(buf, pos)
        namespace, pos = _cstring(buf, pos + 4)
        name, pos = _cstring(buf, pos)
        replica_identity = chr(buf[pos])
        ncols = (buf[pos + 1] << 8) | buf[pos + 2]
        pos += 3
        columns = []
        for _ in range(ncols):
            flags = buf[pos]
            column_name, pos = _cstring(buf, pos + 1)
            type_oid, typmod = _COLUMN(buf, pos)
            pos += 8
            columns.append(Column(flags, column_name, type_oid, typmod))
        _expect_end(buf, pos)
        # An empty namespace means pg_catalog (the protocol saves the bytes).
        return Relation(oid, namespace or "pg_catalog", name, replica_identity, tuple(columns), xid)

    def _type(self, buf: bytes) -> Type:
        xid, pos = self._stream_xid(buf)
        (oid,) = _U32(buf, pos)
        namespace, pos = _cstring(buf, pos + 4)
        name, pos = _cstring(buf, pos)
        _expect_end(buf, pos)
        return Type(oid, namespace or "pg_catalog", name, xid)

    def _truncate(self, buf: bytes) -> Truncate:
        xid, pos = self._stream_xid(buf)
        nrelids, options = _TRUNCATE(buf, pos)
        pos += 5
        _expect_end(buf, pos + 4 * nrelids)
        oids = struct.unpack_from(f">{nrelids}I", buf, pos)
        return Truncate(oids, options, xid)

    def _message(self, buf: bytes) -> LogicalMessage:
        xid, pos = self._stream_xid(buf)
        flags, lsn = _MESSAGE(buf, pos)
        prefix, pos = _cstring(buf, pos + 9)
        (length,) = _U32(buf, pos)
        _expect_end(buf, pos + 4 + length)
        return LogicalMessage(bool(flags & 1), lsn, prefix, buf[pos + 4:], xid)

    def _stream_start(self, buf: bytes) -> StreamStart:
        if self.proto_version < 2:
            raise _Malformed(f"streaming needs proto_version >= 2, decoder has {self.proto_version}")
        if self.in_stream:
            raise _Malformed(f"Stream Start while the block of xid {self.stream_xid} is still open")
        _expect_end(buf, 6)
        (xid,) = _U32(buf, 1)
        self.in_stream, self.stream_xid = True, xid
        return StreamStart(xid, buf[5] == 1)

    def _stream_stop(self, buf: bytes) -> StreamStop:
        if not self.in_stream:
            raise _Malformed("Stream Stop outside a streamed block")
        _expect_end(buf, 1)
        self.in_stream, self.stream_xid = False, None
        return StreamStop()

    def _stream_commit(self, buf: bytes) -> StreamCommit:
        _expect_end(buf, 30)
        return _new(StreamCommit, _STREAM_COMMIT(buf, 1))

    def _stream_abort(self, buf: bytes) -> StreamAbort:
        if len(buf) == 25 and self.proto_version >= 4:  # streaming = parallel sends abort info
            return StreamAbort(*_STREAM_ABORT_V4(buf, 1))
        _expect_end(buf, 9)
        return StreamAbort(*_U32_U32(buf, 1))

    def _begin_prepare(self, buf: bytes) -> BeginPrepare:
        fields = _BEGIN_PREPARE(buf, 1)
        gid, end = _cstring(buf, 29)
        _expect_end(buf, end)
        return BeginPrepare(*fields, gid)

    def _prepare_like(self, buf: bytes, cls: Callable[..., Message]) -> Message:
        fields = _PREPARE(buf, 1)
        gid, end = _cstring(buf, 30)
        _expect_end(buf, end)
        return cls(*fields, gid)

    def _prepare(self, buf: bytes) -> Message:
        return self._prepare_like(buf, Prepare)

    def _stream_prepare(self, buf: bytes) -> Message:
        return self._prepare_like(buf, StreamPrepare)

    def _commit_prepared(self, buf: bytes) -> Message:
        return self._prepare_like(buf, CommitPrepared)  # same layout: flags, 2 LSNs, ts, xid, gid

    def _rollback_prepared(self, buf: bytes) -> RollbackPrepared:
        fields = _ROLLBACK_PREPARED(buf, 1)
        gid, end = _cstring(buf, 38)
        _expect_end(buf, end)
        return RollbackPrepared(*fields, gid)


_HANDLERS: dict[int, Callable[[PgOutputDecoder, bytes], Message]] = {
    ord("B"): PgOutputDecoder._begin,
    ord("C"): PgOutputDecoder._commit,
    ord("O"): PgOutputDecoder._origin,
    ord("R"): PgOutputDecoder._relation,
    ord("Y"): PgOutputDecoder._type,
    ord("T"): PgOutputDecoder._truncate,
    ord("M"): PgOutputDecoder._message,
    ord("S"): PgOutputDecoder._stream_start,
    ord("E"): PgOutputDecoder._stream_stop,
    ord("c"): PgOutputDecoder._stream_commit,
    ord("A"): PgOutputDecoder._stream_abort,
    ord("b"): PgOutputDecoder._begin_prepare,
    ord("P"): PgOutputDecoder._prepare,
    ord("p"): PgOutputDecoder._stream_prepare,
    ord("K"): PgOutputDecoder._commit_prepared,
    ord("r"): PgOutputDecoder._rollback_prepared,
}
