"""The staging contract's types: which Spark type each staged PostgreSQL column is read as.

Part of the contract (``staging/contract.py``) and, like it, standard library only: the Spark
jobs ship it too (``spark/launch.py``). The types themselves are the registry's
(``staging/seam/pg_types.py``); this module names them as the job reads a batch.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow_provider_pglogical.staging.contract import COMMIT_LSN, COMMIT_TS, OLD_KEY_PREFIX, OP, SEQ, UNCHANGED, XID, staged_name
from airflow_provider_pglogical.staging.seam.manifests import Column, TableManifest
from airflow_provider_pglogical.staging.seam.pg_types import MAX_DECIMAL_PRECISION, OVERRIDES, column_pg_type, decimal_of, pg_type

__all__ = ["MAX_DECIMAL_PRECISION", "OVERRIDE_TYPES", "decimal_of", "spark_type", "column_type", "staged_columns"]

#: lakehouse types a column can be overridden to (``type_overrides``), each lossless for any type
OVERRIDE_TYPES = {name: entry.spark.sql for name, entry in OVERRIDES.items()}


def spark_type(type_name: str, element_type: str | None = None, formatted: str | None = None) -> str:
    """Spark SQL type of a PostgreSQL type; anything unknown (json, uuid, interval, ...) is string.

    :param formatted: ``format_type(oid, typmod)`` (``numeric(12,2)``), needed for numeric:
        unconstrained numeric (or precision over 38) has no exact Spark decimal and stays text.
    """
    return pg_type(type_name, element_type, formatted).spark.sql


def column_type(column: "Column | Mapping[str, Any]") -> str:
    """Spark SQL type of a manifest column (or the decoder's column entry), honouring its ``override``."""
    return column_pg_type(column).spark.sql


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
