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

from airflow_provider_pglogical.decoding import wire
from airflow_provider_pglogical.decoding.wire import MESSAGE_NAMES
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


_U32 = wire.U32.unpack_from  # data messages: bound once, read per message
_XID_OID = wire.XID_OID.unpack_from
_INSERT, _UPDATE, _DELETE = wire.INSERT[0], wire.UPDATE[0], wire.DELETE[0]
_OLD_KEY, _OLD_ROW, _NEW_ROW = wire.OLD_KEY[0], wire.OLD_ROW[0], wire.NEW_ROW[0]
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
            if kind == _INSERT:  # Insert: 'I' [xid] oid 'N' ncols ...
                if self.in_stream:
                    return INSERT_DECODERS[(buf[10] << 8) | buf[11]](buf, 5, _U32(buf, 1)[0])
                return INSERT_DECODERS[(buf[6] << 8) | buf[7]](buf, 1, None)
            if kind == _UPDATE:  # Update: 'U' [xid] oid ('K'|'O' old tuple)? 'N' new tuple
                if self.in_stream:
                    if buf[9] == _NEW_ROW:
                        return UPDATE_DECODERS[(buf[10] << 8) | buf[11]](buf, 5, _U32(buf, 1)[0])
                elif buf[5] == _NEW_ROW:
                    return UPDATE_DECODERS[(buf[6] << 8) | buf[7]](buf, 1, None)
                return self._update(buf)
            if kind == _DELETE:
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
            xid, oid = _XID_OID(buf, 1)
            return xid, oid, 9
        return None, _U32(buf, 1)[0], 5

    def _update(self, buf: bytes) -> Update:
        xid, oid, pos = self._xid_oid(buf)
        padded = buf + PAD
        action = buf[pos]
        old = old_kind = None
        if action == _OLD_KEY or action == _OLD_ROW:
            old_kind = chr(action)
            old, _, pos = parse_tuple(padded, pos + 1)
            action = buf[pos]
        if action != _NEW_ROW:
            raise _Malformed(f"expected 'K', 'O' or 'N' tuple, got {bytes([action])!r}")
        new, unchanged, end = parse_tuple(padded, pos + 1)
        _expect_end(buf, end)
        return _new(Update, (oid, new, unchanged, old, old_kind, xid))

    def _delete(self, buf: bytes) -> Delete:
        xid, oid, pos = self._xid_oid(buf)
        action = buf[pos]
        if action != _OLD_KEY and action != _OLD_ROW:
            raise _Malformed(f"expected 'K' or 'O' tuple, got {bytes([action])!r}")
        old, _, end = parse_tuple(buf + PAD, pos + 1)
        _expect_end(buf, end)
        return _new(Delete, (oid, old, chr(action), xid))

    # -- everything else -----------------------------------------------------------------------
    def _stream_xid(self, buf: bytes) -> tuple[int | None, int]:
        return (_U32(buf, 1)[0], 5) if self.in_stream else (None, 1)

    def _begin(self, buf: bytes) -> Begin:
        _expect_end(buf, wire.BEGIN_SIZE)
        return _new(Begin, wire.BEGIN_FIELDS.unpack_from(buf, 1))

    def _commit(self, buf: bytes) -> Commit:
        _expect_end(buf, wire.COMMIT_SIZE)
        return _new(Commit, wire.COMMIT_FIELDS.unpack_from(buf, 1))

    def _origin(self, buf: bytes) -> Origin:
        (origin_lsn,) = wire.ORIGIN_FIELDS.unpack_from(buf, 1)
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
            type_oid, typmod = wire.COLUMN_FIELDS.unpack_from(buf, pos)
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
        nrelids, options = wire.TRUNCATE_FIELDS.unpack_from(buf, pos)
        pos += 5
        _expect_end(buf, pos + 4 * nrelids)
        oids = struct.unpack_from(f">{nrelids}I", buf, pos)
        return Truncate(oids, options, xid)

    def _message(self, buf: bytes) -> LogicalMessage:
        xid, pos = self._stream_xid(buf)
        flags, lsn = wire.MESSAGE_FIELDS.unpack_from(buf, pos)
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
        _expect_end(buf, 1 + wire.STREAM_COMMIT_FIELDS.size)
        return _new(StreamCommit, wire.STREAM_COMMIT_FIELDS.unpack_from(buf, 1))

    def _stream_abort(self, buf: bytes) -> StreamAbort:
        if len(buf) == 1 + wire.STREAM_ABORT_V4_FIELDS.size and self.proto_version >= 4:  # streaming = parallel sends abort info
            return StreamAbort(*wire.STREAM_ABORT_V4_FIELDS.unpack_from(buf, 1))
        _expect_end(buf, 1 + wire.STREAM_ABORT_FIELDS.size)
        return StreamAbort(*wire.STREAM_ABORT_FIELDS.unpack_from(buf, 1))

    def _begin_prepare(self, buf: bytes) -> BeginPrepare:
        fields = wire.BEGIN_PREPARE_FIELDS.unpack_from(buf, 1)
        gid, end = _cstring(buf, 1 + wire.BEGIN_PREPARE_FIELDS.size)
        _expect_end(buf, end)
        return BeginPrepare(*fields, gid)

    def _prepare_like(self, buf: bytes, cls: Callable[..., Message]) -> Message:
        fields = wire.PREPARE_FIELDS.unpack_from(buf, 1)
        gid, end = _cstring(buf, 1 + wire.PREPARE_FIELDS.size)
        _expect_end(buf, end)
        return cls(*fields, gid)

    def _prepare(self, buf: bytes) -> Message:
        return self._prepare_like(buf, Prepare)

    def _stream_prepare(self, buf: bytes) -> Message:
        return self._prepare_like(buf, StreamPrepare)

    def _commit_prepared(self, buf: bytes) -> Message:
        return self._prepare_like(buf, CommitPrepared)  # same layout: flags, 2 LSNs, ts, xid, gid

    def _rollback_prepared(self, buf: bytes) -> RollbackPrepared:
        fields = wire.ROLLBACK_PREPARED_FIELDS.unpack_from(buf, 1)
        gid, end = _cstring(buf, 1 + wire.ROLLBACK_PREPARED_FIELDS.size)
        _expect_end(buf, end)
        return RollbackPrepared(*fields, gid)


_HANDLERS: dict[int, Callable[[PgOutputDecoder, bytes], Message]] = {
    wire.BEGIN[0]: PgOutputDecoder._begin,
    wire.COMMIT[0]: PgOutputDecoder._commit,
    wire.ORIGIN[0]: PgOutputDecoder._origin,
    wire.RELATION[0]: PgOutputDecoder._relation,
    wire.TYPE[0]: PgOutputDecoder._type,
    wire.TRUNCATE[0]: PgOutputDecoder._truncate,
    wire.MESSAGE[0]: PgOutputDecoder._message,
    wire.STREAM_START[0]: PgOutputDecoder._stream_start,
    wire.STREAM_STOP[0]: PgOutputDecoder._stream_stop,
    wire.STREAM_COMMIT[0]: PgOutputDecoder._stream_commit,
    wire.STREAM_ABORT[0]: PgOutputDecoder._stream_abort,
    wire.BEGIN_PREPARE[0]: PgOutputDecoder._begin_prepare,
    wire.PREPARE[0]: PgOutputDecoder._prepare,
    wire.STREAM_PREPARE[0]: PgOutputDecoder._stream_prepare,
    wire.COMMIT_PREPARED[0]: PgOutputDecoder._commit_prepared,
    wire.ROLLBACK_PREPARED[0]: PgOutputDecoder._rollback_prepared,
}
