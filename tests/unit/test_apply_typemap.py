"""The type rule the Spark job applies (``staging/column_types.py``) is the one staging uses
(``staging/typemap.py``): a column's staged Arrow type and its Iceberg type come from one entry."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.staging import column_types
from airflow_provider_pglogical.staging.seam.pg_types import REGISTRY
from airflow_provider_pglogical.staging.typemap import map_column, map_type

COLUMNS = [
    *({"type": name} for name in (*REGISTRY, "text", "varchar", "jsonb", "uuid", "interval", "time")),
    {"type": "numeric", "formatted": "numeric(12,2)"},
    {"type": "numeric", "formatted": "numeric(38,0)"},
    {"type": "numeric", "formatted": "numeric(39,2)"},
    {"type": "numeric", "formatted": "numeric( 5, 3 )"},
    {"type": "numeric", "formatted": "numeric"},
    {"type": "numeric"},
    {"type": "_int4", "element_type": "int4"},
    {"type": "_numeric", "element_type": "numeric"},
    {"type": "_timestamptz", "element_type": "timestamptz"},
    {"type": "_bytea", "element_type": "bytea"},
    {"type": "_uuid", "element_type": "uuid"},
    {"type": "mood"},
    {"type": "geometry"},
    {"type": "tsvector"},
]


@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: c.get("formatted") or c["type"])
def test_job_maps_types_like_staging(column):
    expected = map_type(column["type"], element_type=column.get("element_type"), formatted=column.get("formatted")).spark
    assert column_types.column_type(column) == expected


def test_exact_types_for_the_lakehouse():
    assert column_types.spark_type("numeric", formatted="numeric(12,2)") == "decimal(12,2)"
    assert column_types.spark_type("numeric", formatted="numeric(39,2)") == "string"  # no exact Spark decimal
    assert column_types.spark_type("timestamptz") == "timestamp"  # UTC instants
    assert column_types.spark_type("timestamp") == "timestamp_ntz"
    assert column_types.spark_type("bytea") == "binary"
    assert column_types.spark_type("jsonb") == "string"
    assert column_types.spark_type("uuid") == "string"
    assert column_types.spark_type("_int8", element_type="int8") == "array<bigint>"
    assert str(map_type("numeric", formatted="numeric(12,2)").arrow) == "decimal128(12, 2)"
    assert str(map_type("_int8", element_type="int8").arrow) == "list<item: int64>"


@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: c.get("formatted") or c["type"])
def test_an_override_stages_and_applies_any_type_as_string(column):
    """The same manifest entry gives the same type in staging (Arrow) and in the lakehouse (Spark)."""
    entry = {**column, "name": "c", "override": "string"}
    assert map_column(entry).spark == column_types.column_type(entry) == "string"
    assert str(map_column(entry).arrow) == "string"


def test_an_unknown_override_names_the_column_and_the_choices():
    with pytest.raises(ValueError, match="column c: unknown type override 'date'; supported are 'string'"):
        column_types.column_type({"name": "c", "type": "text", "override": "date"})


def test_the_job_reads_staged_files_with_the_schema_staging_writes():
    """``column_types.staged_columns`` (the schema the Spark job reads with, instead of inferring it)
    names every column ``decoding.staged_tables.change_schema`` writes, with the Spark type
    Spark's own Parquet reader gives that Arrow type."""
    from pyspark.sql.pandas.types import from_arrow_type

    from airflow_provider_pglogical.decoding.staged_tables import change_schema

    columns = [{**column, "name": f"c{i}"} for i, column in enumerate(COLUMNS)]
    columns += [{"name": "_op", "type": "text"}, {"name": "~x", "type": "int4"},
                {"name": "o", "type": "date", "override": "string"}]
    key = ["c0", "_op"]
    manifest = {"columns": columns, "key": key}
    arrow = change_schema(columns, key)
    written = {field.name: from_arrow_type(field.type, prefer_timestamp_ntz=True).simpleString() for field in arrow}
    assert column_types.staged_columns(manifest, changes=True) == written
    assert list(column_types.staged_columns(manifest, changes=False)) == [c["name"] for c in columns]
