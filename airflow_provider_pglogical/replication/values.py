"""Turn PostgreSQL's text output into typed Arrow columns, exactly.

The session that produces the text runs with ``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=iso_8601``, ``bytea_output=hex`` and ``extra_float_digits=3`` (see
:data:`SESSION_SETTINGS`), so the text parses unambiguously and floats round-trip.
Vectorised pyarrow casts do the common types; only bytea and arrays need per-value Python.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.replication.typemap import MappedType

#: settings of every session whose text output we parse (snapshot COPY and slot pulls alike)
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "bytea_output": "hex",
    "extra_float_digits": "3",
}


class ValueConversionError(ValueError):
    """A PostgreSQL value has no exact form in the mapped lakehouse type."""


def text_to_arrow(texts: pa.Array, mapped: MappedType, column: str) -> pa.Array:
    """Parse a string array of PostgreSQL text values into ``mapped.arrow``.

    :param texts: string (or large_string) array; nulls stay null.
    :param mapped: the column's mapping from :mod:`typemap`.
    :param column: column name, for error messages.
    """
    parser = mapped.parser
    try:
        if parser == "text":
            return texts.cast(pa.string()) if texts.type != pa.string() else texts
        if parser == "bool":
            return pc.equal(texts, "t")
        if parser in ("int", "float", "decimal", "date", "timestamp", "timestamptz"):
            return pc.cast(texts, mapped.arrow)
        if parser == "bytea":
            return pa.array([None if v is None else _parse_bytea(v) for v in texts.to_pylist()], pa.binary())
        if parser.startswith("array:"):
            element = MappedType(mapped.arrow.value_type, "", parser.split(":", 1)[1])
            return _arrays_to_arrow(texts, element, mapped.arrow, column)
    except (pa.ArrowInvalid, ValueError) as err:
        raise ValueConversionError(
            f"column {column!r}: a value cannot be converted exactly to {mapped.arrow} ({err}). "
            "Cast the column in the publication's source, or map it to text."
        ) from err
    raise ValueError(f"unknown parser {parser!r} for column {column!r}")


def _parse_bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea value is not in hex format; set bytea_output=hex")
    return bytes.fromhex(text[2:])


def _arrays_to_arrow(texts: pa.Array, element: MappedType, arrow_type: pa.DataType, column: str) -> pa.Array:
    """Parse one-dimensional PostgreSQL array literals (``{1,2,NULL}``) into a list array."""
    offsets = [0]
    items: list[str | None] = []
    mask: list[bool] = []
    for value in texts.to_pylist():
        if value is None:
            mask.append(True)
            offsets.append(len(items))
            continue
        items.extend(parse_array_literal(value, column))
        mask.append(False)
        offsets.append(len(items))
    parsed = text_to_arrow(pa.array(items, pa.string()), element, column)
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), parsed, type=arrow_type, mask=pa.array(mask, pa.bool_())
    )


def parse_array_literal(text: str, column: str = "?") -> list[str | None]:
    """Split a one-dimensional PostgreSQL array literal into element texts (NULL -> None)."""
    if text.startswith("["):  # explicit bounds, e.g. "[0:1]={1,2}"
        text = text[text.index("=") + 1 :]
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not an array literal: {text[:40]!r}")
    body = text[1:-1]
    if not body:
        return []
    if body.startswith("{"):
        raise ValueConversionError(
            f"column {column!r} holds a multi-dimensional array; only one-dimensional arrays map to a "
            "lakehouse list. Publish it as text (e.g. a generated column) instead."
        )
    out: list[str | None] = []
    i, n = 0, len(body)
    while i < n:
        if body[i] == '"':
            i += 1
            chars = []
            while body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i])
                i += 1
            out.append("".join(chars))
            i += 1  # closing quote
        else:
            j = body.find(",", i)
            j = n if j < 0 else j
            token = body[i:j].strip()
            out.append(None if token == "NULL" else token)
            i = j
        i += 1  # the comma
    return out


#: parsers whose text output pyarrow's CSV reader converts itself: it never holds a backslash,
#: tab or newline, so COPY's text format leaves it as it is
_COPY_NATIVE = {"bool", "int", "float", "decimal", "date", "timestamp", "timestamptz"}


def copy_read_types(mapped: dict[str, MappedType]) -> tuple[dict[str, pa.DataType], list[str]]:
    """Column types for reading COPY text format with pyarrow's CSV reader, and the columns read as
    strings: those must go through :func:`unescape_copy_text` (and, unless plain text, be converted
    by :func:`text_to_arrow`) afterwards."""
    types: dict[str, pa.DataType] = {}
    strings: list[str] = []
    for name, mapping in mapped.items():
        if mapping.parser in _COPY_NATIVE:
            types[name] = mapping.arrow
        else:
            types[name] = pa.string()
            strings.append(name)
    return types, strings


# COPY TO's text format escapes exactly these (and never emits octal or hex sequences).
_COPY_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v"}
_COPY_ESCAPE = re.compile(r"\\(.)", re.S)


def unescape_copy_text(texts: pa.Array) -> pa.Array:
    """Undo COPY text format's backslash escapes; only values holding a backslash go through Python.

    Most columns hold no backslash at all: one scan of the values buffer settles that, far cheaper
    than a per-value substring match.
    """
    data = texts.buffers()[2]
    if data is None or not (np.frombuffer(data, dtype=np.uint8) == ord("\\")).any():
        return texts
    mask = pc.fill_null(pc.match_substring(texts, "\\"), False)
    if not pc.any(mask).as_py():
        return texts
    fixed = [_COPY_ESCAPE.sub(lambda m: _COPY_ESCAPES.get(m.group(1), m.group(1)), v)
             for v in pc.filter(texts, mask).to_pylist()]
    return pc.replace_with_mask(texts, mask, pa.array(fixed, texts.type))
