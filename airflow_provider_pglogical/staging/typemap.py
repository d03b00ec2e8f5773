"""The one table that maps PostgreSQL types to Arrow (staging) and Spark/Iceberg (lakehouse) types.

Values leave PostgreSQL as text (COPY text format, pgoutput text tuples) and are parsed into the
Arrow type named here (``staging/values.py``); the Spark job casts Parquet columns to the Spark
type named here. Anything unknown travels as a string: never an error, never silence.

A value the mapped type cannot hold exactly (``infinity``, a ``numeric`` NaN, a timestamp past
Spark's range, an array with non-default bounds) is an error naming the column, unless the column
is overridden: ``type_overrides={"schema.table.column": "string"}`` stages it as PostgreSQL's exact
text output. The override is recorded in the manifest's column entry (``"override": "string"``),
so the snapshot, the pull and the Spark job all read the same staged type (docs/types.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from airflow_provider_pglogical.exceptions import TypeOverrideError


@dataclass(frozen=True)
class MappedType:
    """How one PostgreSQL type travels: the Arrow type in staging and the Spark SQL type in Iceberg."""

    arrow: pa.DataType
    spark: str
    #: how ``values.py`` parses the PostgreSQL text form into ``arrow``
    parser: str


_STRING = MappedType(pa.string(), "string", "text")

#: base PostgreSQL type name (``pg_type.typname``) -> mapping; numeric and arrays are handled below.
TYPE_MAP: dict[str, MappedType] = {
    "bool": MappedType(pa.bool_(), "boolean", "bool"),
    # Iceberg has no 16-bit integer: int2 widens to int.
    "int2": MappedType(pa.int32(), "int", "int"),
    "int4": MappedType(pa.int32(), "int", "int"),
    "int8": MappedType(pa.int64(), "bigint", "int"),
    "oid": MappedType(pa.int64(), "bigint", "int"),
    "float4": MappedType(pa.float32(), "float", "float"),
    "float8": MappedType(pa.float64(), "double", "float"),
    "text": _STRING,
    "varchar": _STRING,
    "bpchar": _STRING,
    "name": _STRING,
    "citext": _STRING,
    "bytea": MappedType(pa.binary(), "binary", "bytea"),
    "date": MappedType(pa.date32(), "date", "date"),
    # Spark has no TIME type: time-of-day travels as its ISO text.
    "time": _STRING,
    "timetz": _STRING,
    "timestamp": MappedType(pa.timestamp("us"), "timestamp_ntz", "timestamp"),
    "timestamptz": MappedType(pa.timestamp("us", tz="UTC"), "timestamp", "timestamptz"),
    # Iceberg has no interval type; the ISO 8601 text is exact.
    "interval": _STRING,
    # Spark cannot write Iceberg's uuid type; the canonical text is exact.
    "uuid": _STRING,
    "json": _STRING,
    "jsonb": _STRING,
    "xml": _STRING,
    "inet": _STRING,
    "cidr": _STRING,
    "macaddr": _STRING,
    "money": _STRING,
}

_NUMERIC_TYPMOD = re.compile(r"^numeric\((\d+),(\d+)\)$")
MAX_DECIMAL_PRECISION = 38


def map_type(type_name: str, *, element_type: str | None = None, formatted: str | None = None) -> MappedType:
    """Map a PostgreSQL type to its staging and lakehouse types.

    :param type_name: ``pg_type.typname`` (``int4``, ``numeric``, ``_int4`` for arrays).
    :param element_type: for arrays, the element's ``typname``.
    :param formatted: ``format_type(oid, typmod)`` (``numeric(12,2)``), needed for numeric.
    """
    if type_name == "numeric":
        match = _NUMERIC_TYPMOD.match((formatted or "").replace(" ", ""))
        if match and int(match.group(1)) <= MAX_DECIMAL_PRECISION:
            precision, scale = int(match.group(1)), int(match.group(2))
            return MappedType(pa.decimal128(precision, scale), f"decimal({precision},{scale})", "decimal")
        # Unconstrained numeric (or precision > 38) has no exact Spark decimal: keep its text.
        return _STRING
    if element_type is not None:
        # One-dimensional arrays become lists; PostgreSQL's type does not say how many dimensions
        # a value has, so a multi-dimensional value is reported as an error by values.py.
        element = map_type(element_type)
        return MappedType(pa.list_(element.arrow), f"array<{element.spark}>", f"array:{element.parser}")
    return TYPE_MAP.get(type_name, _STRING)


#: lakehouse types a column can be overridden to, by name; each is lossless for every PostgreSQL type
OVERRIDE_TYPES: dict[str, MappedType] = {"string": _STRING}


def map_column(entry: Mapping) -> MappedType:
    """Mapping of a manifest column entry (``type``/``element_type``/``formatted``), honouring its ``override``."""
    override = entry.get("override")
    if override is not None:
        return OVERRIDE_TYPES[override]
    return map_type(entry["type"], element_type=entry.get("element_type"), formatted=entry.get("formatted"))


def check_overrides(type_overrides: Mapping[str, str] | None) -> dict[str, str]:
    """Validate ``type_overrides`` (``{"schema.table.column": "string"}``); returns a plain dict."""
    out = dict(type_overrides or {})
    for key, kind in out.items():
        if not isinstance(key, str) or key.count(".") < 2:
            raise TypeOverrideError(
                f"type_overrides key {key!r} is not 'schema.table.column' (e.g. {{'public.events.ends_at': 'string'}})"
            )
        if kind not in OVERRIDE_TYPES:
            raise TypeOverrideError(
                f"type_overrides[{key!r}] = {kind!r}: supported are {', '.join(map(repr, OVERRIDE_TYPES))} "
                "(PostgreSQL's exact text output)"
            )
    return out


def apply_overrides(table: str, columns: list[dict], type_overrides: Mapping[str, str] | None,
                    *, strict: bool = False) -> list[dict]:
    """Set ``override`` on the manifest column entries of ``table`` (``schema.table``) named in
    ``type_overrides``. With ``strict``, an override naming a column ``table`` does not publish is
    an error (a typo would otherwise go unnoticed)."""
    overrides = check_overrides(type_overrides)
    prefix = table + "."
    mine = {key[len(prefix):]: kind for key, kind in overrides.items() if key.startswith(prefix)}
    names = {c["name"] for c in columns}
    unknown = sorted(name for name in mine if name not in names)
    if strict and unknown:
        raise TypeOverrideError(
            f"type_overrides name column(s) {', '.join(prefix + n for n in unknown)} that {table} does not "
            f"publish; published columns are {', '.join(sorted(names))}"
        )
    return [{**c, "override": mine[c["name"]]} if c["name"] in mine else c for c in columns]
