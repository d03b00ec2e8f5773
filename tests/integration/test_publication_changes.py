"""Every change to what the source publishes is followed or refused, never drifts (issue 47, invariant 18).

A DBA's changes with the pipeline running: table rewrites (``ALTER COLUMN … TYPE … USING``), filled
columns (a volatile default dropped again, an identity), a publication's column list grown, row
filters widened and narrowed, ``publish`` without update/delete, ``publish_via_partition_root``
flipped. None of them leaves a row change in the stream for the rows they change. Through the
public operators (initial sync and pull; the apply job's own code in one shared Spark session),
each Iceberg table must equal the publisher's published projection read with psycopg2
(``SELECT <published columns> FROM t WHERE <row filter>``), on PostgreSQL 15 and 18.
"""

from __future__ import annotations

from collections import Counter

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import PublicationError, PublisherCheckError
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.staging.contract import ORPHANED_PROPERTY, REPLACE_TABLE
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from airflow_provider_pglogical.ui.discovery import PipelineRef
from airflow_provider_pglogical.ui.figures import staging_figures
from airflow_provider_pglogical.ui.history import read_history
from tests.support.spark_jobs import applying_session

VERSIONS = pytest.mark.parametrize("pg_version", [15, 18], ids=["pg15", "pg18"])

#: table -> (published columns, row filter) as the publisher publishes it after the changes
PROJECTIONS = {
    "t_same": ("id, n", None), "t_big": ("id, n", None), "t_upper": ("id, s", None), "t_num": ("id, x", None),
    "t_fill": ("id, v, r", None), "t_ident": ("id, v, i", None), "t_list": ("id, a, secret", None),
    "t_widen": ("id, v", "id <= 9"), "t_narrow": ("id, v", "id <= 5"), "t_toggle": ("id, v", "id <= 5"),
}
SOURCE = """
CREATE TABLE t_same(id int PRIMARY KEY, n int);
CREATE TABLE t_big(id int PRIMARY KEY, n int);
CREATE TABLE t_upper(id int PRIMARY KEY, s varchar(20));
CREATE TABLE t_num(id int PRIMARY KEY, x numeric(6,2));
CREATE TABLE t_fill(id int PRIMARY KEY, v int);
CREATE TABLE t_ident(id int PRIMARY KEY, v int);
CREATE TABLE t_list(id int PRIMARY KEY, a int, secret text);
CREATE TABLE t_widen(id int PRIMARY KEY, v int);
CREATE TABLE t_narrow(id int PRIMARY KEY, v int);
CREATE TABLE t_toggle(id int PRIMARY KEY, v int);
INSERT INTO t_same SELECT g, g FROM generate_series(1, 10) g;
INSERT INTO t_big SELECT g, g FROM generate_series(1, 10) g;
INSERT INTO t_upper SELECT g, 'abcdefgh' || g FROM generate_series(1, 10) g;
INSERT INTO t_num SELECT g, g + 0.25 FROM generate_series(1, 10) g;
INSERT INTO t_fill SELECT g, g FROM generate_series(1, 10) g;
INSERT INTO t_ident SELECT g, g FROM generate_series(1, 10) g;
INSERT INTO t_list SELECT g, g, 's' || g FROM generate_series(1, 10) g;
INSERT INTO t_widen SELECT g, g FROM generate_series(1, 10) g;
INSERT INTO t_narrow SELECT g, g FROM generate_series(1, 10) g;
INSERT INTO t_toggle SELECT g, g FROM generate_series(1, 10) g;
CREATE PUBLICATION p FOR TABLE t_same, t_big, t_upper, t_num, t_fill, t_ident;
CREATE PUBLICATION plist FOR TABLE t_list (id, a);
CREATE PUBLICATION pwiden FOR TABLE t_widen WHERE (id <= 6);
CREATE PUBLICATION pnarrow FOR TABLE t_narrow WHERE (id <= 10);
CREATE PUBLICATION ptoggle FOR TABLE t_toggle WHERE (id <= 5);
"""
PUBLICATIONS = ["p", "plist", "pwiden", "pnarrow", "ptoggle"]
CHANGES = """
ALTER TABLE t_same ALTER COLUMN n TYPE int USING n * 100;
ALTER TABLE t_big ALTER COLUMN n TYPE bigint USING n * 3;
ALTER TABLE t_upper ALTER COLUMN s TYPE text USING upper(s);
ALTER TABLE t_num ALTER COLUMN x TYPE numeric(12,2) USING x * 10;
ALTER TABLE t_fill ADD COLUMN r float8 DEFAULT random();
ALTER TABLE t_fill ALTER COLUMN r DROP DEFAULT;
ALTER TABLE t_ident ADD COLUMN i int GENERATED ALWAYS AS IDENTITY;
ALTER PUBLICATION plist SET TABLE t_list (id, a, secret);
ALTER PUBLICATION pwiden SET TABLE t_widen WHERE (id <= 9);
ALTER PUBLICATION pnarrow SET TABLE t_narrow WHERE (id <= 5);
UPDATE t_same SET n = -1 WHERE id = 1;
UPDATE t_list SET a = -1 WHERE id = 1;
UPDATE t_narrow SET v = -1 WHERE id = 2;
ALTER PUBLICATION ptoggle SET TABLE t_toggle WHERE (id <= 10);
UPDATE t_toggle SET v = -1 WHERE id = 8;
ALTER PUBLICATION ptoggle SET TABLE t_toggle WHERE (id <= 5);
"""


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One in-process session for the module: the apply job's code on a shared warehouse."""
    session = applying_session(tmp_path_factory.mktemp("warehouse"), "test-publication-changes")
    apply_changes.tune_session(session)
    yield session
    session.stop()


def operators(publisher, tmp_path, publications, **kwargs):
    common = {"postgres_conn_id": publisher.conn_id, "staging_root": (tmp_path / "staging").as_uri(),
              "pipeline": "p", "publications": publications}
    sync = PgInitialSyncOperator(task_id="sync", slot="s1", **common, **kwargs)
    pull = PgSlotPullOperator(task_id="pull", slot="s1", **common, **kwargs)
    return sync, pull


def apply(spark, tmp_path, namespace: str) -> dict:
    return apply_changes.run(spark, ApplyOptions((tmp_path / "staging").as_uri(), "p", "lake", namespace))


def assert_lake_equals_projection(spark, publisher, namespace: str, projections: dict) -> None:
    for table, (columns, where) in projections.items():
        names = [c.strip() for c in columns.split(",")]
        expected = Counter(tuple(str(v) for v in row) for row in publisher.query(
            f"SELECT {columns} FROM {table}" + (f" WHERE {where}" if where else "")))
        found = Counter(tuple(str(v) for v in row)
                        for row in spark.table(f"lake.{namespace}.public__{table}").select(*names).collect())
        assert found == expected, (table, sorted(found - expected), sorted(expected - found))


def slot_position(publisher) -> list[tuple]:
    return publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's1'")


def kinds(tmp_path) -> list[str]:
    return [kind for _n, _s, _e, kind in layout.committed_batches(ObjectStoragePath((tmp_path / "staging").as_uri()),
                                                                    "p")]


@VERSIONS
@pytest.mark.spark
def test_rewrites_filled_columns_column_lists_and_row_filters_resnapshot_the_table(
        publisher, tmp_path, spark, pg_version):
    publisher.execute(SOURCE)
    sync, pull = operators(publisher, tmp_path, PUBLICATIONS)
    sync.execute({})
    namespace = f"changes{pg_version}"
    apply(spark, tmp_path, namespace)
    publisher.execute(CHANGES)

    pull.execute({})
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    name = layout.committed_batches(storage, "p")[-1][0]
    resnapshot = layout.read_manifest(storage, "p", name)
    assert resnapshot.kind == "snapshot" and sorted(resnapshot.tables) == sorted(f"public.{t}" for t in PROJECTIONS)
    reasons = {t: m.details[REPLACE_TABLE] for t, m in resnapshot.tables.items()}
    for table in ("t_same", "t_big", "t_upper", "t_num", "t_fill", "t_ident"):
        assert "its storage was rewritten" in reasons[f"public.{table}"], reasons
    assert "column list now also publishes secret" in reasons["public.t_list"]
    assert "row filter changed from WHERE (id <= 6) to WHERE (id <= 9)" in reasons["public.t_widen"]
    assert "row filter changed from WHERE (id <= 10) to WHERE (id <= 5)" in reasons["public.t_narrow"]
    # widened and narrowed back between two pulls: the filter reads the same, the row 8 it let through
    # while wide is in the window; the rows of pg_publication_rel tell
    assert "its publications were altered since the last pull" in reasons["public.t_toggle"]
    apply(spark, tmp_path, namespace)
    assert_lake_equals_projection(spark, publisher, namespace, PROJECTIONS)

    # what the pull recorded is what the catalog shows: later pulls follow the tables, nothing re-snapshots
    publisher.execute("UPDATE t_same SET n = 7 WHERE id = 2; UPDATE t_widen SET v = 0 WHERE id = 8;"
                      "UPDATE t_fill SET r = 0.5 WHERE id = 3; DELETE FROM t_narrow WHERE id = 3")
    before = kinds(tmp_path).count("snapshot")
    pull.execute({})
    assert kinds(tmp_path).count("snapshot") == before
    apply(spark, tmp_path, namespace)
    assert_lake_equals_projection(spark, publisher, namespace, PROJECTIONS)


@VERSIONS
@pytest.mark.spark
def test_publish_without_update_or_delete_is_refused_unless_append_only(publisher, tmp_path, spark, pg_version):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v int); INSERT INTO t SELECT g, g FROM generate_series(1, 6) g;"
                      "CREATE PUBLICATION pins FOR TABLE t WITH (publish = 'insert');"
                      "CREATE PUBLICATION pall FOR TABLE t")
    # refused before the slot exists, naming the fix
    sync, _pull = operators(publisher, tmp_path / "ins", ["pins"])
    with pytest.raises(PublisherCheckError) as error:
        sync.execute({})
    assert "published by pins without update, delete (publish = 'insert')" in str(error.value)
    assert "append_only=True" in str(error.value)
    assert publisher.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]

    # switched mid-stream: the pull stops, the slot stays; once restored, the table is snapshotted again
    sync, pull = operators(publisher, tmp_path, ["pall"])
    sync.execute({})
    publisher.execute("ALTER PUBLICATION pall SET (publish = 'insert');"
                      "UPDATE t SET v = 100 WHERE id = 1; DELETE FROM t WHERE id = 2; INSERT INTO t VALUES (7, 7)")
    before = slot_position(publisher)
    with pytest.raises(PublicationError) as error:
        pull.execute({})
    assert "published by pall without update, delete" in str(error.value)
    assert "slot was not advanced" in str(error.value)
    assert slot_position(publisher) == before
    publisher.execute("ALTER PUBLICATION pall SET (publish = 'insert, update, delete, truncate')")
    pull.execute({})
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    last = layout.read_manifest(storage, "p", layout.committed_batches(storage, "p")[-1][0])
    assert last.kind == "snapshot" and "now publish delete, truncate, update too" in last.tables["public.t"].details[
        REPLACE_TABLE]
    namespace = f"publish{pg_version}"
    apply(spark, tmp_path, namespace)
    assert_lake_equals_projection(spark, publisher, namespace, {"t": ("id, v", None)})

    # append-only, opted into: the lakehouse keeps what was inserted, as documented
    append = tmp_path / "append"
    publisher.execute("SELECT pg_drop_replication_slot('s1')")
    sync, pull = operators(publisher, append, ["pins"], append_only=True)
    sync.execute({})
    publisher.execute("UPDATE t SET v = 200 WHERE id = 3; DELETE FROM t WHERE id = 4; INSERT INTO t VALUES (8, 8)")
    pull.execute({})
    apply(spark, append, f"append{pg_version}")
    rows = {tuple(r) for r in spark.table(f"lake.append{pg_version}.public__t").select("id", "v").collect()}
    assert (3, 3) in rows and (4, 4) in rows and (8, 8) in rows and (3, 200) not in rows


@VERSIONS
@pytest.mark.spark
def test_a_via_root_flip_snapshots_the_root_and_marks_the_orphaned_partitions(publisher, tmp_path, spark, pg_version):
    publisher.execute("CREATE TABLE root(id int PRIMARY KEY, v int) PARTITION BY RANGE (id);"
                      "CREATE TABLE part1 PARTITION OF root FOR VALUES FROM (0) TO (10);"
                      "CREATE TABLE part2 PARTITION OF root FOR VALUES FROM (10) TO (20);"
                      "INSERT INTO root SELECT g, g FROM generate_series(1, 15) g;"
                      "CREATE PUBLICATION pr FOR TABLE root")
    sync, pull = operators(publisher, tmp_path, ["pr"])
    sync.execute({})
    namespace = f"viaroot{pg_version}"
    apply(spark, tmp_path, namespace)
    publisher.execute("ALTER PUBLICATION pr SET (publish_via_partition_root = true);"
                      "UPDATE root SET v = -1 WHERE id IN (2, 12); INSERT INTO root VALUES (16, 16)")
    pulled = pull.execute({})
    assert "turned on" in pulled["resnapshotted"]["public.root"]
    assert sorted(pulled["orphaned"]) == ["public.part1", "public.part2"]
    history = read_history(ObjectStoragePath((tmp_path / "staging").as_uri()), "p", "pull")[-1]  # the pipeline view
    assert sorted(history["orphaned"]) == ["public.part1", "public.part2"] and "public.root" in history["resnapshotted"]
    view = staging_figures(ObjectStoragePath((tmp_path / "staging").as_uri()),
                           PipelineRef((tmp_path / "staging").as_uri(), "p", publisher.conn_id, "s1"))
    assert sorted(view["last_source_change"]["orphaned"]) == ["public.part1", "public.part2"]
    summary = apply(spark, tmp_path, namespace)
    assert summary["orphaned"] == {"public.part1": "marked", "public.part2": "marked"}
    assert_lake_equals_projection(spark, publisher, namespace, {"root": ("id, v", None)})
    for part in ("part1", "part2"):
        properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES lake.{namespace}.public__{part}").collect()}
        assert "publish_via_partition_root was turned on" in properties[ORPHANED_PROPERTY], properties
    # further changes reach the root's table only
    publisher.execute("UPDATE root SET v = 99 WHERE id = 5")
    pull.execute({})
    apply(spark, tmp_path, namespace)
    assert_lake_equals_projection(spark, publisher, namespace, {"root": ("id, v", None)})


@VERSIONS
def test_a_publication_dropped_before_the_pull_refuses_through_the_operator(publisher, tmp_path, pg_version):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION gone FOR TABLE t")
    sync, pull = operators(publisher, tmp_path, ["gone"])
    sync.execute({})
    publisher.execute("DROP PUBLICATION gone; INSERT INTO t VALUES (1)")
    with pytest.raises(PublicationError) as error:
        pull.execute({})
    assert "publication(s) gone of pipeline 'p' no longer exist on the publisher" in str(error.value)
