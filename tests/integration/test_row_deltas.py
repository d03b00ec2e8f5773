"""Small change batches are applied as Iceberg row deltas (a position delete file and a data file
in one commit; no Spark query: the rows a batch replaces, with their data file and position, the
TOAST values it keeps and a keyless table's copies are read through Iceberg's own reader), and the
lakehouse ends exactly as a MERGE leaves it: every supported type, composite keys, key-change
chains, a key deleted and inserted again, kept TOAST values, a keyless table's duplicates and
all-NULL rows, a step applied twice (a crash before its state commit), and maintenance folding the
position deletes in. No commit writes an equality delete.

A real pull stages the batches; the job runs in-process over them twice, with and without row
deltas, into two namespaces of one warehouse (the module's ``lake`` fixture, shared by the tests
below, which run in this order: the later ones apply further ticks to the ``delta`` namespace).
"""

from __future__ import annotations

import math
import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from airflow_provider_pglogical.spark.common import hadoop_files
from airflow_provider_pglogical.spark.jobs import apply_changes, maintenance
from airflow_provider_pglogical.spark.row_delta import driver_commits
from airflow_provider_pglogical.spark.common.hadoop_files import Staging, local_path
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.row_delta.multiset_row_deltas import MultisetRowDeltas, _narrowing, count_copies
from pyspark.sql import functions as F
from airflow_provider_pglogical.staging.layout import parse_batch_name
from airflow_provider_pglogical.spark.apply.plan import Batch, TableState
from airflow_provider_pglogical.spark.row_delta.row_deltas import RowDeltas, is_in, plain_value, readable
from airflow_provider_pglogical.spark.lookups.table_rows import lookup_rows, read_rows
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.housekeeping.delete_compaction import delete_file_count
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.embedded.postgres import available_servers
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import pull, synced
from tests.support.databases import Database, drop_database, new_database
from tests.support.spark_jobs import reading_session

SOURCE = r"""
CREATE TABLE kinds (id bigint PRIMARY KEY, flag bool, small int2, n int4, f4 real, f8 float8, note text,
                    raw bytea, day date, at timestamp, at_tz timestamptz, amount numeric(12,2), tags int4[],
                    words text[]);
CREATE TABLE lines (order_id int, line text, qty int, PRIMARY KEY (order_id, line));
CREATE TABLE docs (id int PRIMARY KEY, qty int, doc text);
ALTER TABLE docs ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE bag (flag bool, big bigint, day date, at timestamp, at_tz timestamptz, amount numeric(12,2), note text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE blobs (raw bytea, n int);
ALTER TABLE blobs REPLICA IDENTITY FULL;
INSERT INTO blobs SELECT decode(md5((g % 3)::text), 'hex'), g % 2 FROM generate_series(1, 12) g;
INSERT INTO bag SELECT g % 2 = 0, g % 3, date '2020-01-01' + g % 3,
                       timestamp '2020-01-01' + (g % 3) * interval '1 hour',
                       timestamptz '1850-01-01 00:00+00' + (g % 3) * interval '1 day', (g % 3) * 1.5,
                       CASE WHEN g % 3 > 0 THEN 'b' || (g % 3) END
                FROM generate_series(1, 12) g;
INSERT INTO bag VALUES (NULL, NULL, NULL, NULL, NULL, NULL, NULL), (NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO kinds SELECT g, g % 2 = 0, g, g * 10, g / 4.0, g / 3.0, 'n' || g, decode(md5(g::text), 'hex'),
                         date '2020-01-01' + g, timestamp '2020-01-01 00:00' + g * interval '1 hour',
                         timestamptz '2020-01-01 00:00+00' + g * interval '1 minute', g * 1.25, ARRAY[g, g + 1],
                         ARRAY['w' || g, NULL]
                  FROM generate_series(1, 40) g;
INSERT INTO lines SELECT g % 5, 'l' || g, g FROM generate_series(1, 30) g;
INSERT INTO docs SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1, 10) g;
"""
FIRST = r"""
UPDATE kinds SET n = -n, note = E'tab\there "quoted" \\ back', f8 = 'NaN', f4 = '-Infinity' WHERE id <= 5;
UPDATE kinds SET id = id + 100 WHERE id IN (6, 7);
UPDATE kinds SET id = 207 WHERE id = 107;
UPDATE kinds SET id = 6 WHERE id = 106;
DELETE FROM kinds WHERE id IN (8, 9);
INSERT INTO kinds (id, note, day, at, at_tz, tags) VALUES (8, 'again', date '0900-03-01', timestamp '1850-06-01 12:00',
    timestamptz '9999-12-31 23:59:59.999999+00', '{}');
INSERT INTO kinds (id, note) VALUES (300, NULL);
DELETE FROM kinds WHERE id = 300;
INSERT INTO kinds (id, flag, amount, raw) VALUES (301, NULL, -9999999999.99, '\x00ff');
UPDATE lines SET line = line || 'x' WHERE order_id = 1;
UPDATE lines SET qty = qty * 2 WHERE order_id = 2;
DELETE FROM lines WHERE order_id = 3;
UPDATE docs SET qty = -qty WHERE id <= 3;
UPDATE docs SET id = id + 100 WHERE id IN (4, 5);
UPDATE docs SET id = 205 WHERE id = 105;
UPDATE docs SET qty = 0 WHERE id = 205;
INSERT INTO bag SELECT * FROM bag WHERE big = 1;
DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE big = 2 LIMIT 1);
UPDATE bag SET note = 'changed' WHERE ctid = (SELECT ctid FROM bag WHERE big = 0 LIMIT 1);
DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE big IS NULL LIMIT 1);
DELETE FROM bag WHERE big = 2 AND flag;
INSERT INTO bag (note) VALUES ('x'), ('x');
DELETE FROM blobs WHERE raw = decode(md5('2'), 'hex') AND n = 0;
DELETE FROM blobs WHERE ctid = (SELECT ctid FROM blobs WHERE raw = decode(md5('0'), 'hex') LIMIT 1);
"""
SECOND = ("UPDATE kinds SET note = 'late' WHERE id IN (1, 207); UPDATE lines SET order_id = 9 WHERE order_id = 4;"
          "UPDATE bag SET big = 5 WHERE ctid = (SELECT ctid FROM bag WHERE note = 'x' LIMIT 1);"
          "INSERT INTO bag (note) VALUES (NULL)")
THIRD = "UPDATE kinds SET n = 0 WHERE id = 2; UPDATE docs SET qty = qty + 1 WHERE id IN (1, 2, 205)"
DOCS_CHANGED = "UPDATE docs SET doc = repeat(md5('changed'), 300) WHERE id = 1"
DOCS_KEPT = "UPDATE docs SET qty = qty + 1 WHERE id = 1"
COLUMNS = {
    "kinds": "id, flag, small, n, f4::float8, f8, note, raw, day, at::text, "
             "(extract(epoch FROM at_tz) * 1000000)::bigint, amount, tags, words",
    "lines": "order_id, line, qty",
    "docs": "id, qty, md5(doc)",
    "bag": "flag, big, day, at::text, (extract(epoch FROM at_tz) * 1000000)::bigint, amount, note",
    "blobs": "raw, n",
}
LAKE_COLUMNS = {**COLUMNS, "kinds": "id, flag, small, n, cast(f4 AS double), f8, note, raw, day, "
                                    "cast(at AS string), unix_micros(at_tz), amount, tags, words",
                "bag": "flag, big, day, cast(at AS string), unix_micros(at_tz), amount, note"}


def canonical(value):
    """A value as both sides return it, hashable: lists as tuples, binary as bytes, NaN as text."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return value


def as_rows(rows) -> Counter:
    return Counter(tuple(canonical(v) for v in row) for row in rows)


def lakehouse_rows(spark, namespace: str, table: str) -> Counter:
    rows = spark.sql(f"SELECT {LAKE_COLUMNS[table]} FROM lake.{namespace}.public__{table}").collect()
    return as_rows(tuple(row) for row in rows)


def delete_files(spark, namespace: str, table: str) -> dict[str, int]:
    """The table's live delete files by kind: ``position`` and ``equality`` (which no apply writes)."""
    rows = spark.sql(f"SELECT content, count(*) AS n FROM lake.{namespace}.public__{table}.delete_files "
                     "GROUP BY content").collect()
    found = {row.content: row.n for row in rows}
    return {"position": found.get(1, 0), "equality": found.get(2, 0)}


def source_rows(publisher, table: str) -> Counter:
    return as_rows(publisher.query(f"SELECT {COLUMNS[table]} FROM {table}"))


def same_lookup(spark, table, target: str, key: str, columns: list[str], keys: list) -> int:
    """Asserts the driver's lookup of ``keys`` (``lookups.table_rows``) returns what Spark reads from
    the table, timestamps as microseconds; returns the number of rows found."""
    name = f"lake.delta.{target}"
    types = {f.name: f.dataType.simpleString() for f in spark.table(name).schema.fields}
    read = lookup_rows(spark, table, table.currentSnapshot().snapshotId(), key, columns, keys, name)
    by_spark = {row[0]: tuple(row[1:]) for row in spark.table(name).where(is_in(key, keys))
                .select(key, *[readable(c, types[c]).alias(c) for c in columns]).collect()}
    canonical_rows = {k: tuple(canonical(v) for v in row) for k, row in read.items()}
    assert canonical_rows == {k: tuple(canonical(v) for v in row) for k, row in by_spark.items()}
    return len(read)


def same_copies(spark, namespace: str, batch: str) -> int:
    """Asserts the driver's count of bag's copies (``lookups.table_rows.read_rows``) is Spark's aggregate,
    for every value the table holds and one it does not; returns the copies counted."""
    lakehouse = Lakehouse(spark, "lake", namespace, "merge-on-read", None)
    name, table = lakehouse.name("public__bag"), lakehouse.iceberg_table("public__bag")
    types = {f.name: f.dataType.simpleString() for f in spark.table(name).schema.fields}
    values = [n for n in types if n not in contract.MULTISET_COLUMNS]
    touched = [tuple(plain_value(v) for v in row) for row in
               spark.table(name).select(*[readable(n, types[n]).alias(n) for n in values]).distinct().collect()]
    touched.append((True, 99, None, None, None, None, "absent"))
    narrowed = _narrowing(values, types, touched)
    assert set(narrowed) == {"big", "day", "amount", "note"}
    read = read_rows(spark, table, table.currentSnapshot().snapshotId(), [*values, contract.WRITTEN_BY], narrowed)
    copies = count_copies(read, touched, batch)
    found = (spark.table(name).groupBy(*[readable(n, types[n]).alias(n) for n in values])
             .agg(F.count(F.lit(1)).alias("copies"), F.max((F.col(contract.WRITTEN_BY) == batch).cast("int")).alias("done"))
             .collect())
    by_spark = {tuple(plain_value(v) for v in row[:len(values)]): (row.copies, bool(row.done)) for row in found}
    assert copies == by_spark and touched[-1] not in copies
    assert any(done for _, done in copies.values())  # the batch's copies carry its name
    return sum(count for count, _ in copies.values())


@dataclass
class Lake:
    """The module's pipeline: its source, staging, the two batches pulled and the applies' results."""

    publisher: Database
    hook: object
    root: Path
    storage: object
    #: the first batch alone, as a run that crashed before its state commit saw it
    partial: Path
    batches: list[str]
    #: per batch, every table's source rows right after it
    expected: list[dict[str, Counter]]
    spark: object
    #: the job's result per namespace: ``delta`` (row deltas) and ``merge`` (none)
    runs: dict[str, dict]

    def pull(self) -> str:
        return pull(self.hook, self.storage)

    def apply(self, namespace: str = "delta", **options) -> dict:
        return apply_changes.run(self.spark, ApplyOptions(self.root.as_uri(), "p", "lake", namespace, **options))


@pytest.fixture(scope="module")
def lake(cluster_pool, tmp_path_factory):
    """Sync, two pulls (FIRST, SECOND), and both batches applied into ``delta`` and ``merge``."""
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    env = pytest.MonkeyPatch()
    publisher = new_database(cluster_pool.get("publisher", next(iter(available_servers()))), "publisher", env.setenv)
    hook = PgLogicalHook(postgres_conn_id=publisher.conn_id)
    tmp_path = tmp_path_factory.mktemp("row-deltas")
    root = tmp_path / "staging"
    storage = synced(publisher, hook, root, SOURCE, COLUMNS)
    batches, expected = [], []
    for statements in (FIRST, SECOND):
        publisher.execute(statements)
        batches.append(pull(hook, storage))
        expected.append({table: source_rows(publisher, table) for table in COLUMNS})
    partial = tmp_path / "staging-first"
    shutil.copytree(root, partial)
    shutil.rmtree(partial / "p" / batches[1])
    record = json.loads((partial / "p" / "_pipeline.json").read_text())  # as the first pull left it
    record["staged_through"] = str(parse_batch_name(batches[0])[1])
    (partial / "p" / "_pipeline.json").write_text(json.dumps(record))
    spark = reading_session(tmp_path / "warehouse", "test-row-deltas")
    try:
        apply_changes.tune_session(spark)
        runs = {namespace: apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", namespace, row_deltas=deltas))
                for namespace, deltas in (("delta", True), ("merge", False))}
        yield Lake(publisher, hook, root, storage, partial, batches, expected, spark, runs)
    finally:
        spark.stop()
        drop_database(publisher)
        env.undo()


@pytest.mark.spark
def test_small_batches_apply_as_row_deltas_and_end_as_a_merge_ends(lake):
    spark, runs = lake.spark, lake.runs
    ways = {namespace: {(s["table"], s["batch"]): s["row_delta"] for s in result["steps"] if s["kind"] == "changes"}
            for namespace, result in runs.items()}
    # every change step (docs keeps TOAST values, looked up in the lakehouse by key; blobs, a
    # keyless table with a binary column, compares its copies exactly: deletes are by position)
    assert all(ways["delta"].values()), ways
    first = lake.batches[0]
    assert ("public.docs", first) in ways["delta"] and ("public.bag", first) in ways["delta"], ways
    assert not any(ways["merge"].values())
    # no Spark work: docs' kept values and bag's copies are read through Iceberg's reader
    # in the driver (lookups.table_rows)
    assert all(s["spark_jobs"] == 0 for s in runs["delta"]["steps"] if s["row_delta"])
    for table in COLUMNS:
        assert lakehouse_rows(spark, "delta", table) == lakehouse_rows(spark, "merge", table), table
        assert lakehouse_rows(spark, "delta", table) == lake.expected[1][table], table
        # deletes by position, never by equality: the row deltas' and the MERGEs' alike
        for namespace in ("delta", "merge"):
            assert delete_files(spark, namespace, table)["equality"] == 0, (namespace, table)
    assert all(delete_files(spark, "delta", table)["position"] > 0 for table in COLUMNS)


@pytest.mark.spark
def test_the_drivers_count_of_a_keyless_tables_copies_is_sparks(lake):
    # over the row deltas' position deletes of copies with NULLs, and over a MERGE's
    bag_rows = sum(lake.expected[1]["bag"].values())
    batch = lake.batches[1]
    assert same_copies(lake.spark, "delta", batch) == same_copies(lake.spark, "merge", batch) == bag_rows


@pytest.mark.spark
def test_maintenance_folds_the_position_deletes_in_and_the_next_tick_applies(lake):
    # maintenance rewrites the data files the position deletes apply to, then the delete files
    # of files that are gone; the rows stay, and the next tick applies as before
    spark, publisher = lake.spark, lake.publisher
    assert delete_files(spark, "delta", "kinds")["position"] > 0
    kinds_table = Lakehouse(spark, "lake", "delta", "merge-on-read", None).iceberg_table("public__kinds")
    before = kinds_table.currentSnapshot().snapshotId()
    done = maintenance.run(spark, "lake", "delta", ["public__kinds", "public__lines"])
    # only compactions since: a row delta that read at `before` and lost to them reads again and commits
    assert driver_commits.only_compacted_since(kinds_table, before)
    assert done["tables"]["public__kinds"]["rewrite_data_files"]["rewritten_data_files_count"] > 0
    for table in ("kinds", "lines"):
        assert delete_files(spark, "delta", table) == {"position": 0, "equality": 0}, table
        assert lakehouse_rows(spark, "delta", table) == lake.expected[1][table], table
    publisher.execute(THIRD)
    lake.pull()
    third = lake.apply()
    assert lakehouse_rows(spark, "delta", "kinds") == source_rows(publisher, "kinds")
    assert not driver_commits.only_compacted_since(kinds_table, before)  # the row delta changed rows
    # docs' kept values are read through Iceberg's reader: no Spark query, whichever commit
    # (the driver's row delta, a MERGE) wrote the rows they come from
    docs = [s for s in third["steps"] if s["table"] == "public.docs"]
    assert [(s["row_delta"], s["spark_jobs"]) for s in docs] == [(True, 0)], docs
    assert lakehouse_rows(spark, "delta", "docs") == source_rows(publisher, "docs")


@pytest.mark.spark
def test_kept_values_are_read_through_icebergs_reader_after_row_deltas_and_a_merge(lake):
    spark, publisher = lake.spark, lake.publisher
    lakehouse = Lakehouse(spark, "lake", "delta", "merge-on-read", None)
    docs_table = lakehouse.iceberg_table("public__docs")
    for statement in ("UPDATE docs SET qty = qty + 1 WHERE id IN (1, 205); DELETE FROM docs WHERE id = 2",
                      "UPDATE docs SET qty = qty + 1 WHERE id IN (1, 3); DELETE FROM docs WHERE id = 205"):
        publisher.execute(statement)
        lake.pull()
        steps = lake.apply()["steps"]
        assert [(s["row_delta"], s["spark_jobs"]) for s in steps if s["table"] == "public.docs"] == [(True, 0)]
        assert lakehouse_rows(spark, "delta", "docs") == source_rows(publisher, "docs")
    for statement, deltas in ((DOCS_CHANGED, False), (DOCS_KEPT, True)):
        publisher.execute(statement)
        lake.pull()
        steps = lake.apply(row_deltas=deltas)["steps"]
        docs = [s for s in steps if s["table"] == "public.docs"]
        assert [s["row_delta"] for s in docs] == [deltas], docs
        assert lakehouse_rows(spark, "delta", "docs") == source_rows(publisher, "docs")
        if not deltas:  # after the MERGE's position deletes and the row deltas', the driver's
            # read of the table's files is Spark's
            docs_table.refresh()
            ids = [*range(1, 12), 104, 205, 999]
            present = publisher.query(f"SELECT count(*) FROM docs WHERE id IN ({', '.join(map(str, ids))})")[0][0]
            assert same_lookup(spark, docs_table, "public__docs", "id", ["doc", "qty"], ids) == present > 0
    assert docs[0]["spark_jobs"] == 0, docs  # after the MERGE too: read through Iceberg's reader


@pytest.mark.spark
def test_the_drivers_reads_of_every_type_are_sparks(lake):
    # every type a lookup reads, after maintenance and the row deltas
    spark = lake.spark
    lakehouse = Lakehouse(spark, "lake", "delta", "merge-on-read", None)
    kinds_table = lakehouse.iceberg_table("public__kinds")
    # the job takes a table's Spark types from Iceberg's conversion, not a Spark analysis: the same
    for target in ("public__kinds", "public__bag", "public__docs"):
        by_spark = {f.name: f.dataType.simpleString() for f in spark.table(lakehouse.name(target)).schema.fields}
        assert lakehouse.spark_types(lakehouse.iceberg_table(target)) == by_spark, target
    assert lakehouse.exists("public__kinds") and not lakehouse.exists("public__absent")
    kinds_columns = ["flag", "small", "n", "f8", "note", "raw", "day", "at", "at_tz", "amount", "tags", "words"]
    ids = [*range(0, 12), 207, 301]
    present = lake.publisher.query(f"SELECT count(*) FROM kinds WHERE id IN ({', '.join(map(str, ids))})")[0][0]
    assert same_lookup(spark, kinds_table, "public__kinds", "id", kinds_columns, ids) == present > 0
    bag_table = lakehouse.iceberg_table("public__bag")
    with pytest.raises(ApplyError, match="holds two rows under key big"):  # not a key: refused, not guessed
        lookup_rows(spark, bag_table, bag_table.currentSnapshot().snapshotId(), "big", ["note"], [0, 1], "bag")


@pytest.mark.spark
def test_file_uris_give_the_local_path_hadoop_gives(lake):
    spark = lake.spark
    assert local_path(spark, "file:///w/a b/f.parquet") == local_path(spark, "file:/w/a b/f.parquet") == "/w/a b/f.parquet"
    assert [local_path(spark, uri) for uri in ("s3a://bucket/w/f", "hdfs://nn:8020/w/f", "/w/f")] == [None] * 3
    # the plain forms are parsed without the JVM, as Hadoop's Path parses them
    for uri in ("file:/w/a b/f.parquet", "file:///w/x-1/f_2.parquet", "file:/w/ü/f", "file:/w/a%20b/f",
                "file:/w//f", "file:/w/./f", "file:/w/f/", "file://host/w/f", "file:////w/f"):
        plain = hadoop_files._plain_file_path(uri)
        parsed = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(uri).toUri()
        by_hadoop = parsed.getPath() if parsed.getScheme() == "file" and not parsed.getAuthority() else None
        assert plain == by_hadoop if uri.startswith(("file:/w/a b", "file:///w/x", "file:/w/ü")) \
            else plain is None or plain == by_hadoop, uri
        assert local_path(spark, uri) == by_hadoop, uri


@pytest.mark.spark
def test_a_step_applied_again_after_a_crash_before_its_state_commit_writes_each_row_once(lake, monkeypatch):
    # the data committed, the state not: the same rows, none twice. The first run reads staging
    # and writes its files with Python (a file: location); the second through Hadoop's
    # FileSystem and Iceberg's FileIO, as on any other location
    spark, first = lake.spark, lake.batches[0]
    apply_changes.run(spark, ApplyOptions(lake.partial.as_uri(), "p", "lake", "again", row_deltas=True))
    monkeypatch.setattr(hadoop_files, "local_path", lambda spark, uri: None)
    monkeypatch.setattr(driver_commits, "local_path", lambda spark, uri: None)
    staging = Staging(spark, lake.partial.as_uri(), "p")
    batch = Batch.parse(first)
    batch.manifest = staging.read_manifest(batch)
    deltas = RowDeltas(spark, staging, Lakehouse(spark, "lake", "again", "merge-on-read", None))
    copies = MultisetRowDeltas(spark, staging, Lakehouse(spark, "lake", "again", "merge-on-read", None))
    for source in ("public.kinds", "public.lines", "public.docs", "public.bag"):
        target = contract.default_target_name(source)
        table = deltas.load(target)
        types = {f.name: f.dataType.simpleString() for f in spark.table(f"lake.again.{target}").schema.fields}
        files, manifest = staging.files(batch, source), batch.manifest.tables[source]
        if source == "public.bag":
            copies.apply(table, target, files, manifest, types, first)
        else:
            deltas.apply(table, target, files, manifest, types, first)
    for table in COLUMNS:
        assert lakehouse_rows(spark, "again", table) == lake.expected[0][table], table


@pytest.mark.spark
def test_the_state_commit_by_the_driver_or_by_spark_replaces_the_pipelines_partition(lake):
    # written by the driver (pyarrow here), or by Spark where the driver has no pyarrow; either
    # replaces the pipeline's partition in one commit, and reads back through Iceberg's reader
    spark = lake.spark
    lakehouse = Lakehouse(spark, "lake", "delta", "merge-on-read", None)
    states = lakehouse.state.read_state("p")
    assert set(states) == {f"public.{table}" for table in COLUMNS}

    def facts(read: dict) -> dict:
        return {s: (t.target, t.position, t.snapshots, t.last_batch) for s, t in read.items()}

    def sources_read_by_driver() -> set[str]:
        state_table.refresh()
        snapshot = state_table.currentSnapshot().snapshotId()
        return {row[0] for row in lakehouse.state._state_rows_by_driver(state_table, snapshot, "p")}

    state_table = lakehouse.state.state_table()
    for by_driver in (False, True, True):
        lakehouse.state.write_state("p", states, by_driver=by_driver)
        assert facts(lakehouse.state.read_state("p")) == facts(states)
        assert spark.sql("SELECT count(*) AS n FROM lake.delta._pglogical_state.files").first().n == 1
        # the driver reads those rows itself, whoever wrote them (no Spark query)
        assert sources_read_by_driver() == set(states)
    # another pipeline's rows are another partition: neither read sees the other's
    lakehouse.state.write_state("q", {"public.other": TableState("public__other", 7, {"s"}, "b")})
    assert facts(lakehouse.state.read_state("p")) == facts(states)
    assert facts(lakehouse.state.read_state("q")) == {"public.other": ("public__other", 7, {"s"}, "b")}
    # a delete file (another writer's merge-on-read DELETE): Iceberg's reader applies it; the
    # next state commit replaces the partition's files
    spark.sql("ALTER TABLE lake.delta._pglogical_state SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    spark.sql("DELETE FROM lake.delta._pglogical_state WHERE pipeline = 'p' AND source_table = 'public.bag'")
    assert sources_read_by_driver() == set(states) - {"public.bag"}
    assert facts(lakehouse.state.read_state("p")) == {s: f for s, f in facts(states).items() if s != "public.bag"}
    lakehouse.state.write_state("p", states)
    assert facts(lakehouse.state.read_state("p")) == facts(states)
    assert sources_read_by_driver() == set(states)


@pytest.mark.spark
def test_an_apply_folds_a_tables_delete_files_into_its_data_once_they_reach_its_threshold(lake):
    # each row delta adds a position delete file, and every read of the table (the apply's own
    # read of the rows a batch replaces too) opens those of the files it reads: at the threshold
    # the apply that wrote the table compacts it (Iceberg's rewrite_data_files), with no row changed
    spark, publisher = lake.spark, lake.publisher
    docs = Lakehouse(spark, "lake", "delta", "merge-on-read", None).iceberg_table("public__docs")
    docs.refresh()
    before = delete_file_count(docs)
    threshold = before + 2
    publisher.execute("UPDATE docs SET qty = qty + 1 WHERE id = 1")
    lake.pull()
    assert lake.apply(compact_deletes_at=threshold)["compactions"] == []
    docs.refresh()
    assert delete_file_count(docs) == before + 1
    publisher.execute("UPDATE docs SET qty = qty + 1 WHERE id = 3")  # its kept doc is looked up
    lake.pull()
    second = lake.apply(compact_deletes_at=threshold)
    assert [s["row_delta"] for s in second["steps"]] == [True]
    [done] = second["compactions"]
    assert done["target"] == "public__docs" and done["delete_files_before"] == threshold, done
    assert done["rewritten_data_files"] > 0 and done["delete_files_after"] == 0, done
    assert delete_files(spark, "delta", "docs") == {"position": 0, "equality": 0}
    assert lakehouse_rows(spark, "delta", "docs") == source_rows(publisher, "docs")
    # 0 leaves them to housekeeping
    publisher.execute("UPDATE docs SET qty = qty + 1 WHERE id = (SELECT max(id) FROM docs)")
    lake.pull()
    assert lake.apply(compact_deletes_at=0)["compactions"] == []
    docs.refresh()
    assert delete_file_count(docs) == 1
    assert lakehouse_rows(spark, "delta", "docs") == source_rows(publisher, "docs")
    with pytest.raises(ApplyError, match="compact_deletes_at must be 0"):
        lake.apply(compact_deletes_at=-1)
