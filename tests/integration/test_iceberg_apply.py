"""The Spark apply job against real Iceberg tables: batches staged with ``BatchWriter``, the job run
by a real ``spark-submit`` (local[2], and once on a Spark standalone cluster), the tables read back.

Scenario (pipeline ``shop``), LSNs in hex:

- ``S1`` snapshot at 0/1000: ``public.orders`` 1..8, ``public.events`` 1..3, ``public.items`` (every
  mapped type) 1..2.
- ``C1`` changes [0/1000, 0/2000): every change kind on orders (TOAST kept from the lakehouse, from an
  earlier change in the batch, across a key change and a chain of key changes, D then I, I then key
  change, U then D); inserts/update/delete of typed items; one event; ``public.tags`` (REPLICA
  IDENTITY FULL, no snapshot) created by its first change batch.
- ``C2`` changes [0/2000, 0/3000): orders gains a column;
  events: insert, TRUNCATE, inserts and an update after it; items: one update; tags: a delete
  matched on a NULL.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import uuid
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX, IcebergApplyOperator
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.typemap import map_type
from airflow_provider_pglogical.staging.values import text_to_arrow
from airflow_provider_pglogical.spark.jobs import maintenance
from airflow_provider_pglogical.spark.housekeeping.position_delete_rewrite import SKIPPED
from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping
from airflow_provider_pglogical.staging.contract import SNAPSHOT_PIPELINE
from tests.support.processes import kill_tree
from tests.support.spark_cluster import standalone_cluster
from tests.support.spark_jobs import apply_args, driver_java_conf, job_result, run_job, session_jars, start_job, submit_command

pytestmark = pytest.mark.spark

PIPELINE = "shop"

# --- staging ------------------------------------------------------------------------------------

ORDERS = [
    {"name": "id", "type": "int4", "key": True},
    {"name": "status", "type": "text"},
    {"name": "note", "type": "text"},
    {"name": "total", "type": "numeric", "formatted": "numeric(10,2)"},
]
ORDERS_V2 = [*ORDERS, {"name": "discount", "type": "numeric", "formatted": "numeric(5,2)"}]
EVENTS = [{"name": "id", "type": "int8", "key": True}, {"name": "payload", "type": "jsonb"}]
# REPLICA IDENTITY FULL without a primary key: every column is the key, NULLs included
TAGS = [{"name": "name", "type": "text", "key": True}, {"name": "value", "type": "int4", "key": True}]
ITEMS = [
    {"name": "id", "type": "int8", "key": True},
    {"name": "b", "type": "bool"},
    {"name": "i2", "type": "int2"},
    {"name": "i4", "type": "int4"},
    {"name": "i8", "type": "int8"},
    {"name": "f4", "type": "float4"},
    {"name": "f8", "type": "float8"},
    {"name": "n", "type": "numeric", "formatted": "numeric(38,10)"},
    {"name": "nu", "type": "numeric", "formatted": "numeric"},
    {"name": "t", "type": "text"},
    {"name": "vc", "type": "varchar", "formatted": "character varying(20)"},
    {"name": "c", "type": "bpchar", "formatted": "character(3)"},
    {"name": "by", "type": "bytea"},
    {"name": "d", "type": "date"},
    {"name": "tm", "type": "time"},
    {"name": "ts", "type": "timestamp"},
    {"name": "tstz", "type": "timestamptz"},
    {"name": "iv", "type": "interval"},
    {"name": "u", "type": "uuid"},
    {"name": "j", "type": "json"},
    {"name": "jb", "type": "jsonb"},
    {"name": "ai", "type": "_int4", "element_type": "int4"},
    {"name": "at", "type": "_text", "element_type": "text"},
    {"name": "mood", "type": "mood"},
    {"name": "Odd Name", "type": "text"},
]
# PostgreSQL text output of two typed rows (DateStyle ISO, TimeZone UTC, bytea hex, ...)
ITEM_TEXT = {
    1: ["1", "t", "-32768", "2147483647", "9223372036854775807", "1.17549435e-38", "2.2250738585072014e-308",
        "1234567890123456789012345678.0123456789", "3.14159265358979323846264338327950288419716939937510",
        "héllo ☃", "varchar", "ab ", "\\x00ff10", "2024-02-29", "23:59:59.999999", "2024-01-02 03:04:05.123456",
        "1999-12-31 23:59:59.999999+00", "P1Y2M3DT4H5M6.5S", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        '{"a": [1, 2]}', '{"b": null}', "{1,NULL,3}", '{"x y",NULL,"z\\"q"}', "happy", "odd"],
    2: ["2", "f", "0", "0", "0", "0", "0", "0.0000000001", "0", "", "", "   ", "\\x", "0001-01-01",
        "00:00:00", "1970-01-01 00:00:00", "2038-01-19 03:14:08+00", "PT0S", "00000000-0000-0000-0000-000000000000",
        "null", "[]", "{}", "{}", "sad", None],
    3: ["3", None, None, None, None, "Infinity", "-Infinity", "-99.5", "NaN", None, None, None, None, "9999-12-31",
        None, "2262-04-11 23:47:16.854775", "1900-01-01 00:00:00+00", "-P1D", None, None, None, "{NULL}", "{\"\"}",
        None, None],
    4: ["4", "t", "7", "7", "7", "7.5", "7.25", "7", "7", "seven", "s", "sev", "\\xdeadbeef", "2000-01-01",
        "12:00:00", "2000-01-01 12:00:00", "2000-01-01 12:00:00+00", "PT1H", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12",
        '{"k": "v"}', '{"k": 1}', "{7}", "{seven}", "ok", "7"],
}


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def typed(columns: list[dict], rows: list[list]) -> dict[str, pa.Array]:
    """Value columns parsed from PostgreSQL text exactly as the pull and snapshot code do it."""
    arrays = {}
    for index, column in enumerate(columns):
        mapped = map_type(column["type"], element_type=column.get("element_type"), formatted=column.get("formatted"))
        arrays[column["name"]] = text_to_arrow(pa.array([row[index] for row in rows], pa.string()), mapped, column["name"])
    return arrays


def snapshot_rows(columns: list[dict], rows: list[list]) -> pa.Table:
    return pa.table(typed(columns, rows))


def change_rows(columns: list[dict], changes: list[dict]) -> pa.Table:
    """``changes``: ``{"op", "lsn", "values": [text...] , "u": [...], "old": {key: text}}``."""
    key = [c["name"] for c in columns if c.get("key")]
    data: dict[str, pa.Array] = {
        "_op": pa.array([c["op"] for c in changes], pa.string()),
        "_commit_lsn": pa.array([lsn(c["lsn"]) for c in changes], pa.int64()),
        "_seq": pa.array(range(len(changes)), pa.int64()),
        "_xid": pa.array([1000] * len(changes), pa.int64()),
        "_commit_ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * len(changes), pa.timestamp("us", tz="UTC")),
        "_unchanged_toast": pa.array([c.get("u") or None for c in changes], pa.list_(pa.string())),
    }
    values = [c.get("values") or [None] * len(columns) for c in changes]
    data.update(typed(columns, values))
    for name in key:
        column = next(c for c in columns if c["name"] == name)
        old = [[c.get("old", {}).get(name)] for c in changes]
        data["_old_" + name] = typed([column], old)[name]
    return pa.table(data)


def write_batch(root: Path, kind: str, start: str, end: str, tables: dict, details: dict | None = None) -> None:
    from airflow.sdk import ObjectStoragePath

    writer = BatchWriter(ObjectStoragePath(root.as_uri()),
                         BatchManifest(pipeline=PIPELINE, kind=kind, start_lsn=start, end_lsn=end, details=details or {}))
    for source, (columns, data, table_details, *identity) in tables.items():
        schema, name = source.split(".")
        key = [c["name"] for c in columns if c.get("key")]
        writer.add_table(TableManifest(schema=schema, name=name, columns=columns, key=key, details=table_details or {},
                                       replica_identity=identity[0] if identity else "d"))
        writer.write_part(source, data)
    writer.commit()


def order(i, status, note, total, discount=None):
    return [str(i), status, note, total] + ([discount] if discount is not None else [])


def stage_shop(root: Path) -> None:
    write_batch(root, "snapshot", "0/1000", "0/1000", {
        "public.orders": (ORDERS, snapshot_rows(ORDERS, [order(i, "new", f"N{i}", f"{i}0.00") for i in range(1, 9)]), None),
        "public.events": (EVENTS, snapshot_rows(EVENTS, [[str(i), f'{{"e": {i}}}'] for i in (1, 2, 3)]), None),
        "public.items": (ITEMS, snapshot_rows(ITEMS, [ITEM_TEXT[1], ITEM_TEXT[2]]), None),
    })
    c1_orders = [
        {"op": "U", "lsn": "0/1100", "values": order(1, "paid", None, "10.00"), "u": ["note"]},
        {"op": "I", "lsn": "0/1100", "values": order(9, "new", "N9", "90.00")},
        {"op": "U", "lsn": "0/1200", "values": order(9, "paid", None, "90.00"), "u": ["note"]},
        {"op": "D", "lsn": "0/1200", "values": ["2", None, None, None]},
        {"op": "U", "lsn": "0/1300", "values": order(30, "moved", "N30", "31.00"), "old": {"id": "3"}},
        {"op": "U", "lsn": "0/1300", "values": order(40, "moved4", None, "40.00"), "u": ["note"], "old": {"id": "4"}},
        {"op": "U", "lsn": "0/1400", "values": order(50, "hop", None, "50.00"), "u": ["note"], "old": {"id": "5"}},
        {"op": "U", "lsn": "0/1400", "values": order(500, "chain", None, "50.00"), "u": ["note"], "old": {"id": "50"}},
        {"op": "D", "lsn": "0/1500", "values": ["6", None, None, None]},
        {"op": "I", "lsn": "0/1500", "values": order(6, "again", "N6b", "61.00")},
        {"op": "U", "lsn": "0/1600", "values": order(7, "x", "N7x", "70.00")},
        {"op": "U", "lsn": "0/1600", "values": order(7, "y", None, "70.00"), "u": ["note"]},
        {"op": "I", "lsn": "0/1700", "values": order(10, "new", "N10", "100.00")},
        {"op": "U", "lsn": "0/1700", "values": order(11, "renum", None, "100.00"), "u": ["note"], "old": {"id": "10"}},
        {"op": "U", "lsn": "0/1800", "values": order(8, "new", None, "81.00"), "u": ["note"]},
        {"op": "D", "lsn": "0/1800", "values": ["8", None, None, None]},
    ]
    c1_items = [
        {"op": "I", "lsn": "0/1100", "values": ITEM_TEXT[3]},
        {"op": "I", "lsn": "0/1100", "values": ITEM_TEXT[4]},
        {"op": "D", "lsn": "0/1200", "values": ["2"] + [None] * (len(ITEMS) - 1)},
        {"op": "U", "lsn": "0/1300", "values": ITEM_TEXT[1][:9] + ["updated"] + ITEM_TEXT[1][10:]},
    ]
    write_batch(root, "changes", "0/1000", "0/2000", {
        "public.orders": (ORDERS, change_rows(ORDERS, c1_orders), None),
        "public.items": (ITEMS, change_rows(ITEMS, c1_items), None),
        "public.events": (EVENTS, change_rows(EVENTS, [{"op": "I", "lsn": "0/1900", "values": ["4", '{"e": 4}']}]), None),
        "public.tags": (TAGS, change_rows(TAGS, [
            {"op": "I", "lsn": "0/1100", "values": ["a", "1"]},
            {"op": "I", "lsn": "0/1100", "values": ["b", None]},
            {"op": "I", "lsn": "0/1100", "values": ["c", "3"]},
            {"op": "I", "lsn": "0/1100", "values": ["d", "4"]},
            {"op": "U", "lsn": "0/1200", "values": ["a", "2"], "old": {"name": "a", "value": "1"}},
            {"op": "U", "lsn": "0/1300", "values": ["e", None], "old": {"name": "d", "value": "4"}, "u": ["value"]},
        ]), None, "f"),
    })
    c2_orders = [
        {"op": "U", "lsn": "0/2100", "values": order(1, "paid2", None, "10.00", "1.50"), "u": ["note"]},
        {"op": "I", "lsn": "0/2100", "values": order(12, "new", "N12", "120.00", "0.25")},
    ]
    c2_events = [
        {"op": "I", "lsn": "0/2100", "values": ["5", '{"e": 5}']},
        {"op": "T", "lsn": "0/2200"},
        {"op": "I", "lsn": "0/2300", "values": ["6", '{"e": 6}']},
        {"op": "I", "lsn": "0/2300", "values": ["7", '{"e": 7}']},
        {"op": "U", "lsn": "0/2400", "values": ["7", None], "u": ["payload"]},
    ]
    c2_items = [{"op": "U", "lsn": "0/2600", "values": ITEM_TEXT[3][:9] + ["late"] + ITEM_TEXT[3][10:]}]
    write_batch(root, "changes", "0/2000", "0/3000", {
        "public.orders": (ORDERS_V2, change_rows(ORDERS_V2, c2_orders), None),
        "public.events": (EVENTS, change_rows(EVENTS, c2_events), None),
        "public.items": (ITEMS, change_rows(ITEMS, c2_items), None),
        "public.tags": (TAGS, change_rows(TAGS, [{"op": "D", "lsn": "0/2100", "values": ["b", None]}]), None, "f"),
    })


def expected_orders(note_30: str = "N30") -> list[dict]:
    def row(i, status, note, total, discount=None):
        return {"id": i, "status": status, "note": note, "total": Decimal(total),
                "discount": None if discount is None else Decimal(discount)}

    return [
        row(1, "paid2", "N1", "10.00", "1.50"),   # TOAST kept from the lakehouse, twice; added column
        row(6, "again", "N6b", "61.00"),          # D then I
        row(7, "y", "N7x", "70.00"),              # TOAST from an earlier change in the batch
        row(9, "paid", "N9", "90.00"),            # I then U with TOAST unchanged
        row(11, "renum", "N10", "100.00"),        # I then key change with TOAST unchanged
        row(12, "new", "N12", "120.00", "0.25"),  # insert after a schema change
        row(30, "moved", note_30, "31.00"),       # key change: 3 is gone
        row(40, "moved4", "N4", "40.00"),         # key change, TOAST from the old key's lakehouse row
        row(500, "chain", "N5", "50.00"),         # 5 -> 50 -> 500, TOAST followed through the chain
    ]


def expected_items(overrides: dict | None = None) -> list[dict]:
    rows = {1: ITEM_TEXT[1][:9] + ["updated"] + ITEM_TEXT[1][10:], 3: ITEM_TEXT[3][:9] + ["late"] + ITEM_TEXT[3][10:],
            4: ITEM_TEXT[4]}
    rows.update(overrides or {})
    return snapshot_rows(ITEMS, [rows[k] for k in sorted(rows) if rows[k] is not None]).to_pylist()


EXPECTED_EVENTS = [{"id": 6, "payload": '{"e": 6}'}, {"id": 7, "payload": '{"e": 7}'}]
# 'b' (NULL value) deleted by a null-safe match; 'd' renamed 'e' with its TOASTed value from the old tuple
# a keyless table is a multiset: each row is copy 1 of its value, written by C1
EXPECTED_TAGS = [{"name": name, "value": value, "_pglogical_occurrence": 1,
                  "_pglogical_batch": "0000000000001000-0000000000002000-changes"}
                 for name, value in (("a", 2), ("c", 3), ("e", 4))]

# --- Spark --------------------------------------------------------------------------------------


def spark_submit(warehouse: Path, namespace: str, root: Path, *, env: dict | None = None,
                 options: dict | None = None, wait: bool = True):
    command = submit_command(APPLY_JOB, apply_args(root.as_uri(), PIPELINE, namespace=namespace,
                                                   table_map={"public.items": "items"}, **(options or {})),
                             IcebergConfig(warehouse=warehouse.as_uri(), namespace=namespace))
    if not wait:
        return start_job(command, env=env)
    return run_job(command, env=env, timeout=600)


def applied(warehouse, namespace, root, **kwargs) -> dict:
    code, output = spark_submit(warehouse, namespace, root, **kwargs)
    assert code == 0, output[-5000:]
    return job_result(output, RESULT_PREFIX)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """A staging root with the shop batches, a warehouse, and an in-process Spark session reading it."""
    from pyspark.sql import SparkSession

    base = tmp_path_factory.mktemp("lake")
    root, warehouse = base / "staging", base / "warehouse"
    stage_shop(root)
    conf = IcebergConfig(warehouse=warehouse.as_uri(), extra_conf={"spark.sql.catalog.lake.cache-enabled": "false"})
    builder = SparkSession.builder.master("local[1]").appName("test-iceberg-apply")
    for key, value in {**conf.spark_conf(), "spark.sql.session.timeZone": "UTC", "spark.sql.caseSensitive": "true",
                       "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS", "spark.ui.enabled": "false",
                       "spark.sql.shuffle.partitions": "2",
                       "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED", **driver_java_conf(),
                       "spark.jars": session_jars()}.items():
        builder = builder.config(key, value)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = builder.getOrCreate()
    yield Lake(spark, root, warehouse, base)
    spark.stop()


class Lake:
    def __init__(self, spark, root, warehouse, base):
        self.spark, self.root, self.warehouse, self.base = spark, root, warehouse, base

    def rows(self, namespace: str, table: str) -> list[dict]:
        """The table's rows as Arrow reads them (exact types), ordered by the first column."""
        frame = self.spark.table(f"lake.{namespace}.`{table}`")
        out = self.base / f"dump-{uuid.uuid4().hex}"
        frame.orderBy(frame.columns[0]).coalesce(1).write.parquet(str(out))
        return pq.read_table(str(out)).to_pylist()

    def state(self, namespace: str) -> dict[str, dict]:
        rows = self.spark.table(f"lake.{namespace}._pglogical_state").collect()
        return {r.source_table: r.asDict() for r in rows}

    def snapshot_count(self, namespace: str, table: str) -> int:
        return self.spark.table(f"lake.{namespace}.{table}.snapshots").count()

    def live_files(self, namespace: str, table: str) -> dict[str, int]:
        """How many data and delete files the table's current snapshot reads."""
        rows = self.spark.sql(f"SELECT content, count(*) AS n FROM lake.{namespace}.`{table}`.files GROUP BY content")
        counts = {row.content: row.n for row in rows.collect()}
        return {"data": counts.get(0, 0), "deletes": counts.get(1, 0) + counts.get(2, 0)}

    def live_paths(self, namespace: str, table: str) -> set[Path]:
        rows = self.spark.sql(f"SELECT file_path FROM lake.{namespace}.`{table}`.files").collect()
        return {Path(row.file_path.removeprefix("file:")) for row in rows}

    def everything(self, namespace: str) -> dict:
        return {t: self.rows(namespace, t) for t in ("public__orders", "public__events", "items", "public__tags")}


def assert_shop(lake: Lake, namespace: str, note_30: str = "N30", items: dict | None = None) -> None:
    assert lake.rows(namespace, "public__orders") == expected_orders(note_30)
    assert lake.rows(namespace, "public__events") == EXPECTED_EVENTS
    assert lake.rows(namespace, "items") == expected_items(items)
    assert lake.rows(namespace, "public__tags") == EXPECTED_TAGS


# --- tests --------------------------------------------------------------------------------------


def test_apply_every_change_kind_type_and_schema_change_then_reapply_exactly(lake):
    first = applied(lake.warehouse, "shop", lake.root)
    # tables advance in rounds, one step each: S1, then C1, then C2 (tags has no snapshot)
    assert [(s["table"], s["kind"], s["batch"][:16]) for s in first["steps"]] == [
        ("public.events", "snapshot", "0000000000001000"), ("public.items", "snapshot", "0000000000001000"),
        ("public.orders", "snapshot", "0000000000001000"), ("public.tags", "changes", "0000000000001000"),
        ("public.events", "changes", "0000000000001000"), ("public.items", "changes", "0000000000001000"),
        ("public.orders", "changes", "0000000000001000"), ("public.tags", "changes", "0000000000002000"),
        ("public.events", "changes", "0000000000002000"), ("public.items", "changes", "0000000000002000"),
        ("public.orders", "changes", "0000000000002000"),
    ]
    assert_shop(lake, "shop")
    schema = {f.name: f.dataType.simpleString() for f in lake.spark.table("lake.shop.items").schema.fields}
    assert schema == {c["name"]: map_type(c["type"], element_type=c.get("element_type"),
                                          formatted=c.get("formatted")).spark for c in ITEMS}
    properties = {r.key: r.value for r in lake.spark.sql("SHOW TBLPROPERTIES lake.shop.public__orders").collect()}
    assert properties["write.merge.mode"] == "merge-on-read"
    assert properties["format-version"] == "2"
    assert json.loads(properties["pglogical.replica-identity-key"]) == ["id"]
    state = lake.state("shop")
    assert {s: v["position"] for s, v in state.items()} == {
        s: "0000000000003000" for s in ("public.events", "public.items", "public.orders", "public.tags")}
    tags = {r.key: r.value for r in lake.spark.sql("SHOW TBLPROPERTIES lake.shop.public__tags").collect()}
    assert json.loads(tags["pglogical.replica-identity-key"]) == ["name", "value"]
    assert tags["pglogical.multiset-numbered"] == "true"  # created numbered: no step scans for unnumbered rows
    assert "pglogical.multiset-numbered" not in properties
    assert state["public.items"]["target_table"] == "items"
    before = lake.everything("shop")
    snapshots = lake.snapshot_count("shop", "public__orders")

    # the same batches again: nothing to do, nothing written
    assert applied(lake.warehouse, "shop", lake.root)["steps"] == []
    assert lake.snapshot_count("shop", "public__orders") == snapshots

    # the state commit of the last step "lost" (a crash between the MERGE and the state write):
    # that step is applied a second time, exactly
    lake.spark.sql("UPDATE lake.shop._pglogical_state SET position = '0000000000002000' "
                   "WHERE source_table IN ('public.orders', 'public.events')")
    again = applied(lake.warehouse, "shop", lake.root)
    assert [(s["table"], s["batch"]) for s in again["steps"]] == [
        ("public.events", "0000000000002000-0000000000003000-changes"),
        ("public.orders", "0000000000002000-0000000000003000-changes")]
    assert lake.everything("shop") == before


def test_bucketed_tables_merge_through_a_bucketed_batch_table_exactly(lake):
    """With --bucket-count the targets are bucketed by key, each batch MERGEs from an Iceberg table
    bucketed alike (a storage-partitioned join), and the result is the same as unbucketed."""
    first = applied(lake.warehouse, "shop_bucketed", lake.root, options={"bucket_count": 4})
    assert [s["kind"] for s in first["steps"]].count("changes") == 8
    assert_shop(lake, "shop_bucketed")
    spec = [r.data_type for r in lake.spark.sql("DESCRIBE TABLE lake.shop_bucketed.public__orders").collect()
            if r.col_name.startswith("Part ")]
    assert spec == ["bucket(4, id)"]
    tables = {r.tableName for r in lake.spark.sql("SHOW TABLES IN lake.shop_bucketed").collect()}
    assert not [t for t in tables if t.startswith("_pglogical_batch")], tables  # dropped after each MERGE
    before = lake.everything("shop_bucketed")
    lake.spark.sql("UPDATE lake.shop_bucketed._pglogical_state SET position = '0000000000001000' "
                   "WHERE source_table = 'public.orders'")
    # a batch table a killed run left behind is dropped by the next run
    lake.spark.sql("CREATE TABLE lake.shop_bucketed._pglogical_batch__public__orders__dead (id bigint) USING iceberg")
    applied(lake.warehouse, "shop_bucketed", lake.root, options={"bucket_count": 4})
    assert lake.everything("shop_bucketed") == before
    tables = {r.tableName for r in lake.spark.sql("SHOW TABLES IN lake.shop_bucketed").collect()}
    assert not [t for t in tables if t.startswith("_pglogical_batch")], tables


def test_killed_between_data_and_state_commit_then_killed_anywhere_then_rerun(lake, tmp_path):
    # killed after a snapshot's staged files were copied into a table and before their commit: the
    # copies are orphans (housekeeping's remove_orphan_files deletes them), the table has no row
    code, output = spark_submit(lake.warehouse, "crash", lake.root, env={"PGLOGICAL_ADOPT_CRASH": "copied"})
    assert code != 0 and "crash point reached: adoption copied" in output, output[-3000:]
    copies = set((lake.warehouse / "crash").glob("*/data/*-adopted.parquet"))
    assert copies and lake.state("crash") == {}
    # staged without field ids (write_part): copied under a footer with the table's ids, not linked
    assert all(copy.stat().st_nlink == 1 for copy in copies)
    tables = [r.tableName for r in lake.spark.sql("SHOW TABLES IN lake.crash").collect()]
    assert not [t for t in tables if lake.spark.table(f"lake.crash.`{t}`").count()], tables
    # the dangerous point: the MERGEs of round 2 (steps 5-8: C1, and C2 of tags) are committed,
    # their positions are not
    code, output = spark_submit(lake.warehouse, "crash", lake.root, env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "8"})
    assert code != 0, output[-3000:]
    assert {s: v["position"][-4:] for s, v in lake.state("crash").items()} == {
        "public.events": "1000", "public.items": "1000", "public.orders": "1000", "public.tags": "2000"}

    # the re-run is SIGKILLed (spark-submit and its driver) after its first state commit: a new
    # snapshot of the state table (the apply's lease changes only the table's properties)
    state_metadata = lake.warehouse / "crash" / "_pglogical_state" / "metadata"

    def state_snapshot() -> int | None:
        newest = max(state_metadata.glob("v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
        return json.loads(newest.read_text()).get("current-snapshot-id")

    snapshot = state_snapshot()
    local_dirs = tmp_path / "spark-local"  # the driver's temporary directory, which a SIGKILL leaves behind
    local_dirs.mkdir()
    process = spark_submit(lake.warehouse, "crash", lake.root, wait=False, env={"SPARK_LOCAL_DIRS": str(local_dirs)})

    def state_committed() -> bool:
        assert process.poll() is None, process.stdout.read()[-5000:]
        return state_snapshot() != snapshot

    wait_until(state_committed, timeout=300, interval=0.02, message="the re-run's first state commit")
    kill_tree(process)
    process.wait()
    # the jars are on the local driver's class path, not copied into its directory (47 MB a start,
    # 374 MB with S3's: lakehouse_access.local_class_path), so a killed driver leaves no copy behind
    assert [path.name for path in local_dirs.rglob("*.jar")] == []
    assert {s: v["position"][-4:] for s, v in lake.state("crash").items()} == {
        "public.events": "2000", "public.items": "2000", "public.orders": "2000", "public.tags": "3000"}

    rerun = applied(lake.warehouse, "crash", lake.root)
    assert [s["batch"][:16] for s in rerun["steps"]] == ["0000000000002000"] * 3
    assert_shop(lake, "crash")
    live = set().union(*(lake.live_paths("crash", t) for t in ("public__orders", "public__events", "items")))
    assert copies and not copies & live  # the killed run's copies were never committed


def test_late_full_backfill_and_ranged_backfill(lake, tmp_path):
    """Namespace ``late`` (its own: the test needs no other) is applied to 0/3000; then two
    backfills arrive late."""
    applied(lake.warehouse, "late", lake.root)
    root = tmp_path / "staging"
    shutil.copytree(lake.root, root)
    # a full backfill of orders at 0/1800, after the lakehouse has passed 0/3000: what PostgreSQL
    # held at 0/1800 (row 30 "repaired", row 8 not yet updated nor deleted)
    at_1800 = [order(1, "paid", "N1", "10.00"), order(6, "again", "N6b", "61.00"), order(7, "y", "N7x", "70.00"),
               order(8, "new", "N8", "80.00"), order(9, "paid", "N9", "90.00"), order(11, "renum", "N10", "100.00"),
               order(30, "moved", "N30-repaired", "31.00"), order(40, "moved4", "N4", "40.00"),
               order(500, "chain", "N5", "50.00")]
    write_batch(root, "snapshot", "0/1800", "0/1800", {"public.orders": (ORDERS, snapshot_rows(ORDERS, at_1800), None)},
                details={"backfill": True, "key_range": None})
    # a ranged backfill of items id in [3, 5) at 0/2500: 3 changed, 4 deleted at the source
    item_3 = ITEM_TEXT[3][:9] + ["backfilled"] + ITEM_TEXT[3][10:]
    write_batch(root, "snapshot", "0/2500", "0/2500", {"public.items": (ITEMS, snapshot_rows(ITEMS, [item_3]),
                                                                         {"extra_where": '"id" >= 3 AND "id" < 5'})},
                details={"backfill": True, "key_range": {"column": "id", "start": 3, "end": 5}})
    steps = applied(lake.warehouse, "late", root)["steps"]
    assert [(s["table"], s["kind"], s["batch"][:16]) for s in steps] == [
        ("public.items", "snapshot", "0000000000002500"), ("public.orders", "snapshot", "0000000000001800"),
        ("public.items", "changes", "0000000000002000"), ("public.orders", "changes", "0000000000001000"),
        ("public.orders", "changes", "0000000000002000"),
    ]
    # orders: the snapshot, then C1 from 0/1800 (8 updated and deleted), then C2
    assert lake.rows("late", "public__orders") == expected_orders(note_30="N30-repaired")
    # items: 3 from the backfill then C2's update at 0/2600 again; 4 gone; 1 untouched
    assert lake.rows("late", "items") == expected_items({3: ITEM_TEXT[3][:9] + ["late"] + ITEM_TEXT[3][10:], 4: None})
    assert lake.rows("late", "public__events") == EXPECTED_EVENTS
    state = lake.state("late")
    assert {s["position"] for s in state.values()} == {"0000000000003000"}
    assert "0000000000001800-0000000000001800-snapshot" in state["public.orders"]["applied_snapshots"]

    # housekeeping (the job's run(), in this session) after these applies: orders is merge-on-read,
    # so its updates and deletes left delete files
    before = lake.everything("late")
    orders = lake.warehouse / "late" / "public__orders"
    files_before = lake.live_files("late", "public__orders")
    assert 1 < files_before["data"] < Housekeeping().min_input_files and files_before["deletes"] > 0, files_before
    assert lake.snapshot_count("late", "public__orders") > 3
    # a stray file a failed write left days ago, and one a write still in flight has just written
    old_orphan, young_orphan = orders / "data" / "00000-0-failed-write.parquet", orders / "data" / "in-flight.parquet"
    for orphan in (old_orphan, young_orphan):
        orphan.write_bytes(b"PAR1 not referenced by any snapshot")
    four_days_ago = (dt.datetime.now() - dt.timedelta(days=4)).timestamp()
    os.utime(old_orphan, (four_days_ago, four_days_ago))

    # the defaults, but expire every snapshot it may: orders has too few files to compact by
    # count (2 < min_input_files), its data files are rewritten because deletes apply to them
    summary = maintenance.run(lake.spark, "lake", "late", None, Housekeeping(older_than_hours=0, retain_last=1))
    assert set(summary["tables"]) == {"_pglogical_state", "items", "public__events", "public__orders", "public__tags"}
    report = summary["tables"]["public__orders"]
    assert list(report) == ["rewrite_data_files", "remove_dead_deletes", "rewrite_position_delete_files",
                            "rewrite_manifests", "expire_snapshots", "remove_orphan_files"]
    assert report["rewrite_data_files"]["rewritten_data_files_count"] == files_before["data"]
    # items has a list column: Iceberg 1.10's rewrite_position_delete_files fails there, so it is
    # skipped and said so, and the other steps ran (apache/iceberg#14619)
    assert summary["tables"]["items"]["rewrite_position_delete_files"] == {"skipped": SKIPPED}
    assert "expire_snapshots" in summary["tables"]["items"]
    # the rows are the same, in fewer files, without delete files, with one snapshot left
    assert lake.everything("late") == before
    files_after = lake.live_files("late", "public__orders")
    assert files_after["data"] < files_before["data"] and files_after["deletes"] == 0, (files_before, files_after)
    # every snapshot before the newest one an apply committed is expired; that one and the
    # housekeeping's own after it are kept (a killed apply finds its landed commit by it:
    # spark/housekeeping/pipeline_commits.py)
    kept = lake.spark.sql("SELECT summary FROM lake.late.public__orders.snapshots ORDER BY committed_at").collect()
    assert SNAPSHOT_PIPELINE in kept[0].summary and all(SNAPSHOT_PIPELINE not in k.summary for k in kept[1:]), kept
    assert len(kept) > 1
    # the files only expired snapshots used are gone from storage, the old orphan too; the young
    # stray file is kept (it could belong to a commit still in flight)
    assert report["remove_orphan_files"] == {"orphan_files_count": 1, "orphan_files": [f"file:{old_orphan}"]}
    assert not old_orphan.exists() and young_orphan.exists()
    on_disk = {path for path in (orders / "data").rglob("*.parquet") if path != young_orphan}
    referenced = lake.spark.sql("SELECT file_path FROM lake.late.public__orders.all_files").collect()
    assert on_disk == {Path(row.file_path.removeprefix("file:")) for row in referenced}
    assert lake.live_paths("late", "public__orders") < on_disk  # the compacted files, until the next run


def test_apply_on_a_standalone_cluster(lake, tmp_path):
    """The same job on a Spark standalone master + worker on loopback, started and stopped here."""
    with standalone_cluster(tmp_path, workers=1, cores=2, memory="2g") as (port, _env):
        # through the operator and the Spark provider's hook, as a DAG runs it
        os.environ["AIRFLOW_CONN_SPARK_TEST_CLUSTER"] = json.dumps(
            {"conn_type": "spark", "host": "spark://127.0.0.1", "port": port})
        try:
            operator = IcebergApplyOperator(
                task_id="apply", conn_id="spark_test_cluster", staging_root=lake.root.as_uri(), pipeline=PIPELINE,
                iceberg=IcebergConfig(warehouse=lake.warehouse.as_uri(), namespace="cluster"),
                table_map={"public.items": "items"}, conf={"spark.ui.enabled": "false"},
                env_vars={"SPARK_LOCAL_IP": "127.0.0.1"})
            result = operator.execute(context={})
            assert result == {"pipeline": PIPELINE, "state_table": "lake.cluster._pglogical_state", "steps": 11,
                              "rows": result["rows"],
                              "tables": ["public.events", "public.items", "public.orders", "public.tags"]}
            assert_shop(lake, "cluster")
        finally:
            os.environ.pop("AIRFLOW_CONN_SPARK_TEST_CLUSTER", None)


def test_tables_created_through_the_catalog_are_the_ones_create_table_makes(lake, monkeypatch):
    """The apply creates its state and target tables through Spark's catalog plugin (no SQL parse
    in a fresh JVM); what it makes is what its CREATE TABLE statement makes, which stays the
    fallback for a type the job does not parse."""
    from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse

    def created(namespace: str, write_mode: str, by_catalog: bool) -> dict:
        if not by_catalog:
            monkeypatch.setattr(Lakehouse, "create_by_catalog", lambda *args, **kwargs: False)
        lakehouse = Lakehouse(lake.spark, "lake", namespace, write_mode, 4)
        lakehouse.state.state_table()
        lakehouse.ensure_table("items", TableManifest(columns=ITEMS, key=["id"]))
        lakehouse.ensure_table("tags", TableManifest(columns=TAGS, key=["name", "value"], replica_identity="f"))
        monkeypatch.undo()
        found = {}
        for name in ("_pglogical_state", "items", "tags"):
            table = lakehouse.iceberg_table(name)
            found[name] = (table.schema().toString(), table.spec().toString(), table.sortOrder().toString(),
                           {k: v for k, v in dict(table.properties()).items() if k != "owner"})
        return found

    assert created("by_catalog", "merge-on-read", True) == created("by_sql", "merge-on-read", False)
