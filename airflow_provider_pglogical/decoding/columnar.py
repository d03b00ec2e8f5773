"""Vectorised decode of one peek window: numpy over all messages at once, Arrow columns directly.

The message-by-message assembler (:mod:`.changes`) costs a few microseconds of Python per row
change, which made the pull several times slower than PostgreSQL's own peek. Here the binary
COPY of ``(lsn, data)`` rows is joined into one buffer and every step is an array operation over
rows: framing, message kinds, Begin/Commit fields, and the TupleData walk, column by column over
all rows of a table at once. A column's values are then gathered straight out of the buffer into
an Arrow array (a ``take`` over an array whose offsets interleave gaps and values), so no Python
object is made per value. Only the rare messages (Relation, Type, Origin, Truncate, Message) are
decoded one by one, with :class:`~.pgoutput.PgOutputDecoder`.

It covers what a ``proto_version`` 1 peek without ``streaming``/``two_phase`` sends: complete
transactions of text-format tuples. Anything else raises :class:`NeedsAssembler` *before*
anything is returned, and the caller decodes the same rows with the message-by-message assembler,
which handles every message of protocols 1 to 4 and reports malformed input precisely.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import as_strided

from airflow_provider_pglogical.decoding import staged_tables, wire
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.decoding.window import DecodedWindow, empty_window, message_record, schema_change_record
from airflow_provider_pglogical.decoding.pgoutput import LogicalMessage, PgOutputDecoder, Relation, Truncate

_PAD = bytes(16)  # lets fixed-width reads run past a message's end without bounds checks
_FRAME = wire.ROW_FRAME_SIZE

_B, _C, _I, _U, _D, _T, _M, _R = (kind[0] for kind in (wire.BEGIN, wire.COMMIT, wire.INSERT, wire.UPDATE,
                                                       wire.DELETE, wire.TRUNCATE, wire.MESSAGE, wire.RELATION))
_KEY, _OLD, _NEW = wire.OLD_KEY[0], wire.OLD_ROW[0], wire.NEW_ROW[0]
_NULL, _TOAST, _TEXT = wire.NULL[0], wire.UNCHANGED_TOAST[0], wire.TEXT[0]
_VECTORISED_KINDS = np.frombuffer(wire.BEGIN + wire.COMMIT + wire.ORIGIN + wire.RELATION + wire.TYPE + wire.INSERT
                                  + wire.UPDATE + wire.DELETE + wire.TRUNCATE + wire.MESSAGE, np.uint8)
_VECTORISED_TUPLE_KINDS = np.zeros(256, bool)
_VECTORISED_TUPLE_KINDS[[_NULL, _TOAST, _TEXT]] = True
_OPS = pa.array(["I", "U", "D", "T"])


#: rows per unit of parallel work: numpy and Arrow release the GIL, so parts decode and build on
#: separate cores; a part is large enough that per-call overhead stays small
PART_ROWS = 100_000
WORKERS = max(1, min(4, os.cpu_count() or 1))


def _parts(rows: np.ndarray) -> list[np.ndarray]:
    count = min(WORKERS, -(-len(rows) // PART_ROWS))
    return np.array_split(rows, count) if count > 1 else [rows]


class NeedsAssembler(Exception):
    """The window holds something only the message-by-message assembler handles (or reports)."""


@dataclass
class _Buffer:
    """The joined COPY stream, its numpy view and one entry per ``(lsn, data)`` row."""

    data: bytes
    u8: np.ndarray
    arrow: pa.Buffer
    start: np.ndarray  # offset of each message's first byte
    end: np.ndarray  # offset one past each message's last byte
    lsn: np.ndarray
    head: np.ndarray  # each message's first 8 bytes as a big-endian uint64 (kind, oid, marker, ncols)

    def be(self, positions: np.ndarray, width: int, signed: bool = False) -> np.ndarray:
        """Big-endian integers of ``width`` bytes at ``positions``, as int64."""
        return _be(self.rows(positions, width), 0, width, signed)

    def rows(self, positions: np.ndarray, width: int) -> np.ndarray:
        """``width`` bytes at each of ``positions``, one gather: (len(positions), width) uint8.

        Positions are spread over the whole buffer, so each read is a cache miss: read every
        field a step needs in one gather rather than one gather per field.
        """
        windows = as_strided(self.u8, shape=(len(self.u8) - width + 1, width), strides=(1, 1))
        return windows[positions]

    def message(self, index: int) -> bytes:
        return self.data[self.start[index]:self.end[index]]


def _be(rows: np.ndarray, offset: int, width: int, signed: bool = False) -> np.ndarray:
    """The big-endian integer in bytes ``offset:offset+width`` of each row of a gather, as int64."""
    field = np.ascontiguousarray(rows[:, offset:offset + width])
    return field.view(f">{'i' if signed else 'u'}{width}")[:, 0].astype(np.int64)


def _frame(chunks: Sequence[bytes]) -> _Buffer:
    """Join the COPY chunks (one row each, as psycopg2 delivers them) and locate every message."""
    if not chunks:
        raise NeedsAssembler("empty window")
    data = b"".join(itertools.chain(chunks, (_PAD,)))
    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    starts = np.zeros(len(chunks), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    header = wire.COPY_HEADER_SIZE
    if not data.startswith(wire.COPY_SIGNATURE) or data[header - 4:header] != bytes(4) or lengths[0] < header:
        raise NeedsAssembler("no binary COPY header")
    starts[0] += header
    lengths[0] -= header
    keep = lengths > 0
    if lengths[-1] == len(wire.COPY_TRAILER) and data[starts[-1]:starts[-1] + 2] == wire.COPY_TRAILER:
        keep[-1] = False  # the trailer: alone, or all that follows the header in the first chunk
    starts, lengths = starts[keep], lengths[keep]
    u8 = np.frombuffer(data, np.uint8)
    none = np.empty(0, np.int64)
    buf = _Buffer(data, u8, pa.py_buffer(data), starts + _FRAME, starts + lengths, none, none.astype(np.uint64))
    if len(starts) == 0:
        return buf
    # wire.ROW_FRAME (field count, LSN length, LSN, data length), then the message's first 8 bytes.
    frames = buf.rows(starts, _FRAME + 8)
    if (lengths <= _FRAME).any() or (_be(frames, 0, 2) != 2).any() or (_be(frames, 2, 4) != 8).any() \
            or (_be(frames, 14, 4) != lengths - _FRAME).any():
        raise NeedsAssembler("COPY rows are not one per chunk")
    buf.lsn = _be(frames, 6, 8)
    buf.head = np.ascontiguousarray(frames[:, _FRAME:_FRAME + 8]).view(">u8")[:, 0].astype(np.uint64)
    return buf


@dataclass
class _Tuples:
    """A TupleData walk over many messages: per column, kind byte, value start and length."""

    kinds: np.ndarray  # (ncols, rows) uint8
    starts: np.ndarray  # (ncols, rows) int64
    lengths: np.ndarray  # (ncols, rows) int64
    end: np.ndarray  # (rows,) offset after the tuple


def _walk(buf: _Buffer, positions: np.ndarray, ncols: int) -> _Tuples:
    """Walk TupleData starting at ``positions`` (the Int16 column count), all rows at once."""
    rows = len(positions)
    if rows and (buf.be(positions, 2) != ncols).any():
        raise NeedsAssembler("a tuple's column count differs from its Relation message")
    kinds = np.empty((ncols, rows), np.uint8)
    starts = np.empty((ncols, rows), np.int64)
    lengths = np.empty((ncols, rows), np.int64)
    pos = positions + 2
    limit = len(buf.u8) - len(_PAD)
    for j in range(ncols):
        if rows and pos.max() >= limit:
            raise NeedsAssembler("tuple data runs past the window")
        word = buf.rows(pos, 8).view(">u8")[:, 0].astype(np.uint64)  # kind byte, then a text value's length
        kind = kinds[j] = (word >> np.uint64(56)).astype(np.uint8)
        if not _VECTORISED_TUPLE_KINDS[kind].all():
            raise NeedsAssembler("binary-format or malformed tuple data")
        text = kind == _TEXT
        size = lengths[j] = ((word >> np.uint64(24)) & np.uint64(0xFFFFFFFF)).astype(np.int64) * text
        start = starts[j] = pos + 1 + 4 * text
        pos = start + size
    return _Tuples(kinds, starts, lengths, pos)


def _gather_text(buf: _Buffer, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
    """Values ``buf[start:start+length]`` as a large_string array (null where not ``valid``).

    The offsets alternate gap, value, gap, value... over the buffer, so ``take`` of the odd
    elements copies the values out in C++; starts must not decrease (rows in buffer order).
    """
    n = len(starts)
    offsets = np.empty(2 * n + 1, np.int64)
    offsets[0] = 0
    offsets[1::2] = starts
    offsets[2::2] = starts + lengths
    spans = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * n, [None, pa.py_buffer(offsets), buf.arrow])
    picked = spans.take(pa.array(np.arange(1, 2 * n, 2), mask=~valid))
    return picked.cast(pa.large_string())


@dataclass
class _Group:
    """Rows of one table under one Relation version."""

    relation: Relation
    index: np.ndarray  # message index of each row (increasing)
    txn: np.ndarray  # transaction number of each row
    seq: np.ndarray
    op: np.ndarray  # 0 I, 1 U, 2 D
    values: _Tuples  # the new tuple (I, U) or the old one (D)
    old_rows: np.ndarray  # rows (positions in this group) of UPDATEs that sent an old tuple
    old: _Tuples | None  # those old tuples


@dataclass
class _Transactions:
    xid: np.ndarray
    commit_lsn: np.ndarray
    end_lsn: np.ndarray
    commit_ts: np.ndarray  # Unix microseconds


@dataclass
class ColumnarTable(staged_tables.StagedTableNames):
    """One table's changes in the window, built into the staged Arrow table on demand."""

    relation: Relation  # newest version
    buffer: _Buffer
    txns: _Transactions
    groups: list[_Group] = field(default_factory=list)
    truncates: list[tuple[int, int, int]] = field(default_factory=list)  # (message index, txn, seq)
    columns: list[dict] = field(default_factory=list)

    @property
    def versions(self) -> list[Relation]:
        return [self.relation] + [g.relation for g in self.groups]

    @property
    def truncated(self) -> bool:
        return bool(self.truncates)

    def build(self, types: staged_tables.TypeInfo, type_overrides=None) -> pa.Table:
        self.columns = staged_tables.union_columns(self.versions, types, type_overrides)
        key = self.key
        schema = staged_tables.change_schema(self.columns, key)
        if len(self.groups) > 1:
            with ThreadPoolExecutor(WORKERS) as pool:
                parts = list(pool.map(lambda g: self._group_table(g, key, schema), self.groups))
        else:
            parts = [self._group_table(g, key, schema) for g in self.groups]
        order = [g.index for g in self.groups]
        if self.truncates:
            parts.append(self._truncate_table(schema))
            order.append(np.array([t[0] for t in self.truncates], np.int64))
        if len(parts) == 1:
            return parts[0]
        table = pa.concat_tables(parts)
        index = np.concatenate(order)
        if (np.diff(index) < 0).any():  # schema versions or truncates interleave: back to message order
            table = table.take(pa.array(np.argsort(index, kind="stable")))
        return table

    def _meta(self, op: pa.Array, txn: np.ndarray, seq: np.ndarray) -> list[pa.Array]:
        t = self.txns
        return [
            op,
            pa.array(t.commit_lsn[txn]),
            pa.array(seq.astype(np.int64)),
            pa.array(t.xid[txn]),
            pa.array(t.commit_ts[txn]).cast(pa.timestamp("us", tz="UTC")),
        ]

    def _truncate_table(self, schema: pa.Schema) -> pa.Table:
        n = len(self.truncates)
        txn = np.array([t[1] for t in self.truncates], np.int64)
        seq = np.array([t[2] for t in self.truncates], np.int64)
        arrays = self._meta(pa.array(["T"] * n), txn, seq)
        arrays += [pa.nulls(n, f.type) for f in list(schema)[5:]]
        return pa.Table.from_arrays(arrays, schema=schema)

    def _group_table(self, group: _Group, key: list[str], schema: pa.Schema) -> pa.Table:
        rel, vals, n = group.relation, group.values, len(group.index)
        position = {c.name: i for i, c in enumerate(rel.columns)}
        arrays = self._meta(_OPS.take(pa.array(group.op)), group.txn, group.seq)
        arrays.append(self._unchanged(group, position))
        for entry in self.columns:
            name = entry["name"]
            mapped = staged_tables.mapped_type(entry)
            j = position.get(name)
            if j is None:
                arrays.append(pa.nulls(n, mapped.arrow))
                continue
            texts = _gather_text(self.buffer, vals.starts[j], vals.lengths[j], vals.kinds[j] == _TEXT)
            arrays.append(values.text_to_arrow(texts, mapped, name, self.qualified_name))
        key_index = {rel.columns[i].name: i for i in rel.key_indices}
        for name in key:
            mapped = staged_tables.mapped_type(next(c for c in self.columns if c["name"] == name))
            j = key_index.get(name)
            if group.old is None or j is None:
                arrays.append(pa.nulls(n, mapped.arrow))
                continue
            # Rows without an old tuple take an empty span at their own value's start: offsets stay sorted.
            starts = vals.starts[0].copy()
            lengths = np.zeros(n, np.int64)
            valid = np.zeros(n, bool)
            starts[group.old_rows] = group.old.starts[j]
            lengths[group.old_rows] = group.old.lengths[j]
            valid[group.old_rows] = group.old.kinds[j] == _TEXT
            texts = _gather_text(self.buffer, starts, lengths, valid)
            arrays.append(values.text_to_arrow(texts, mapped, name, self.qualified_name))
        return pa.Table.from_arrays(arrays, schema=schema)

    def _unchanged(self, group: _Group, position: dict[str, int]) -> pa.Array:
        """Per row, the columns the lakehouse must keep: sent as 'u' (not for DELETEs), or, for an
        UPDATE under an older schema version, absent from it."""
        n = len(group.index)
        names = [c.name for c in group.relation.columns]
        absent = [c["name"] for c in self.columns if c["name"] not in position]
        toast = (group.values.kinds == _TOAST) & (group.op != 2)
        rows = np.nonzero(toast.any(axis=0))[0] if len(names) else np.empty(0, np.int64)
        updates = np.nonzero(group.op == 1)[0] if absent else np.empty(0, np.int64)
        if not len(rows) and not len(updates):
            return pa.nulls(n, staged_tables.UNCHANGED_TYPE)
        out: list[list[str] | None] = [None] * n
        for row in rows.tolist():
            out[row] = [names[j] for j in np.nonzero(toast[:, row])[0].tolist()]
        for row in updates.tolist():
            out[row] = (out[row] or []) + absent
        return pa.array(out, staged_tables.UNCHANGED_TYPE)


def decode_window(chunks: Sequence[bytes], proto_version: int) -> DecodedWindow:
    """Decode the binary COPY rows of one ``pg_logical_slot_peek_binary_changes`` call.

    :raises NeedsAssembler: the window needs the message-by-message assembler.
    """
    if proto_version != 1:
        raise NeedsAssembler(f"proto_version {proto_version}")
    buf = _frame(chunks)
    count = len(buf.start)
    nbytes = int((buf.end - buf.start).sum())
    if count == 0:
        return empty_window()
    kind = (buf.head >> np.uint64(56)).astype(np.uint8)
    if not np.isin(kind, _VECTORISED_KINDS).all():
        raise NeedsAssembler("streamed or two-phase messages")
    txns, begins, commits = _transactions(buf, kind)
    txn_of = np.searchsorted(begins, np.arange(count), side="right") - 1
    inside = (txn_of >= 0) & (np.arange(count) < commits[np.maximum(txn_of, 0)]) if len(begins) \
        else np.zeros(count, bool)

    is_data = (kind == _I) | (kind == _U) | (kind == _D)
    if not inside[is_data].all():
        raise NeedsAssembler("a row change outside a transaction")
    counted = is_data.copy()  # what takes a sequence number: rows, truncates, transactional messages
    decoder = PgOutputDecoder(proto_version)
    known: dict[int, Relation] = {}
    versions: dict[int, list[tuple[int, Relation]]] = {}
    truncates: list[tuple[int, Truncate]] = []
    loose_messages: list[dict] = []
    txn_messages: list[tuple[int, LogicalMessage]] = []
    schema_changes: list[dict] = []
    for i in np.nonzero(~is_data & (kind != _B) & (kind != _C))[0].tolist():
        msg = decoder.decode(buf.message(i), int(buf.lsn[i]))
        k = kind[i]
        if k == _R:
            previous = known.get(msg.oid)
            if previous is not None and previous == msg:
                continue
            known[msg.oid] = msg
            versions.setdefault(msg.oid, []).append((i, msg))
            if previous is not None:
                schema_changes.append(schema_change_record(msg, previous, int(buf.lsn[i])))
        elif k == _T or (k == _M and msg.transactional):
            if not inside[i]:
                raise NeedsAssembler("a transactional message outside a transaction")
            counted[i] = True
            if k == _T:
                truncates.append((i, msg))
            else:
                txn_messages.append((i, msg))
        elif k == _M:
            loose_messages.append(message_record(msg, False))
    cumulative = np.cumsum(counted) - counted
    seq = cumulative - cumulative[begins][np.maximum(txn_of, 0)] if len(begins) else cumulative

    tables: dict[int, ColumnarTable] = {}
    work: list[tuple[ColumnarTable, Relation, np.ndarray]] = []
    data_index = np.nonzero(is_data)[0]
    oids = ((buf.head[data_index] >> np.uint64(24)) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    for oid in np.unique(oids).tolist():
        rows = data_index[oids == oid]
        history = versions.get(oid)
        if not history or history[0][0] > rows[0]:
            raise NeedsAssembler(f"a change of relation oid {oid} before its Relation message")
        table = tables[oid] = ColumnarTable(history[-1][1], buf, txns)
        version = np.searchsorted(np.array([h[0] for h in history]), rows, side="right") - 1
        for v in np.unique(version).tolist():
            work += [(table, history[v][1], part) for part in _parts(rows[version == v])]
    with ThreadPoolExecutor(WORKERS) as pool:
        groups = pool.map(lambda w: _group(buf, w[1], w[2], txn_of[w[2]], seq[w[2]], kind[w[2]]), work)
        for (table, _rel, _rows), group in zip(work, groups):
            table.groups.append(group)
    for i, msg in truncates:
        for oid in msg.relation_oids:
            if oid not in known:
                continue  # a table of the TRUNCATE that these publications do not publish
            if oid not in tables:
                tables[oid] = ColumnarTable(known[oid], buf, txns)
            tables[oid].truncates.append((i, int(txn_of[i]), int(seq[i])))
    messages = loose_messages + [message_record(m, True, int(txns.commit_lsn[txn_of[i]])) for i, m in txn_messages]
    return DecodedWindow(tables, len(begins), int(txns.end_lsn[-1]) if len(begins) else None, messages,
                          schema_changes, count, nbytes)


def _transactions(buf: _Buffer, kind: np.ndarray) -> tuple[_Transactions, np.ndarray, np.ndarray]:
    """Begin/Commit pairs (they must alternate and close), with their fields read column-wise."""
    bounds = np.nonzero((kind == _B) | (kind == _C))[0]
    if len(bounds) % 2 or not (kind[bounds[0::2]] == _B).all() or not (kind[bounds[1::2]] == _C).all():
        raise NeedsAssembler("transactions do not pair up (an open transaction at the window's end?)")
    begins, commits = bounds[0::2], bounds[1::2]
    if ((buf.end[begins] - buf.start[begins]) != wire.BEGIN_SIZE).any() \
            or ((buf.end[commits] - buf.start[commits]) != wire.COMMIT_SIZE).any():
        raise NeedsAssembler("malformed Begin or Commit")
    b, c = buf.start[begins], buf.start[commits]
    txns = _Transactions(
        xid=buf.be(b + wire.BEGIN_XID_AT, 4), commit_lsn=buf.be(c + wire.COMMIT_LSN_AT, 8),
        end_lsn=buf.be(c + wire.COMMIT_END_LSN_AT, 8),
        commit_ts=buf.be(c + wire.COMMIT_TS_AT, 8, signed=True) + wire.PG_EPOCH_UNIX_US,
    )
    return txns, begins, commits


def _group(buf: _Buffer, rel: Relation, index: np.ndarray, txn: np.ndarray, seq: np.ndarray,
           kind: np.ndarray) -> _Group:
    """Walk the tuples of one table version's rows.

    The values of a row are its new tuple (INSERT, UPDATE) or its old one (DELETE), and every row
    has exactly one: one walk over all rows finds them. An UPDATE's old key or old row comes before
    its new tuple, so those (few) are walked first, to find where the new tuple starts.
    """
    ncols = len(rel.columns)
    start = buf.start[index]
    marker = ((buf.head[index] >> np.uint64(16)) & np.uint64(0xFF)).astype(np.uint8)
    has_old = (marker == _KEY) | (marker == _OLD)
    is_delete = kind == _D
    if not ((marker == _NEW) | has_old).all() or (has_old & (kind == _I)).any() or (is_delete & ~has_old).any():
        raise NeedsAssembler("unexpected tuple marker")
    old_rows = np.nonzero(has_old & ~is_delete)[0]
    values_at = start + 6
    old = None
    if len(old_rows):
        old = _walk(buf, start[old_rows] + 6, ncols)
        if (buf.u8[old.end] != _NEW).any():
            raise NeedsAssembler("an UPDATE's old tuple is not followed by its new tuple")
        values_at[old_rows] = old.end + 1
    tuples = _walk(buf, values_at, ncols)
    if (tuples.end != buf.end[index]).any():
        raise NeedsAssembler("a row change does not end where its message ends")
    op = np.select([kind == _I, kind == _U], [0, 1], 2).astype(np.int8)
    return _Group(rel, index, txn, seq, op, tuples, old_rows, old)
