"""PostgreSQL types as the Python side stages them: the registry's entries (``staging/seam/pg_types.py``,
the one table of PostgreSQL types) with their Arrow types built, and the ``type_overrides``.

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
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.seam import pg_types
from airflow_provider_pglogical.staging.seam.manifests import Column


@dataclass(frozen=True)
class MappedType:
    """How one PostgreSQL type travels: the Arrow type in staging and the Spark SQL type in Iceberg."""

    arrow: pa.DataType
    spark: str
    #: how ``values.py`` parses the PostgreSQL text form into ``arrow``
    parser: str


MAX_DECIMAL_PRECISION = pg_types.MAX_DECIMAL_PRECISION


def mapped(entry: pg_types.PgType) -> MappedType:
    """The registry's entry (``staging/seam/pg_types.py``) with its Arrow type built."""
    return MappedType(entry.arrow.build(pa), entry.spark.sql, entry.parser)


def map_type(type_name: str, *, element_type: str | None = None, formatted: str | None = None) -> MappedType:
    """Map a PostgreSQL type to its staging and lakehouse types (the registry's entry).

    :param type_name: ``pg_type.typname`` (``int4``, ``numeric``, ``_int4`` for arrays).
    :param element_type: for arrays, the element's ``typname``. One-dimensional arrays become
        lists; PostgreSQL's type does not say how many dimensions a value has, so a
        multi-dimensional value is reported as an error by values.py.
    :param formatted: ``format_type(oid, typmod)`` (``numeric(12,2)``), needed for numeric:
        unconstrained numeric (or precision > 38) has no exact Spark decimal and keeps its text.
    """
    return mapped(pg_types.pg_type(type_name, element_type, formatted))


#: lakehouse types a column can be overridden to, by name; each is lossless for every PostgreSQL type
OVERRIDE_TYPES: dict[str, MappedType] = {name: mapped(entry) for name, entry in pg_types.OVERRIDES.items()}


def map_column(entry: "Mapping | Column") -> MappedType:
    """Mapping of a manifest column (``type``/``element_type``/``formatted``), honouring its ``override``."""
    return mapped(pg_types.column_pg_type(entry))


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
