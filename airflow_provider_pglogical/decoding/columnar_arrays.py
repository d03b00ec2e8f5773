"""Array primitives of the columnar decoder: the joined COPY buffer, big-endian reads, TupleData walks.

Every function works on all rows at once (numpy over offsets into one buffer); the decoder in
:mod:`.columnar` composes them. Anything unexpected raises :class:`NeedsAssembler`, never a guess.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import as_strided

from airflow_provider_pglogical.decoding import wire

PAD = bytes(16)  # lets fixed-width reads run past a message's end without bounds checks
_FRAME = wire.ROW_FRAME_SIZE
_NULL, _TOAST, _TEXT = wire.NULL[0], wire.UNCHANGED_TOAST[0], wire.TEXT[0]
_VECTORISED_TUPLE_KINDS = np.zeros(256, bool)
_VECTORISED_TUPLE_KINDS[[_NULL, _TOAST, _TEXT]] = True


class NeedsAssembler(Exception):
    """The window holds something only the message-by-message assembler handles (or reports)."""


@dataclass
class Buffer:
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
        return be(self.rows(positions, width), 0, width, signed)

    def rows(self, positions: np.ndarray, width: int) -> np.ndarray:
        """``width`` bytes at each of ``positions``, one gather: (len(positions), width) uint8.

        Positions are spread over the whole buffer, so each read is a cache miss: read every
        field a step needs in one gather rather than one gather per field.
        """
        windows = as_strided(self.u8, shape=(len(self.u8) - width + 1, width), strides=(1, 1))
        return windows[positions]

    def message(self, index: int) -> bytes:
        return self.data[self.start[index]:self.end[index]]


def be(rows: np.ndarray, offset: int, width: int, signed: bool = False) -> np.ndarray:
    """The big-endian integer in bytes ``offset:offset+width`` of each row of a gather, as int64."""
    field = np.ascontiguousarray(rows[:, offset:offset + width])
    return field.view(f">{'i' if signed else 'u'}{width}")[:, 0].astype(np.int64)


def frame(chunks: Sequence[bytes]) -> Buffer:
    """Join the COPY chunks (one row each, as psycopg2 delivers them) and locate every message."""
    if not chunks:
        raise NeedsAssembler("empty window")
    data = b"".join(itertools.chain(chunks, (PAD,)))
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
    buf = Buffer(data, u8, pa.py_buffer(data), starts + _FRAME, starts + lengths, none, none.astype(np.uint64))
    if len(starts) == 0:
        return buf
    # wire.ROW_FRAME (field count, LSN length, LSN, data length), then the message's first 8 bytes.
    frames = buf.rows(starts, _FRAME + 8)
    if (lengths <= _FRAME).any() or (be(frames, 0, 2) != 2).any() or (be(frames, 2, 4) != 8).any() \
            or (be(frames, 14, 4) != lengths - _FRAME).any():
        raise NeedsAssembler("COPY rows are not one per chunk")
    buf.lsn = be(frames, 6, 8)
    buf.head = np.ascontiguousarray(frames[:, _FRAME:_FRAME + 8]).view(">u8")[:, 0].astype(np.uint64)
    return buf


@dataclass
class Tuples:
    """A TupleData walk over many messages: per column, kind byte, value start and length."""

    kinds: np.ndarray  # (ncols, rows) uint8
    starts: np.ndarray  # (ncols, rows) int64
    lengths: np.ndarray  # (ncols, rows) int64
    end: np.ndarray  # (rows,) offset after the tuple


def walk(buf: Buffer, positions: np.ndarray, ncols: int) -> Tuples:
    """Walk TupleData starting at ``positions`` (the Int16 column count), all rows at once."""
    rows = len(positions)
    if rows and (buf.be(positions, 2) != ncols).any():
        raise NeedsAssembler("a tuple's column count differs from its Relation message")
    kinds = np.empty((ncols, rows), np.uint8)
    starts = np.empty((ncols, rows), np.int64)
    lengths = np.empty((ncols, rows), np.int64)
    pos = positions + 2
    limit = len(buf.u8) - len(PAD)
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
    return Tuples(kinds, starts, lengths, pos)


def gather_text(buf: Buffer, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
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
