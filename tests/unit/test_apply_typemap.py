"""The Spark job carries its own copy of the type mapping (it ships as one file): it must agree
with ``staging/typemap.py``, the one table the rest of the package uses."""

from __future__ import annotations

import ast

import pytest

from airflow_provider_pglogical.staging.typemap import TYPE_MAP, map_type
from airflow_provider_pglogical.spark import apply_changes

COLUMNS = [
    *({"type": name} for name in TYPE_MAP),
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
def test_job_maps_types_like_typemap(column):
    expected = map_type(column["type"], element_type=column.get("element_type"), formatted=column.get("formatted")).spark
    assert apply_changes.column_type(column) == expected


def test_exact_types_for_the_lakehouse():
    assert apply_changes.spark_type("numeric", formatted="numeric(12,2)") == "decimal(12,2)"
    assert apply_changes.spark_type("timestamptz") == "timestamp"  # UTC instants
    assert apply_changes.spark_type("timestamp") == "timestamp_ntz"
    assert apply_changes.spark_type("bytea") == "binary"
    assert apply_changes.spark_type("jsonb") == "string"
    assert apply_changes.spark_type("uuid") == "string"
    assert apply_changes.spark_type("_int8", element_type="int8") == "array<bigint>"


def test_job_imports_nothing_from_airflow_or_the_package():
    tree = ast.parse(open(apply_changes.__file__).read())
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m.split(".")[0] for m in modules} <= {
        "__future__", "argparse", "json", "logging", "os", "re", "signal", "sys", "time", "dataclasses",
        "functools", "uuid", "pyspark"}


@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: c.get("formatted") or c["type"])
def test_an_override_stages_and_applies_any_type_as_string(column):
    """The same manifest entry gives the same type in staging (Arrow) and in the lakehouse (Spark)."""
    from airflow_provider_pglogical.staging.typemap import map_column

    entry = {**column, "name": "c", "override": "string"}
    assert map_column(entry).spark == apply_changes.column_type(entry) == "string"
    assert str(map_column(entry).arrow) == "string"
