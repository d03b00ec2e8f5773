"""The staging contract's types: which Spark type each staged PostgreSQL column is read as.

Part of the contract (``staging/contract.py``) and, like it, standard library only: the Spark
jobs ship it too (``spark/launch.py``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from airflow_provider_pglogical.staging.contract import COMMIT_LSN, COMMIT_TS, OLD_KEY_PREFIX, OP, SEQ, UNCHANGED, XID, staged_name
from airflow_provider_pglogical.staging.seam.manifests import Column, TableManifest

#: PostgreSQL base type (``pg_type.typname``) -> Spark SQL type; any type not listed is a string
SPARK_TYPES = {
    "bool": "boolean", "int2": "int", "int4": "int", "int8": "bigint", "oid": "bigint",
    "float4": "float", "float8": "double", "bytea": "binary", "date": "date",
    "timestamp": "timestamp_ntz", "timestamptz": "timestamp",
}
MAX_DECIMAL_PRECISION = 38
_NUMERIC_TYPMOD = re.compile(r"^numeric\((\d+),(\d+)\)$")
#: lakehouse types a column can be overridden to (``type_overrides``), each lossless for any type
OVERRIDE_TYPES = {"string": "string"}


def decimal_of(formatted: str | None) -> tuple[int, int] | None:
    """``(precision, scale)`` of ``numeric(p,s)`` that a Spark decimal holds; None otherwise."""
    match = _NUMERIC_TYPMOD.match((formatted or "").replace(" ", ""))
    if match and int(match.group(1)) <= MAX_DECIMAL_PRECISION:
        return int(match.group(1)), int(match.group(2))
    return None


def spark_type(type_name: str, element_type: str | None = None, formatted: str | None = None) -> str:
    """Spark SQL type of a PostgreSQL type; anything unknown (json, uuid, interval, ...) is string.

    :param formatted: ``format_type(oid, typmod)`` (``numeric(12,2)``), needed for numeric:
        unconstrained numeric (or precision over 38) has no exact Spark decimal and stays text.
    """
    if type_name == "numeric":
        decimal = decimal_of(formatted)
        return f"decimal({decimal[0]},{decimal[1]})" if decimal else "string"
    if element_type is not None:
        return f"array<{spark_type(element_type)}>"
    return SPARK_TYPES.get(type_name, "string")


def column_type(column: "Column | Mapping[str, Any]") -> str:
    """Spark SQL type of a manifest column (or the decoder's column entry), honouring its ``override``."""
    column = Column.from_dict(column)
    override = column.override
    if override is None:
        return spark_type(column.type, column.element_type, column.formatted)
    if override not in OVERRIDE_TYPES:
        raise ValueError(f"column {column.name}: unknown type override {override!r}; "
                         f"supported are {', '.join(map(repr, OVERRIDE_TYPES))}")
    return OVERRIDE_TYPES[override]


#: Spark types of the metadata columns of a staged change row (the Arrow types staged_tables.py writes)
CHANGE_METADATA_TYPES = {OP: "string", COMMIT_LSN: "bigint", SEQ: "bigint", XID: "bigint", COMMIT_TS: "timestamp",
                         UNCHANGED: "array<string>"}


def staged_columns(table_manifest: "TableManifest | Mapping[str, Any]", *, changes: bool) -> dict[str, str]:
    """Staged column name -> Spark type of one table's files in a batch, from its manifest entry.

    The job reads the files with this schema instead of inferring it (inference costs a Spark job
    per read); a column a part file lacks (added later in the batch) reads as NULL.
    """
    table = TableManifest.from_dict(table_manifest)
    columns = {column.name: column_type(column) for column in table.columns}
    if not changes:
        return columns
    return {**CHANGE_METADATA_TYPES, **{staged_name(name): kind for name, kind in columns.items()},
            **{OLD_KEY_PREFIX + key: columns[key] for key in table.key}}

