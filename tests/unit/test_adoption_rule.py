"""When a snapshot's staged files can become the Iceberg table's data files as they are (issue 37):
the pure rule of ``spark/apply/adoption.py`` (no JVM)."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.spark.apply.adoption import adoptable_type, adoption_refused
from airflow_provider_pglogical.staging.column_types import staged_columns

COLUMNS = [
    {"name": "id", "type": "int8"}, {"name": "n", "type": "numeric", "formatted": "numeric(12,2)"},
    {"name": "s", "type": "int2"}, {"name": "at", "type": "timestamptz"}, {"name": "ts", "type": "timestamp"},
    {"name": "arr", "type": "_int4", "element_type": "int4"}, {"name": "j", "type": "jsonb"},
    {"name": "nu", "type": "numeric", "formatted": "numeric"}, {"name": "inf", "type": "date", "override": "string"},
]
STAGED = staged_columns({"columns": COLUMNS, "key": ["id"]}, changes=False)


def refused(staged=STAGED, types=None, **flags):
    return adoption_refused(staged, dict(STAGED) if types is None else types,
                            **{"keyless": False, "ranged": False, "partitioned": False, **flags})


def test_a_keyed_unpartitioned_full_snapshot_of_mapped_types_is_adopted():
    assert STAGED["n"] == "decimal(12,2)" and STAGED["inf"] == "string" and STAGED["arr"] == "array<int>"
    assert refused() is None


@pytest.mark.parametrize("flag, reason", [
    ("keyless", "a keyless table numbers its identical rows"),
    ("ranged", "a ranged backfill replaces only its key range"),
    ("partitioned", "the table is partitioned"),
])
def test_what_the_rewrite_keeps(flag, reason):
    assert reason in refused(**{flag: True})


def test_a_column_the_batch_does_not_stage_or_a_type_the_table_does_not_hold_is_rewritten():
    assert refused(types={**STAGED, "gone": "int"}) == "the table has columns the batch does not stage (gone)"
    assert refused(types={**STAGED, "s": "bigint"}) == "column s is staged as int but the table holds bigint"


@pytest.mark.parametrize("kind, adopted", [
    ("int", True), ("bigint", True), ("timestamp", True), ("timestamp_ntz", True), ("decimal(38,10)", True),
    ("array<timestamp_ntz>", True), ("array<decimal(5,2)>", True), ("binary", True),
    ("map<string,int>", False), ("array<array<int>>", False), ("struct<a:int>", False), ("smallint", False),
])
def test_adoptable_types(kind, adopted):
    assert adoptable_type(kind) is adopted
    assert (refused({"c": kind}, {"c": kind}) is None) is adopted


def test_staged_snapshot_columns_are_numbered_as_iceberg_numbers_a_new_tables_columns():
    """Top-level columns 1..n in order, then list elements in order (Iceberg's fresh ids), so a
    staged file of a new table is adopted by a link; the values are untouched."""
    import pyarrow as pa

    from airflow_provider_pglogical.staging.batches import with_field_ids

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("arr", pa.list_(pa.int32())),
                        pa.field("s", pa.string()), pa.field("tsa", pa.list_(pa.timestamp("us")))],
                       metadata={b"k": b"v"})
    numbered = with_field_ids(schema)

    def ids(field: pa.Field) -> int:
        return int(field.metadata[b"PARQUET:field_id"])

    assert [ids(field) for field in numbered] == [1, 2, 3, 4]
    assert [ids(numbered.field(name).type.value_field) for name in ("arr", "tsa")] == [5, 6]
    assert numbered.equals(schema) and numbered.metadata == {b"k": b"v"}  # same names, types, nullability
    assert not numbered.field("id").nullable


@pytest.mark.parametrize("kind, expected", [
    ("bigint", "LongType()"), ("timestamp_ntz", "TimestampNTZType()"), ("decimal(12,2)", "DecimalType(12,2)"),
    ("array<array<int>>", "ArrayType(ArrayType(IntegerType(), True), True)"), ("map<int,int>", "None"),
    ("decimal", "None"), ("array<interval>", "None"),
])
def test_spark_types_parsed_without_the_sql_parser_or_left_to_it(kind, expected):
    from airflow_provider_pglogical.spark.apply.lakehouse_tables import spark_data_type

    assert repr(spark_data_type(kind)) == expected
