"""TupleData parsing for the pgoutput decoder: the hot path of change decoding.

A TupleData is ``Int16 ncols`` followed, per column, by a kind byte: ``'n'`` (NULL), ``'u'``
(unchanged TOASTed value, no data), ``'t'`` (text) or ``'b'`` (binary), the last two followed by
``Int32 length`` and the bytes.

Representation (chosen for speed, measured in ``bench/bench_decoder.py``):

* a row is a plain ``tuple`` with one item per column, no per-column wrapper objects;
* ``'t'`` values are the raw ``bytes`` of PostgreSQL's text output (server encoding, UTF-8 in
  practice). Not decoding to ``str`` saves one Python call per value, and Arrow validates UTF-8 in
  C when the caller casts a binary column to string;
* ``'b'`` values are :class:`BinaryValue` (a ``bytes`` subclass), so a caller that asked for
  ``binary`` can tell the type's send format from text output;
* NULL is ``None``; an unchanged TOASTed value is the :data:`UNCHANGED_TOAST` sentinel.

Speed: columns are parsed by straight-line code generated once per column count (the same
technique ``collections.namedtuple`` uses): no per-column loop, no list, one tuple built at the
end. Insert messages, and Update messages without an old tuple (the bulk of any stream), are
decoded whole in one such frame (:data:`INSERT_DECODERS`, :data:`UPDATE_DECODERS`); other tuples
go through :func:`tuple_parser`. Parsers read a message with :data:`PAD` appended so the combined
``kind + length`` read of a 1-byte ``'n'``/``'u'`` column at the very end never runs past it.
What remains is the per-column bytecode: about 3x the cost of merely slicing the same values out
at known offsets (see the benchmark's reference lines).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

from airflow_provider_pglogical.decoding import wire
from airflow_provider_pglogical.decoding.messages import Insert, Update

__all__ = [
    "UNCHANGED_TOAST", "BinaryValue", "TupleDataError", "PAD", "INSERT_DECODERS", "UPDATE_DECODERS",
    "parse_tuple", "tuple_parser",
]


class _UnchangedToast:
    """Type of :data:`UNCHANGED_TOAST`; a singleton so ``value is UNCHANGED_TOAST`` is the test."""

    __slots__ = ()
    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"

    def __reduce__(self) -> str:  # pickles (e.g. to another process) as the same singleton
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()
"""A column sent as ``'u'``: its TOASTed value did not change and was not sent. Not ``None`` (that is
SQL NULL) and not a string, so it cannot be mistaken for data."""


class BinaryValue(bytes):
    """A column sent as ``'b'`` (binary send format; only when the ``binary`` option is on)."""

    __slots__ = ()


class TupleDataError(ValueError):
    """Malformed TupleData; the decoder re-raises it naming the message and its LSN."""


PAD: Final = b"\x00\x00\x00\x00"
"""Appended to a message before parsing its tuples (see the module docstring)."""

_KIND_LEN = struct.Struct(">BI").unpack_from
_NEW_TUPLE_HEADER = struct.Struct(">IcH").unpack_from  # relation oid, 'N', column count
_LEN = wire.U32.unpack_from
_KIND_N, _KIND_U, _KIND_T, _KIND_B = wire.NULL[0], wire.UNCHANGED_TOAST[0], wire.TEXT[0], wire.BINARY[0]
# Above this column count the generated code would be long; a loop is used instead.
_MAX_GENERATED = 64

Parser = Callable[[bytes, int], "tuple[tuple[object, ...], int, bool]"]


def _rare_column(buf: bytes, pos: int, kind: int) -> tuple[object, int]:
    """Parse a column that is neither ``'t'`` nor ``'n'``; return ``(value, next_pos)``."""
    if kind == _KIND_U:
        return UNCHANGED_TOAST, pos + 1
    if kind == _KIND_B:
        (length,) = _LEN(buf, pos + 1)
        end = pos + 5 + length
        if end > len(buf) - len(PAD):
            raise TupleDataError(f"binary column of {length} bytes runs past the end of the message")
        return BinaryValue(buf[pos + 5:end]), end
    raise TupleDataError(f"unknown TupleData column kind {bytes([kind])!r} at offset {pos}")


def _loop_parser(ncols: int) -> Parser:
    """A generic parser for any column count (used for wide tables)."""

    def parse(buf: bytes, pos: int) -> tuple[tuple[object, ...], int, bool]:
        values: list[object] = []
        append = values.append
        rare = False
        for _ in range(ncols):
            kind, length = _KIND_LEN(buf, pos)
            if kind == _KIND_T:
                pos += 5
                append(buf[pos:pos + length])
                pos += length
            elif kind == _KIND_N:
                append(None)
                pos += 1
            else:
                value, pos = _rare_column(buf, pos, kind)
                append(value)
                rare = True
        return tuple(values), pos, rare

    return parse


def _column_code(ncols: int) -> list[str]:
    """Straight-line statements parsing ``ncols`` columns from ``pos`` into ``v0..v{ncols-1}``."""
    lines = ["    rare = False"]
    for i in range(ncols):
        lines += [
            "    kind, length = _KIND_LEN(buf, pos)",
            f"    if kind == {_KIND_T}:",
            f"        pos += 5; v{i} = buf[pos:pos + length]; pos += length",
            f"    elif kind == {_KIND_N}:",
            f"        v{i} = None; pos += 1",
            "    else:",
            f"        v{i}, pos = _rare_column(buf, pos, kind); rare = True",
        ]
    lines.append("    values = (" + "".join(f"v{i}, " for i in range(ncols)) + ")")
    return lines


def _compile(name: str, lines: list[str], **namespace: object) -> Callable[..., object]:
    namespace.update(_KIND_LEN=_KIND_LEN, _rare_column=_rare_column)
    exec(compile("\n".join(lines), f"<pgoutput {name}>", "exec"), namespace)
    return namespace["generated"]  # type: ignore[return-value]


def _generated_parser(ncols: int) -> Parser:
    """Straight-line parser for exactly ``ncols`` columns (see the module docstring)."""
    lines = ["def generated(buf, pos):", *_column_code(ncols), "    return values, pos, rare"]
    return _compile(f"tuple parser ncols={ncols}", lines)  # type: ignore[return-value]


_PARSERS: dict[int, Parser] = {}


def tuple_parser(ncols: int) -> Parser:
    """The cached parser for TupleData of ``ncols`` columns.

    ``parser(buf, pos)`` parses the columns starting at ``pos`` (just after the Int16 count) of a
    PAD-terminated ``buf`` and returns ``(values, next_pos, rare)``; ``rare`` is true when a
    ``'u'`` or ``'b'`` column was seen, so callers look for :data:`UNCHANGED_TOAST` only then.
    """
    parser = _PARSERS.get(ncols)
    if parser is None:
        parser = _generated_parser(ncols) if ncols <= _MAX_GENERATED else _loop_parser(ncols)
        _PARSERS[ncols] = parser
    return parser


MessageDecoder = Callable[[bytes, int, "int | None"], "Insert | Update"]

# How each message class is built from the decoded fields (Update: no old tuple).
_FIELDS = {Insert: "(oid, values, unchanged, xid)", Update: "(oid, values, unchanged, None, None, xid)"}


def _unchanged_indices(values: tuple[object, ...]) -> tuple[int, ...]:
    return tuple(i for i, v in enumerate(values) if v is UNCHANGED_TOAST)


def _generated_decoder(ncols: int, cls: type) -> MessageDecoder:
    """A whole ``'I'``/``'U'`` [xid] oid ``'N'`` TupleData message in one Python frame."""
    lines = [
        "def generated(buf, pos, xid):",
        "    oid, action, count = _HEADER(buf, pos)",
        f"    if action != {wire.NEW_ROW!r} or count != {ncols}:",
        f"        raise TupleDataError(f'expected N and {ncols} columns, got {{action!r}} and {{count}}')",
        "    buf += _PAD",
        "    pos += 7",
        *_column_code(ncols),
        "    if pos != len(buf) - 4:",
        "        raise TupleDataError(f'tuple data ends at byte {pos} of a {len(buf) - 4}-byte message')",
        "    unchanged = _unchanged_indices(values) if rare else ()",
        f"    return _new(cls, {_FIELDS[cls]})",
    ]
    return _compile(f"{cls.__name__} decoder ncols={ncols}", lines, _HEADER=_NEW_TUPLE_HEADER, _PAD=PAD,
                    TupleDataError=TupleDataError, _unchanged_indices=_unchanged_indices,
                    _new=tuple.__new__, cls=cls)  # type: ignore[return-value]


def _loop_decoder(ncols: int, cls: type) -> MessageDecoder:
    parse = _loop_parser(ncols)
    old = (None, None) if cls is Update else ()

    def decode(buf: bytes, pos: int, xid: int | None) -> Insert | Update:
        oid, action, count = _NEW_TUPLE_HEADER(buf, pos)
        if action != wire.NEW_ROW or count != ncols:
            raise TupleDataError(f"expected N and {ncols} columns, got {action!r} and {count}")
        values, end, rare = parse(buf + PAD, pos + 7)
        if end != len(buf):
            raise TupleDataError(f"tuple data ends at byte {end} of a {len(buf)}-byte message")
        return cls(oid, values, _unchanged_indices(values) if rare else (), *old, xid)

    return decode


class _Decoders(dict):  # type: ignore[type-arg]
    """ncols -> decoder of one message class, generated on first use."""

    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def __missing__(self, ncols: int) -> MessageDecoder:
        make = _generated_decoder if ncols <= _MAX_GENERATED else _loop_decoder
        decoder = self[ncols] = make(ncols, self.cls)
        return decoder


INSERT_DECODERS: dict[int, MessageDecoder] = _Decoders(Insert)
"""``INSERT_DECODERS[ncols](buf, pos, xid)`` decodes an Insert message whose relation OID is at
``pos`` (1, or 5 inside a stream): the hot path, one Python frame per message."""

UPDATE_DECODERS: dict[int, MessageDecoder] = _Decoders(Update)
"""The same for an Update that carries only its new tuple (no ``'K'``/``'O'`` old tuple)."""


def parse_tuple(buf: bytes, pos: int) -> tuple[tuple[object, ...], tuple[int, ...], int]:
    """Parse one TupleData (count included) at ``pos`` of a PAD-terminated ``buf``.

    Returns ``(values, unchanged_indices, next_pos)``; ``unchanged_indices`` lists the columns
    sent as ``'u'`` (their value is :data:`UNCHANGED_TOAST`).
    """
    ncols = (buf[pos] << 8) | buf[pos + 1]
    values, end, rare = tuple_parser(ncols)(buf, pos + 2)
    if end > len(buf) - len(PAD):
        raise TupleDataError("TupleData runs past the end of the message")
    if rare:
        return values, _unchanged_indices(values), end
    return values, (), end
