"""DDL on the source is followed, or re-snapshots the table, or stops the pull (issue 33, invariant 13).

One pipeline holds a table per kind of DDL; after the DDL, one pull and one apply, each Iceberg
table must equal its source table (and again after a later pull, and after a pull with
``on_ddl="fail"`` stopped and the backfill it named ran) (psycopg2 reads the source, Spark reads Iceberg): the same
column names and the same rows. Renames are followed (the same Iceberg table, no new snapshot);
what the lakehouse cannot follow is re-snapshotted, replacing the Iceberg table.
"""

from __future__ import annotations

from collections import Counter

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.backfill import run_backfill
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.exceptions import PipelineStateError
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.staging.contract import REPLACE_TABLE
from airflow_provider_pglogical.staging.pipeline_record import read_record
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import reading_session

TABLES = ("renamed_col", "drop_add", "renamed_tbl", "moved", "recreated", "enum_label", "retyped")
SOURCE = """
CREATE SCHEMA other;
CREATE TYPE mood AS ENUM ('ok', 'bad');
CREATE TABLE renamed_col(id int PRIMARY KEY, b text, n int);
CREATE TABLE drop_add(id int PRIMARY KEY, b text);
CREATE TABLE renamed_tbl(id int PRIMARY KEY, v text);
CREATE TABLE moved(id int PRIMARY KEY, v text);
CREATE TABLE recreated(id int PRIMARY KEY, old text);
CREATE TABLE enum_label(id int PRIMARY KEY, m mood);
CREATE TABLE retyped(id int PRIMARY KEY, v int);
""" + "".join(
    f"INSERT INTO {t} SELECT g, {value} FROM generate_series(1, 5) g;"
    for t, value in (("renamed_col", "'b' || g, g"), ("drop_add", "'old' || g"), ("renamed_tbl", "'v' || g"),
                     ("moved", "'v' || g"), ("recreated", "'old' || g"),
                     ("enum_label", "CASE WHEN g % 2 = 0 THEN 'bad'::mood ELSE 'ok' END"), ("retyped", "g * 10"))
)
DDL = """
ALTER TABLE renamed_col RENAME COLUMN b TO c;
UPDATE renamed_col SET n = 100 WHERE id = 1;
ALTER TABLE drop_add DROP COLUMN b;
ALTER TABLE drop_add ADD COLUMN b text;
UPDATE drop_add SET b = 'new' WHERE id = 1;
ALTER TABLE renamed_tbl RENAME TO renamed_tbl2;
UPDATE renamed_tbl2 SET v = 'changed' WHERE id = 1;
ALTER TABLE moved SET SCHEMA other;
UPDATE other.moved SET v = 'changed' WHERE id = 2;
DROP TABLE recreated;
CREATE TABLE recreated(id int PRIMARY KEY, fresh int);
INSERT INTO recreated VALUES (7, 70), (8, 80);
ALTER PUBLICATION p ADD TABLE recreated;
ALTER TYPE mood RENAME VALUE 'bad' TO 'awful';
ALTER TABLE retyped ALTER COLUMN v TYPE text USING 'x' || v;
ALTER TABLE enum_label ADD COLUMN d int NOT NULL DEFAULT 42;
"""
#: Iceberg target (the name each table had at the initial sync) -> the source table it must equal
NOW = {"public__renamed_col": "renamed_col", "public__drop_add": "drop_add", "public__renamed_tbl": "renamed_tbl2",
       "public__moved": "other.moved", "public__recreated": "recreated", "public__enum_label": "enum_label",
       "public__retyped": "retyped"}
#: tables the pull must snapshot again (DDL that changed rows without row changes, or a new table)
RESNAPSHOTTED = {"public.drop_add", "public.recreated", "public.enum_label", "public.retyped"}


def slot_position(publisher) -> list[tuple]:
    return publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's1'")


def batches(storage) -> list[tuple[str, list[str]]]:
    return [(kind, sorted(layout.read_manifest(storage, "p", name).tables))
            for name, _s, _e, kind in layout.committed_batches(storage, "p")]


def assert_lakehouse_equals_source(spark, publisher) -> None:
    for target, source in NOW.items():
        columns = [r[0] for r in publisher.query(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped "
            "ORDER BY attnum", (source,))]
        frame = spark.table(f"lake.ddl.{target}")
        assert sorted(frame.columns) == sorted(columns), (target, frame.columns, columns)
        expected = Counter(tuple(str(v) for v in row) for row in publisher.query(
            f"SELECT {', '.join(columns)} FROM {source}"))
        found = Counter(tuple(str(v) for v in row) for row in frame.select(*columns).collect())
        assert found == expected, (target, found, expected)


@pytest.mark.spark
def test_ddl_is_followed_or_resnapshotted_and_the_lakehouse_equals_the_source(publisher, publisher_hook, tmp_path):
    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable(t) for t in TABLES])
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    # the lakehouse holds every table as it was before the DDL
    spark = reading_session(tmp_path / "warehouse", "test-source-ddl")
    try:
        apply_changes.tune_session(spark)
        apply_changes.run(spark, ApplyOptions(storage.as_uri(), "p", "lake", "ddl"))
        publisher.execute(DDL)

        run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
        kinds = batches(storage)
        # renamed tables keep their first name (their Iceberg target); what cannot be followed is
        # snapshotted again (at an LSN past the window, so it sorts after it) and its changes are dropped
        assert kinds[1:] == [("changes", ["public.moved", "public.renamed_col", "public.renamed_tbl"]),
                             ("snapshot", sorted(RESNAPSHOTTED))], kinds
        resnapshot = layout.read_manifest(storage, "p", layout.committed_batches(storage, "p")[2][0])
        assert all(t.details[REPLACE_TABLE] for t in resnapshot.tables.values())
        assert "dropped and added again" in resnapshot.tables["public.drop_add"].details[REPLACE_TABLE]
        assert "enum labels were renamed ('bad' -> 'awful')" in resnapshot.tables["public.enum_label"].details[REPLACE_TABLE]
        assert "column d was added with a default" in resnapshot.tables["public.enum_label"].details[REPLACE_TABLE]
        assert "column v changed type" in resnapshot.tables["public.retyped"].details[REPLACE_TABLE]
        assert "created again" in resnapshot.tables["public.recreated"].details[REPLACE_TABLE]

        # the next pull follows from the recorded layouts, with rows before and after a rename or a
        # drop in one window: nothing is snapshotted again
        publisher.execute("UPDATE renamed_col SET c = 'later' WHERE id = 2; ALTER TABLE renamed_col RENAME c TO d;"
                          "UPDATE renamed_col SET d = 'last' WHERE id = 3; UPDATE renamed_tbl2 SET v = 'later';"
                          "UPDATE other.moved SET v = 'x' WHERE id = 3; ALTER TABLE other.moved DROP COLUMN v;"
                          "INSERT INTO other.moved VALUES (9); UPDATE drop_add SET b = 'later' WHERE id = 3")
        run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
        assert [kind for kind, _ in batches(storage)].count("snapshot") == 2

        # on_ddl="fail": the pull stops before staging anything, naming the backfill, which makes it exact
        publisher.execute("ALTER TABLE retyped ALTER COLUMN v TYPE int USING length(v); UPDATE retyped SET v = 0 "
                          "WHERE id = 1")
        before = (layout.committed_batches(storage, "p"), read_record(storage, "p"), slot_position(publisher))
        with pytest.raises(PipelineStateError) as error:
            run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p", on_ddl="fail")
        assert "public.retyped: column v changed type in a way Iceberg cannot promote" in str(error.value)
        assert "PgBackfillOperator(tables=['public.retyped'])" in str(error.value)
        assert "Nothing was changed" in str(error.value)
        assert (layout.committed_batches(storage, "p"), read_record(storage, "p"), slot_position(publisher)) == before
        run_backfill(publisher_hook, tables=["public.retyped"], publications=["p"], root=storage, pipeline="p")
        run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p", on_ddl="fail")

        # one apply of the four pulls' batches: renames b -> c -> d, drops, replaced tables, a backfill
        apply_changes.run(spark, ApplyOptions(storage.as_uri(), "p", "lake", "ddl"))
        assert_lakehouse_equals_source(spark, publisher)
        tables = {r.tableName for r in spark.sql("SHOW TABLES IN lake.ddl").collect()}
        assert not tables & {"public__renamed_tbl2", "other__moved"}, tables
        for replaced in ("public__recreated", "public__retyped"):  # created again with the owner it had
            properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES lake.ddl.{replaced}").collect()}
            assert '"table": "public.' in properties.get("pglogical.owner", ""), properties
    finally:
        spark.stop()

