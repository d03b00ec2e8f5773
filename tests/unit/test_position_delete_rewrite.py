"""Which tables Iceberg 1.10's rewrite_position_delete_files cannot take: a list or map column at any depth
(the housekeeping run that skips it: tests/integration/test_iceberg_apply.py)."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, IntegerType, LongType, MapType, StringType, StructField, StructType

from airflow_provider_pglogical.spark.housekeeping.position_delete_rewrite import collection_columns


def test_list_and_map_columns_are_found_at_any_depth_and_flat_tables_have_none():
    flat = StructType([StructField("id", LongType()), StructField("note", StringType())])
    assert collection_columns(flat) == []
    nested = StructType([
        StructField("id", LongType()),
        StructField("tags", ArrayType(IntegerType())),
        StructField("address", StructType([StructField("lines", ArrayType(StringType())),
                                           StructField("zip", StringType())])),
        StructField("attrs", MapType(StringType(), StringType())),
    ])
    assert collection_columns(nested) == ["tags", "address.lines", "attrs"]
