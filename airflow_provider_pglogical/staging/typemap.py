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

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from airflow_provider_pglogical.exceptions import TypeOverrideError
from airflow_provider_pglogical.staging import column_types, contract
from airflow_provider_pglogical.staging.seam.manifests import Column


@dataclass(frozen=True)
class MappedType:
    """How one PostgreSQL type travels: the Arrow type in staging and the Spark SQL type in Iceberg."""

    arrow: pa.DataType
    spark: str
    #: how ``values.py`` parses the PostgreSQL text form into ``arrow``
    parser: str


#: base PostgreSQL type name (``pg_type.typname``) -> (Arrow type, parser); numeric and arrays are
#: handled in :func:`map_type`, anything not listed travels as its text. The Spark type comes from
#: the staging contract (``column_types.spark_type``), the rule the Spark job applies too.
_ARROW: dict[str, tuple[pa.DataType, str]] = {
    "bool": (pa.bool_(), "bool"),
    # Iceberg has no 16-bit integer: int2 widens to int.
    "int2": (pa.int32(), "int"),
    "int4": (pa.int32(), "int"),
    "int8": (pa.int64(), "int"),
    "oid": (pa.int64(), "int"),
    "float4": (pa.float32(), "float"),
    "float8": (pa.float64(), "float"),
    "bytea": (pa.binary(), "bytea"),
    "date": (pa.date32(), "date"),
    "timestamp": (pa.timestamp("us"), "timestamp"),
    "timestamptz": (pa.timestamp("us", tz="UTC"), "timestamptz"),
    # As text, exactly: text/varchar/json/xml/inet/money; time and timetz (Spark has no TIME),
    # interval (Iceberg has none), uuid (Spark cannot write Iceberg's uuid type).
}
_STRING = MappedType(pa.string(), "string", "text")
MAX_DECIMAL_PRECISION = column_types.MAX_DECIMAL_PRECISION


def map_type(type_name: str, *, element_type: str | None = None, formatted: str | None = None) -> MappedType:
    """Map a PostgreSQL type to its staging and lakehouse types.

    :param type_name: ``pg_type.typname`` (``int4``, ``numeric``, ``_int4`` for arrays).
    :param element_type: for arrays, the element's ``typname``.
    :param formatted: ``format_type(oid, typmod)`` (``numeric(12,2)``), needed for numeric.
    """
    spark = column_types.spark_type(type_name, element_type, formatted)
    if type_name == "numeric":
        decimal = column_types.decimal_of(formatted)
        # Unconstrained numeric (or precision > 38) has no exact Spark decimal: keep its text.
        return MappedType(pa.decimal128(*decimal), spark, "decimal") if decimal else _STRING
    if element_type is not None:
        # One-dimensional arrays become lists; PostgreSQL's type does not say how many dimensions
        # a value has, so a multi-dimensional value is reported as an error by values.py.
        element = map_type(element_type)
        return MappedType(pa.list_(element.arrow), spark, f"array:{element.parser}")
    if type_name not in _ARROW:
        return _STRING
    arrow, parser = _ARROW[type_name]
    return MappedType(arrow, spark, parser)


#: lakehouse types a column can be overridden to, by name; each is lossless for every PostgreSQL type
OVERRIDE_TYPES: dict[str, MappedType] = {name: _STRING for name in column_types.OVERRIDE_TYPES}


def map_column(entry: "Mapping | Column") -> MappedType:
    """Mapping of a manifest column (``type``/``element_type``/``formatted``), honouring its ``override``."""
    if isinstance(entry, Column):
        entry = entry.to_dict()
    override = entry.get("override")
    if override is not None:
        return OVERRIDE_TYPES[override]
    return map_type(entry["type"], element_type=entry.get("element_type"), formatted=entry.get("formatted"))


def check_overrides(type_overrides: Mapping[str, str] | None) -> dict[str, str]:
    """Validate ``type_overrides`` (``{"schema.table.column": "string"}``; a name holding a dot in
    double quotes: ``'"x.y".z.col'``); returns them keyed by :func:`contract.override_key`."""
    out = {}
    for key, kind in dict(type_overrides or {}).items():
        try:
            schema, table, column = contract.split_dotted(key, 3, "type_overrides key") if isinstance(key, str) else ()
        except ValueError as error:
            raise TypeOverrideError(f"{error}; write it as 'schema.table.column' "
                                    "(e.g. {'public.events.ends_at': 'string'})") from None
        except TypeError:
            raise TypeOverrideError(
                f"type_overrides key {key!r} is not 'schema.table.column' (e.g. {{'public.events.ends_at': 'string'}})"
            ) from None
        if kind not in OVERRIDE_TYPES:
            raise TypeOverrideError(
                f"type_overrides[{key!r}] = {kind!r}: supported are {', '.join(map(repr, OVERRIDE_TYPES))} "
                "(PostgreSQL's exact text output)"
            )
        out[contract.override_key(contract.table_key(schema, table), column)] = kind
    return out


def apply_overrides(table: str, columns: list[dict], type_overrides: Mapping[str, str] | None,
                    *, strict: bool = False) -> list[dict]:
    """Set ``override`` on the manifest column entries of ``table`` (``schema.table``) named in
    ``type_overrides``. With ``strict``, an override naming a column ``table`` does not publish is
    an error (a typo would otherwise go unnoticed)."""
    overrides = check_overrides(type_overrides)
    mine = {}
    for key, kind in overrides.items():
        schema, name, column = contract.split_dotted(key, 3, "type_overrides key")
        if contract.table_key(schema, name) == table:
            mine[column] = kind
    names = {c["name"] for c in columns}
    unknown = sorted(name for name in mine if name not in names)
    if strict and unknown:
        raise TypeOverrideError(
            f"type_overrides name column(s) {', '.join(contract.override_key(table, n) for n in unknown)} that "
            f"{table} does not "
            f"publish; published columns are {', '.join(sorted(names))}"
        )
    return [{**c, "override": mine[c["name"]]} if c["name"] in mine else c for c in columns]
