"""Every value PostgreSQL can hold lands exactly, or as text by a ``type_overrides`` entry, or
stops the sync with an error naming the table, the column, the value and the override to set.

Special values go through the snapshot AND the pull AND one real Spark apply into Iceberg, and
the Iceberg rows are compared with the publisher's; failures leave no slot and no batch behind;
values of 9 MiB and 40 MiB go through the snapshot.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from airflow.sdk import ObjectStoragePath
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.exceptions import UnrepresentableValue
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.staging import batches, layout
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.capture import source_projection
from airflow_provider_pglogical.capture.backfill import run_backfill
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.capture.peek import peek_window
from airflow_provider_pglogical.capture.pull import run_pull, stage_batch
from airflow_provider_pglogical.verification.witness import verify_tables
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.spark.jobs import verify_tables as verify_job
from airflow_provider_pglogical.lakehouse.staging_roots import storage_path
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import reading_session


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


SPECIAL = """
CREATE TABLE special (
    id int PRIMARY KEY,
    d date, ts timestamp, tz timestamptz, f4 real, f8 float8, n numeric(10,2), nu numeric,
    arr int[], tsa timestamp[],
    -- no exact lakehouse form for some of their values: staged as text by type_overrides
    d_inf date, tz_inf timestamptz, n_nan numeric(10,2), arr_b int[]
);
CREATE PUBLICATION pub FOR TABLE special;
"""
# id, d, ts, tz, f4, f8, n, nu, arr, tsa, d_inf, tz_inf, n_nan, arr_b
SNAPSHOT_ROWS = """
INSERT INTO special VALUES
 (1, '0044-03-15 BC', '4713-01-01 00:00:00 BC', '0001-12-31 23:59:59.999999+00 BC', 'NaN', 'Infinity',
  -12345678.99, 'NaN', '{1,NULL,3}', '{"0044-03-15 12:00:00 BC","2020-01-01 00:00:00.000001"}',
  'infinity', 'infinity', 'NaN', '[0:1]={7,8}'),
 (2, '294276-12-31', '294246-12-31 23:59:59.999999', '12345-06-07 08:09:10.5+00', '-Infinity', '-Infinity',
  0.01, 'Infinity', '{}', '{}', '-infinity', '294276-12-31 23:59:59.999999+00', 12.5, '{{1,2},{3,4}}'),
 (3, '2024-02-29', '2024-02-29 12:00:00', '2024-02-29 12:00:00+00', 1.5, 2.25, 3.5, '-Infinity', '{4}',
  '{"2024-02-29 12:00:00"}', '2024-02-29', '2024-02-29 12:00:00+00', 1, '{5}'),
 (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
"""
CHANGES = """
INSERT INTO special VALUES
 (5, '5874897-12-31', '1999-12-31 23:59:59.999999', '4714-11-24 00:00:00+00 BC', 3.4028235e38, -0.0,
  99999999.99, '1e-300', '{-2147483648}', '{"10000-01-01 00:00:00"}',
  '-infinity', '-infinity', 'NaN', '[-3:-2]={1,2}');
UPDATE special SET d = '0001-01-01 BC', ts = 'epoch', tz = '294247-01-10 04:00:54.775807+00', f8 = 'NaN',
                   d_inf = 'infinity', tz_inf = '1900-01-01 00:00:00+00', n_nan = 'NaN', arr_b = '[2:2]={9}'
 WHERE id = 3;
DELETE FROM special WHERE id = 4;
"""
OVERRIDES = {f"public.special.{c}": "string" for c in ("d_inf", "tz_inf", "n_nan", "arr_b")}


def micros(column: str) -> str:
    """Microseconds since 1970 of a timestamp, exact (``extract(epoch …) * 1e6`` rounds near the int64 edge)."""
    return (f"((extract(epoch FROM date_trunc('minute', {column})) * 1000000)::bigint"
            f" + extract(microseconds FROM {column})::bigint)")


# The publisher's values in a form that compares exactly with Iceberg's (days, microseconds since
# 1970, float8 of a real, PostgreSQL's text output for the overridden columns).
EXPECTED = f"""
SELECT id, d - DATE '1970-01-01', {micros('ts')}, {micros('tz')}, f4::float8, f8, n, nu::text, arr,
       CASE WHEN tsa IS NOT NULL THEN ARRAY(SELECT {micros('x')} FROM unnest(tsa) x) END,
       d_inf::text, tz_inf::text, n_nan::text, arr_b::text
  FROM special ORDER BY id
"""
COLUMNS = ["id", "d", "ts", "tz", "f4", "f8", "n", "nu", "arr", "tsa", "d_inf", "tz_inf", "n_nan", "arr_b"]


def publisher_values(publisher) -> list[dict]:
    conn = publisher.connect()
    try:
        with conn.cursor() as cur:
            for key, value in values.SESSION_SETTINGS.items():
                cur.execute("SELECT set_config(%s, %s, false)", (key, value))
            cur.execute(EXPECTED)
            return [dict(zip(COLUMNS, row)) for row in cur.fetchall()]
    finally:
        conn.close()


def as_numbers(table: pa.Table) -> list[dict]:
    """Rows with dates as days and timestamps as microseconds since 1970 (Python's datetime cannot
    hold BC years or years past 9999)."""
    columns = {}
    for name in table.column_names:
        column = table[name].combine_chunks()
        if pa.types.is_date32(column.type):
            column = column.view(pa.int32())
        elif pa.types.is_timestamp(column.type):
            column = column.view(pa.int64())
        elif pa.types.is_list(column.type) and pa.types.is_timestamp(column.type.value_type):
            column = pa.ListArray.from_arrays(column.offsets, column.values.view(pa.int64()),
                                              mask=column.is_null())
        columns[name] = column
    return pa.table(columns).to_pylist()


def same(left: list[dict], right: list[dict]) -> bool:
    """Equal, with NaN equal to NaN and -0.0 told apart from 0.0."""
    def key(value):
        if isinstance(value, float):
            return ("float", repr(value))
        if isinstance(value, list):
            return [key(v) for v in value]
        return value
    return [{k: key(v) for k, v in row.items()} for row in left] == [{k: key(v) for k, v in row.items()} for row in right]


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = reading_session(tmp_path_factory.mktemp("warehouse"), "test-special-values", {
        "spark.sql.caseSensitive": "true", "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED"})
    yield session
    session.stop()


def iceberg_rows(spark, tmp_path, table: str) -> list[dict]:
    """The Iceberg table's rows as Parquet written by Spark and read by pyarrow (exact types)."""
    out = tmp_path / f"dump-{uuid.uuid4().hex}"
    spark.table(table).orderBy("id").coalesce(1).write.parquet(str(out))
    return as_numbers(pq.read_table(str(out)))


@pytest.mark.spark
def test_special_values_through_snapshot_pull_and_apply(publisher, publisher_hook, root, spark, tmp_path):
    publisher.execute(SPECIAL)
    publisher.execute(SNAPSHOT_ROWS)
    snapshot = run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p",
                                type_overrides=OVERRIDES)
    staged = layout.read_manifest(root, "p", snapshot["batch"].rsplit("/", 1)[1]).tables["public.special"]
    assert {c.name: c.override for c in staged.columns if c.override} == {
        name.rsplit(".", 1)[1]: "string" for name in OVERRIDES}
    snapshot_rows = as_numbers(batches.read_table(root, "p", staged_name(snapshot), staged).sort_by("id"))
    assert same(snapshot_rows, publisher_values(publisher)), snapshot_rows

    publisher.execute(CHANGES)
    # The message-by-message decoder (streamed and two-phase windows) stages the same values.
    (upto,) = publisher.query("SELECT pg_current_wal_flush_lsn()::text")[0]
    window = peek_window(publisher_hook.connect_kwargs(), "s1", ["pub"], Lsn.parse(upto), 1000, None, vectorised=False)
    other = root.parent / "assembled"
    assembled = stage_batch(publisher_hook, other, "p", Lsn.parse(snapshot["lsn"]), Lsn.parse(upto), window, OVERRIDES)
    assembled_rows = batches.read_table(other, "p", assembled.name, assembled.tables["public.special"])

    pulled = run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p",
                      type_overrides=OVERRIDES)
    assert pulled["changes"] == 3
    changes = layout.read_manifest(root, "p", staged_name(pulled)).tables["public.special"]
    assert [c.override for c in changes.columns] == [c.override for c in staged.columns]
    pulled_rows = batches.read_table(root, "p", staged_name(pulled), changes)
    assert same(as_numbers(assembled_rows.drop_columns(["_commit_ts"])), as_numbers(pulled_rows.drop_columns(["_commit_ts"])))
    assert pulled_rows.filter(pc.equal(pulled_rows["id"], 5))["arr_b"].to_pylist() == ["[-3:-2]={1,2}"]

    summary = apply_changes.run(spark, ApplyOptions(str(root), "p", catalog="lake", namespace="special",
                                table_map={"public.special": "special"}))
    assert [step["batch"] for step in summary["steps"]] == [staged_name(snapshot), staged_name(pulled)]
    # the snapshot's staged file is adopted as the table's data file, not rewritten by a Spark job
    assert (summary["steps"][0]["adopted_files"], summary["steps"][0]["spark_jobs"]) == (1, 0)
    (adopted,) = spark.sql("SELECT operation, summary FROM lake.special.special.snapshots "
                           "WHERE summary['pglogical.adopted-batch'] IS NOT NULL").collect()
    assert (adopted.operation, adopted.summary["added-data-files"], adopted.summary["added-records"]) == (
        "overwrite", "1", "4")
    (location,) = spark.sql("SELECT file_path FROM lake.special.special.files WHERE file_path LIKE '%-adopted.parquet'"
                            ).collect()
    assert "/special/special/data/" in location.file_path and str(root.path) not in location.file_path
    # Iceberg took the adopted file's bounds from its footer (queries and lookups by key skip files)
    (bounds,) = spark.sql("SELECT readable_metrics.id.lower_bound AS low, readable_metrics.id.upper_bound AS high "
                          "FROM lake.special.special.files WHERE file_path LIKE '%-adopted.parquet'").collect()
    ids = [row["id"] for row in snapshot_rows]
    assert (bounds.low, bounds.high) == (min(ids), max(ids)), bounds
    # the snapshot numbered the staged columns as the new table numbers them (arrays' elements
    # too), so the table's file is the staged file under a second name: a link, no copy
    staged_file = Path(str(root.path)) / "p" / staged_name(snapshot) / staged.files[0].path
    adopted_file = Path(location.file_path.removeprefix("file:"))
    assert adopted_file.stat().st_ino == staged_file.stat().st_ino and staged_file.stat().st_nlink == 2
    schema = {f.name: f.dataType.simpleString() for f in spark.table("lake.special.special").schema.fields}
    assert schema == {"id": "int", "d": "date", "ts": "timestamp_ntz", "tz": "timestamp", "f4": "float",
                      "f8": "double", "n": "decimal(10,2)", "nu": "string", "arr": "array<int>",
                      "tsa": "array<timestamp_ntz>", "d_inf": "string", "tz_inf": "string", "n_nan": "string",
                      "arr_b": "string"}
    lake = iceberg_rows(spark, tmp_path, "lake.special.special")
    source = publisher_values(publisher)
    assert [r["id"] for r in source] == [1, 2, 3, 5]
    assert same(lake, source), (lake, source)
    assert math.isnan(lake[2]["f8"]) and lake[1]["tz_inf"] == "294276-12-31 23:59:59.999999+00"

    # verify, the independent witness (PostgreSQL's digests against Spark's), finds them equal
    tables = source_projection.source_tables(publisher_hook.published_tables(["pub"]), "lake", "special",
                                             table_map={"public.special": "special"}, type_overrides=OVERRIDES)
    verdict = verify_tables(publisher_hook.connect_kwargs(), tables, root, "p",
                            lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text())))
    assert verdict["equal"], json.dumps(verdict["tables"], default=str)


def staged_name(result: dict) -> str:
    return result["batch"].rsplit("/", 1)[1]


def test_a_value_without_exact_form_stops_the_sync_and_leaves_nothing_behind(publisher, publisher_hook, root):
    publisher.execute("""
        CREATE TABLE events (id int PRIMARY KEY, starts date, ends_at timestamptz, tags int[]);
        INSERT INTO events SELECT g, '2024-01-01', '2024-01-01 00:00:00+00', '{1}' FROM generate_series(1, 5000) g;
        INSERT INTO events VALUES (5001, '0100-01-01 BC', 'infinity', '{2}');
        CREATE PUBLICATION pub FOR TABLE events;
    """)
    sync = PgInitialSyncOperator(task_id="sync", slot="s1", publications=["pub"], staging_root=str(root),
                                 pipeline="p", postgres_conn_id=publisher.conn_id)
    with pytest.raises(AirflowFailException) as caught:  # permanent: Airflow does not retry it
        sync.execute({})
    assert isinstance(caught.value.__cause__, UnrepresentableValue)
    message = str(caught.value)
    assert "table public.events, column ends_at: value 'infinity'" in message
    assert "type_overrides={'public.events.ends_at': 'string'}" in message
    assert publisher.query("SELECT slot_name FROM pg_replication_slots") == []
    assert layout.committed_batches(root, "p") == []
    assert [p.name for p in (root / "p").iterdir()] == ["_pipeline.json"]  # no Parquet part is left

    # With the override the same sync completes: the value arrives as PostgreSQL's text.
    result = run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p",
                              type_overrides={"public.events.ends_at": "string"})
    table = layout.read_manifest(root, "p", staged_name(result)).tables["public.events"]
    rows = batches.read_table(root, "p", staged_name(result), table)
    last = rows.filter(pc.equal(rows["id"], 5001))
    assert last["ends_at"].to_pylist() == ["infinity"]
    # 0100-01-01 BC, exactly: PostgreSQL's own day count
    assert last["starts"].combine_chunks().view(pa.int32()).to_pylist() == [
        publisher.query("SELECT starts - DATE '1970-01-01' FROM events WHERE id = 5001")[0][0]]
    assert rows["ends_at"].to_pylist()[:1] == ["2024-01-01 00:00:00+00"]

    # A backfill follows the same rule: an error without the override (its temporary slot and
    # files gone), the text with it.
    committed = layout.committed_batches(root, "p")
    with pytest.raises(UnrepresentableValue, match=r"type_overrides=\{'public.events.ends_at': 'string'\}"):
        run_backfill(publisher_hook, tables=["public.events"], publications=["pub"], root=root, pipeline="p")
    # PostgreSQL drops a temporary slot when its session's backend exits, just after the close
    wait_until(lambda: publisher.query("SELECT slot_name FROM pg_replication_slots") == [("s1",)], timeout=10,
               message="the backfill's temporary slot to go")
    assert layout.committed_batches(root, "p") == committed
    assert sorted(p.name for p in (root / "p").iterdir()) == sorted(["_pipeline.json", *(b[0] for b in committed)])
    backfill = run_backfill(publisher_hook, tables=["public.events"], publications=["pub"], root=root, pipeline="p",
                            type_overrides={"public.events.ends_at": "string"})
    table = layout.read_manifest(root, "p", staged_name(backfill)).tables["public.events"]
    rows = batches.read_table(root, "p", staged_name(backfill), table)
    assert rows.filter(pc.equal(rows["id"], 5001))["ends_at"].to_pylist() == ["infinity"]

    # A pull meets an array whose lower bound is not 1: an error, the slot stays where it was.
    (position,) = publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots")
    publisher.execute("INSERT INTO events VALUES (5002, '2024-01-02', 'infinity', '[0:0]={3}')")
    with pytest.raises(UnrepresentableValue) as caught:
        run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p",
                 type_overrides={"public.events.ends_at": "string"})
    assert "table public.events, column tags: value '[0:0]={3}'" in str(caught.value)
    assert "type_overrides={'public.events.tags': 'string'}" in str(caught.value)
    assert publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots") == [position]
    assert [kind for *_, kind in layout.committed_batches(root, "p")] == ["snapshot", "snapshot"]

    pulled = run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p",
                      type_overrides={"public.events.ends_at": "string", "public.events.tags": "string"})
    table = layout.read_manifest(root, "p", staged_name(pulled)).tables["public.events"]
    row = batches.read_table(root, "p", staged_name(pulled), table).to_pylist()[0]
    assert (row["id"], row["ends_at"], row["tags"]) == (5002, "infinity", "[0:0]={3}")


def test_values_of_9_and_40_mib_through_the_snapshot(publisher, publisher_hook, root):
    # md5 chains make values that do not compress to nothing; a tab, a newline and a backslash
    # (escaped by COPY) sit near each end of the big values.
    publisher.execute("""
        CREATE TABLE blobs (id int PRIMARY KEY, v text, b bytea);
        INSERT INTO blobs SELECT g, 'small ' || g, '\\x00ff' FROM generate_series(1, 2000) g;
        INSERT INTO blobs
        SELECT 3000 + mib, E'a\\tb\\\\c\\n' || string_agg(md5(mib::text || g::text), '') || E'\\t\\\\end',
               decode(string_agg(md5(g::text || mib::text), ''), 'hex')
          FROM (VALUES (9), (40)) sizes(mib), generate_series(1, mib * 32768) g GROUP BY mib;
        CREATE PUBLICATION pub FOR TABLE blobs;
    """)
    expected = publisher.query("SELECT id, length(v), md5(v), length(b), md5(b) FROM blobs ORDER BY id")
    assert [row[1] for row in expected[-2:]] == [9 * 2**20 + 11, 40 * 2**20 + 11]

    result = run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    table = layout.read_manifest(root, "p", staged_name(result)).tables["public.blobs"]
    rows = batches.read_table(root, "p", staged_name(result), table).sort_by("id").to_pylist()
    assert fingerprints(rows) == expected

    # ... and through the pull: both big values change in one transaction
    publisher.execute("UPDATE blobs SET v = v || E'\\\\x', b = b || '\\x01' WHERE id > 3000")
    expected = publisher.query("SELECT id, length(v), md5(v), length(b), md5(b) FROM blobs WHERE id > 3000 ORDER BY id")
    pulled = run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    table = layout.read_manifest(root, "p", staged_name(pulled)).tables["public.blobs"]
    rows = batches.read_table(root, "p", staged_name(pulled), table).sort_by("id").to_pylist()
    assert [r["_unchanged_toast"] for r in rows] == [None, None]
    assert fingerprints(rows) == expected


def fingerprints(rows: list[dict]) -> list[tuple]:
    return [(r["id"], len(r["v"]), hashlib.md5(r["v"].encode()).hexdigest(), len(r["b"]),
             hashlib.md5(r["b"]).hexdigest()) for r in rows]


@pytest.mark.spark
def test_byte_order_marks_and_empty_rows_land_exactly(publisher, publisher_hook, root, spark):
    # COPY's first value starts with U+FEFF (a chunk's start, where a CSV reader drops a byte order
    # mark), and rows whose only column holds '' are empty COPY lines.
    publisher.execute("""
        CREATE TABLE words (k text PRIMARY KEY, v text);
        INSERT INTO words VALUES (E'\\uFEFFkey', 'first'), ('other', E'\\uFEFF');
        CREATE TABLE one (v text);
        ALTER TABLE one REPLICA IDENTITY FULL;
        INSERT INTO one VALUES (''), (''), ('x'), (NULL);
        CREATE PUBLICATION pub FOR TABLE words, one;
    """)
    snapshot = run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    assert snapshot["tables"] == {"public.words": 2, "public.one": 4}
    publisher.execute("""
        UPDATE words SET v = 'changed' WHERE k = E'\\uFEFFkey';
        INSERT INTO one VALUES ('');
        DELETE FROM one WHERE ctid = (SELECT min(ctid) FROM one WHERE v = '');
    """)
    run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    apply_changes.run(spark, ApplyOptions(str(root), "p", catalog="lake", namespace="text",
                      table_map={"public.words": "words", "public.one": "one"}))
    for table, columns in (("words", ["k", "v"]), ("one", ["v"])):
        lake = sorted((tuple(r) for r in spark.table(f"lake.text.{table}").select(*columns).collect()), key=repr)
        source = sorted(publisher.query(f"SELECT {', '.join(columns)} FROM {table}"), key=repr)
        assert lake == source, (table, lake, source)
    assert sorted(publisher.query("SELECT v FROM one"), key=repr) == [("",), ("",), ("x",), (None,)]


def test_a_numeric_nan_is_refused_naming_the_override_before_anything_is_staged(publisher, publisher_hook, root):
    publisher.execute("""
        CREATE TABLE prices (id int PRIMARY KEY, amount numeric(10,2));
        INSERT INTO prices SELECT g, g / 100.0 FROM generate_series(1, 1000) g;
        INSERT INTO prices VALUES (1001, 'NaN');
        CREATE PUBLICATION pub FOR TABLE prices;
    """)
    sync = PgInitialSyncOperator(task_id="sync", slot="s1", publications=["pub"], staging_root=str(root),
                                 pipeline="p", postgres_conn_id=publisher.conn_id)
    with pytest.raises(AirflowFailException) as caught:  # permanent: Airflow does not retry it
        sync.execute({})
    assert isinstance(caught.value.__cause__, UnrepresentableValue)
    message = str(caught.value)
    assert ("table public.prices, column amount: value 'NaN' cannot be stored exactly as decimal(10,2) "
            "(a decimal has no NaN)") in message
    assert "type_overrides={'public.prices.amount': 'string'}" in message
    assert publisher.query("SELECT slot_name FROM pg_replication_slots") == []
    assert [p.name for p in (root / "p").iterdir()] == ["_pipeline.json"]  # no batch, no Parquet part

    # A pull meets a NaN: the same error, the slot stays where it was, nothing is staged.
    publisher.execute("DELETE FROM prices WHERE id = 1001")
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    (position,) = publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots")
    staged = sorted(p.name for p in (root / "p").iterdir())
    publisher.execute("UPDATE prices SET amount = 'NaN' WHERE id = 7")
    with pytest.raises(UnrepresentableValue, match=r"column amount: value 'NaN'.*type_overrides=\{'public.prices.amount"):
        run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    assert publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots") == [position]
    assert sorted(p.name for p in (root / "p").iterdir()) == staged
