"""The one table that maps PostgreSQL types to Arrow (staging) and Spark/Iceberg (lakehouse) types.

Values leave PostgreSQL as text (COPY text format, pgoutput text tuples) and are parsed into the
Arrow type named here (``replication/values.py``); the Spark job casts Parquet columns to the Spark
type named here. Anything unknown travels as a string: never an error, never silence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa


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


def arrow_schema_for(columns: list[dict]) -> pa.Schema:
    """Arrow schema of the value columns described in a manifest (``name``/``type``/``element_type``/``formatted``)."""
    return pa.schema(
        [
            pa.field(
                col["name"],
                map_type(col["type"], element_type=col.get("element_type"), formatted=col.get("formatted")).arrow,
            )
            for col in columns
        ]
    )
