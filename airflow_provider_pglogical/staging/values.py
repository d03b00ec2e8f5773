"""Turn PostgreSQL's text output into typed Arrow columns, exactly.

The session that produces the text runs with client encoding UTF8 (:data:`CLIENT_ENCODING`: the
server converts from a LATIN1 or other database's encoding), ``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=iso_8601``, ``bytea_output=hex`` and ``extra_float_digits=3`` (see
:data:`SESSION_SETTINGS`), so the text parses unambiguously and floats round-trip.
Vectorised pyarrow casts do the common types; only bytea and arrays need per-value Python.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.exceptions import UnrepresentableValue
from airflow_provider_pglogical.staging.typemap import MappedType

#: client encoding of every session whose text output we parse: PostgreSQL converts COPY output
#: and pgoutput's tuple values from the database's encoding, and Arrow strings are UTF-8
CLIENT_ENCODING = "UTF8"
#: settings of every session whose text output we parse (snapshot COPY and slot pulls alike)
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "TimeZone": "UTC",
    "IntervalStyle": "iso_8601",
    "bytea_output": "hex",
    "extra_float_digits": "3",
}


def apply_session_settings(cursor) -> None:
    """Set :data:`SESSION_SETTINGS` for the cursor's session (every session whose text output we parse)."""
    for key, value in SESSION_SETTINGS.items():
        cursor.execute("SELECT set_config(%s, %s, false)", (key, value))


class _NoExactForm(ValueError):
    """Raised by the parsers below; :func:`text_to_arrow` turns it into :class:`UnrepresentableValue`."""

    def __init__(self, value: str, reason: str) -> None:
        super().__init__(reason)
        self.value, self.reason = value, reason


def text_to_arrow(texts: pa.Array, mapped: MappedType, column: str, table: str = "?") -> pa.Array:
    """Parse a string array of PostgreSQL text values into ``mapped.arrow``, exactly.

    :param texts: string (or large_string) array; nulls stay null.
    :param mapped: the column's mapping from :mod:`typemap`.
    :param column: column name, for error messages.
    :param table: ``schema.table``, for error messages.
    :raises UnrepresentableValue: a value has no exact form in ``mapped`` (names the override to set).
    """
    parser = mapped.parser
    try:
        if parser == "text":
            return texts.cast(pa.string()) if texts.type != pa.string() else texts
        if parser == "bool":
            return pc.equal(texts, "t")
        if parser in ("date", "timestamp", "timestamptz"):
            return _temporal(texts, mapped.arrow, parser)
        if parser in ("int", "float", "decimal"):
            return _numbers(texts, mapped.arrow)
        if parser == "bytea":
            return pa.array([None if v is None else _parse_bytea(v) for v in texts.to_pylist()], pa.binary())
        if parser.startswith("array:"):
            element = MappedType(mapped.arrow.value_type, mapped.spark[6:-1], parser.split(":", 1)[1])
            return _arrays_to_arrow(texts, element, mapped.arrow, column, table)
    except _NoExactForm as err:
        raise UnrepresentableValue(table, column, err.value, err.reason, mapped.spark) from None
    raise ValueError(f"unknown parser {parser!r} for column {column!r}")


# --- numbers ----------------------------------------------------------------------------------

def _numbers(texts: pa.Array, arrow: pa.DataType) -> pa.Array:
    """Vectorised cast; on failure, find the value that cannot be cast and say why."""
    try:
        return pc.cast(texts, arrow)
    except pa.ArrowInvalid:
        pass
    for value in texts.to_pylist():
        if value is None:
            continue
        try:
            pc.cast(pa.array([value]), arrow)
        except pa.ArrowInvalid as err:
            if value in ("NaN", "Infinity", "-Infinity"):
                raise _NoExactForm(value, f"a decimal has no {value}") from None
            raise _NoExactForm(value, str(err)) from None
    raise AssertionError("a cast failed but no single value fails it")  # pragma: no cover


# --- dates and timestamps ---------------------------------------------------------------------

#: PostgreSQL ISO output that pyarrow's vectorised cast reads exactly (4-digit AD years)
_PLAIN_TEMPORAL = {
    "date": r"^\d{4}-\d\d-\d\d$",
    "timestamp": r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?$",
    "timestamptz": r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?[+-]\d\d(:\d\d){0,2}$",
}
#: everything else PostgreSQL prints: years before 1 (`` BC``) or past 9999, ``±infinity``
_TEMPORAL = re.compile(
    r"^(\d+)-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?$"
)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MICROS_PER_DAY = 86_400_000_000


def _temporal(texts: pa.Array, arrow: pa.DataType, parser: str) -> pa.Array:
    """Dates and timestamps: one vectorised cast for the usual values, Python for the rest (BC
    years, years past 9999), an error for what Spark cannot hold (``±infinity``, timestamps
    past 294247-01-10)."""
    try:
        return pc.cast(texts, arrow)  # the usual case; a special value makes the whole cast fail
    except pa.ArrowInvalid:
        pass
    if texts.type != pa.string():
        texts = texts.cast(pa.string())
    special = pc.invert(pc.fill_null(pc.match_substring_regex(texts, _PLAIN_TEMPORAL[parser]), True))
    plain = pc.cast(pc.if_else(special, pa.scalar(None, pa.string()), texts), arrow)
    parsed = [_temporal_value(text, parser) for text in pc.filter(texts, special).to_pylist()]
    storage = pa.int32() if parser == "date" else pa.int64()
    return pc.replace_with_mask(plain, special, pa.array(parsed, storage).cast(arrow))


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _temporal_value(text: str, parser: str) -> int:
    """Days (date) or microseconds since the epoch (timestamps) of one PostgreSQL ISO value."""
    if text in ("infinity", "-infinity"):
        raise _NoExactForm(text, f"Spark and Iceberg have no {text} {'date' if parser == 'date' else 'timestamp'}")
    match = _TEMPORAL.match(text)
    if match is None:
        raise _NoExactForm(text, "not PostgreSQL ISO output (DateStyle=ISO)")
    year, month, day, hh, mm, ss, frac, sign, oh, om, os_, bc = match.groups()
    year = int(year)
    if bc:
        year = 1 - year  # 1 BC is astronomical year 0
    days = _days_from_civil(year, int(month), int(day))
    if parser == "date":
        return days
    micros = days * _MICROS_PER_DAY + ((int(hh) * 60 + int(mm)) * 60 + int(ss)) * 1_000_000
    micros += int((frac or "").ljust(6, "0") or 0)
    if sign:
        offset = ((int(oh) * 60 + int(om or 0)) * 60 + int(os_ or 0)) * 1_000_000
        micros -= offset if sign == "+" else -offset
    if not _INT64[0] <= micros <= _INT64[1]:
        raise _NoExactForm(text, "outside the range of a Spark/Iceberg timestamp "
                                 "(microseconds since 1970 in 64 bits: up to 294247-01-10 04:00:54.775807)")
    return micros


def _parse_bytea(text: str) -> bytes:
    if not text.startswith("\\x"):
        raise ValueError("bytea value is not in hex format; set bytea_output=hex")
    return bytes.fromhex(text[2:])


def _arrays_to_arrow(texts: pa.Array, element: MappedType, arrow_type: pa.DataType, column: str,
                     table: str) -> pa.Array:
    """Parse one-dimensional PostgreSQL array literals (``{1,2,NULL}``) into a list array."""
    offsets = [0]
    items: list[str | None] = []
    mask: list[bool] = []
    for value in texts.to_pylist():
        if value is None:
            mask.append(True)
            offsets.append(len(items))
            continue
        items.extend(parse_array_literal(value))
        mask.append(False)
        offsets.append(len(items))
    parsed = text_to_arrow(pa.array(items, pa.string()), element, column, table)
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), parsed, type=arrow_type, mask=pa.array(mask, pa.bool_())
    )


#: what PostgreSQL's array_out counts as white space (it quotes elements holding any); Python's
#: ``str.strip()`` would also strip U+001C..U+001F, U+0085, U+00A0 and more off unquoted elements
_ARRAY_SPACE = " \t\n\r\v\f"


def parse_array_literal(text: str) -> list[str | None]:
    """Split a one-dimensional PostgreSQL array literal into element texts (NULL -> None).

    PostgreSQL prints bounds (``[0:1]={7,8}``) only when the lower bound is not 1; a lakehouse list
    has no lower bound, so such a value (like a multi-dimensional one) has no exact form.
    """
    if text.startswith("["):
        raise _NoExactForm(text, "an array whose lower bound is not 1; a lakehouse list would lose the bound")
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not an array literal: {text[:40]!r}")
    body = text[1:-1]
    if not body:
        return []
    if body.startswith("{"):
        raise _NoExactForm(text, "a multi-dimensional array; a lakehouse list has one dimension")
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
            token = body[i:j].strip(_ARRAY_SPACE)
            out.append(None if token == "NULL" else token)
            i = j
        i += 1  # the comma
    return out


#: parsers whose text output pyarrow's CSV reader converts itself: it never holds a backslash,
#: tab or newline, so COPY's text format leaves it as it is
COPY_NATIVE = {"bool", "int", "float", "decimal", "date", "timestamp", "timestamptz"}


def copy_read_types(mapped: dict[str, MappedType]) -> tuple[dict[str, pa.DataType], list[str]]:
    """Column types for reading COPY text format with pyarrow's CSV reader, and the columns read as
    strings: those must go through :func:`unescape_copy_text` (and, unless plain text, be converted
    by :func:`text_to_arrow`) afterwards."""
    types: dict[str, pa.DataType] = {}
    strings: list[str] = []
    for name, mapping in mapped.items():
        if mapping.parser in COPY_NATIVE:
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
