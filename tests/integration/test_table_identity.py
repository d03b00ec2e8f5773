"""One identity per table (DESIGN invariant 11) and names Iceberg or Spark reserve (issue 33).

Tables whose names used to fold together (``"Foo"`` and ``foo``, ``"a-b"`` and ``a_b``, schema
``"x.y"`` table ``z`` and schema ``x`` table ``"y.z"``) land in tables of their own; two sources
mapped onto one target, a second pipeline writing another's table, and columns no Spark session
could read are refused before anything is written. The job runs in-process
(``apply_changes.run``) in one Spark session configured as the job's own; PostgreSQL is read
with psycopg2, the lakehouse with Spark.
"""

from __future__ import annotations

import json

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.exceptions import PublicationError
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.staging.contract import OWNER_PROPERTY, STATE_TABLE, default_target_name
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import applying_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = applying_session(tmp_path_factory.mktemp("identity") / "warehouse", "test-table-identity")
    yield session
    session.stop()


def sync(hook, root, tables: list[PublishedTable], pipeline: str = "p", slot: str = "s1") -> ObjectStoragePath:
    hook.create_publication(f"pub_{pipeline}", tables)
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(hook, slot=slot, publications=[f"pub_{pipeline}"], root=storage, pipeline=pipeline)
    return storage


def lake_rows(spark, namespace: str, target: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.table(f"lake.{namespace}.{target}").select("id", "v").collect())


def tables_in(spark, namespace: str) -> set[str]:
    return {r.tableName for r in spark.sql(f"SHOW TABLES IN lake.{namespace}").collect()} - {STATE_TABLE}


def state_rows(spark, namespace: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.table(f"lake.{namespace}.{STATE_TABLE}")
                  .select("pipeline", "source_table", "target_table", "position").collect())


def staged(root) -> list:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def owner(spark, namespace: str, target: str) -> dict:
    properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES lake.{namespace}.{target}").collect()}
    return json.loads(properties[OWNER_PROPERTY])


NAMES = [("public", "Foo"), ("public", "foo"), ("public", "a-b"), ("public", "a_b"), ("x.y", "z"), ("x", "y.z")]


def test_names_that_folded_together_land_in_tables_of_their_own(publisher, publisher_hook, spark, tmp_path):
    publisher.execute('CREATE SCHEMA "x.y"; CREATE SCHEMA x;' + "".join(
        f'CREATE TABLE "{s}"."{t}"(id int PRIMARY KEY, v text);'
        f"INSERT INTO \"{s}\".\"{t}\" SELECT g, '{s}/{t} ' || g FROM generate_series(1, {i + 2}) g;"
        for i, (s, t) in enumerate(NAMES)))
    root = tmp_path / "staging"
    storage = sync(publisher_hook, root, [PublishedTable.of(s, t) for s, t in NAMES])
    publisher.execute("".join(f"UPDATE \"{s}\".\"{t}\" SET v = v || ' changed' WHERE id = 1;"
                              f"INSERT INTO \"{s}\".\"{t}\" VALUES (100, 'new in {s}/{t}');" for s, t in NAMES))
    run_pull(publisher_hook, slot="s1", publications=["pub_p"], root=storage, pipeline="p")
    keys = {'public.Foo', 'public.foo', 'public.a-b', 'public.a_b', '"x.y"."z"', '"x"."y.z"'}
    for name, *_ in committed_batches(storage, "p"):
        assert set(read_manifest(storage, "p", name).tables) == keys

    summary = apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "names"))

    targets = {step["table"]: step["target"] for step in summary["steps"]}
    assert targets == {key: default_target_name(key) for key in keys} and len(set(targets.values())) == 6
    assert targets["public.foo"] == "public__foo" and targets["public.a_b"] == "public__a_b"
    for (schema, table), key in zip(NAMES, ['public.Foo', 'public.foo', 'public.a-b', 'public.a_b', '"x.y"."z"',
                                            '"x"."y.z"']):
        source = sorted(publisher.query(f'SELECT id, v FROM "{schema}"."{table}"'))
        assert lake_rows(spark, "names", targets[key]) == source, key
        assert owner(spark, "names", targets[key])["table"] == key


def test_two_sources_mapped_onto_one_target_are_refused_before_anything_is_written(
        publisher, publisher_hook, spark, tmp_path):
    publisher.execute("CREATE TABLE a(id int PRIMARY KEY, v text); CREATE TABLE b(id int PRIMARY KEY, v text);"
                      "INSERT INTO a VALUES (1, 'a'); INSERT INTO b VALUES (1, 'b')")
    root = tmp_path / "staging"
    sync(publisher_hook, root, [PublishedTable("a"), PublishedTable("b")])
    before = staged(root)

    with pytest.raises(ApplyError, match=r"source tables public.a and public.b both map to Iceberg table t: give "
                                         r"each source its own target with table_map=\{source: target\} .*"
                                         r"Nothing was applied"):
        apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "onto", {"public.a": "t", "public.b": "t"}))
    with pytest.raises(ApplyError, match=r"table_map: table name 'x.y.z' is 3 dot-separated names, not 2: a name "
                                         r"that holds a dot must be written in double quotes"):
        apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "onto", {"x.y.z": "t"}))
    assert tables_in(spark, "onto") == set() and state_rows(spark, "onto") == [] and staged(root) == before


def test_a_second_pipeline_writing_another_ones_tables_is_refused(
        publisher, publisher_hook, subscriber, subscriber_hook, spark, tmp_path):
    """Two databases (on two clusters) with the same table names, applied into one namespace."""
    for db, rows in ((publisher, "1, 'first'"), (subscriber, "2, 'second'")):
        db.execute(f"CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t VALUES ({rows})")
    first, second, third = tmp_path / "first", tmp_path / "second", tmp_path / "third"
    storage = sync(publisher_hook, first, [PublishedTable("t")])
    sync(subscriber_hook, second, [PublishedTable("t")])  # the same pipeline name "p", another database
    sync(subscriber_hook, third, [PublishedTable("t")], pipeline="q", slot="s2")
    apply_changes.run(spark, ApplyOptions(first.as_uri(), "p", "lake", "shared"))
    mine = owner(spark, "shared", "public__t")
    assert mine["pipeline"] == "p" and mine["table"] == "public.t" and mine["source"]["system_identifier"]

    # a table written before owners were recorded: refused to a pipeline that never applied it,
    # adopted by the one whose state says it did
    spark.sql(f"ALTER TABLE lake.shared.public__t UNSET TBLPROPERTIES ('{OWNER_PROPERTY}')")
    with pytest.raises(ApplyError, match=r"Iceberg table `lake`.`shared`.`public__t` exists but no pipeline owns it "
                                         r".* pipeline 'q' never applied public.t into it"):
        apply_changes.run(spark, ApplyOptions(third.as_uri(), "q", "lake", "shared"))
    publisher.execute("UPDATE t SET v = 'first, changed'")
    run_pull(publisher_hook, slot="s1", publications=["pub_p"], root=storage, pipeline="p")
    apply_changes.run(spark, ApplyOptions(first.as_uri(), "p", "lake", "shared"))
    assert owner(spark, "shared", "public__t") == mine
    assert lake_rows(spark, "shared", "public__t") == publisher.query("SELECT id, v FROM t") == [(1, "first, changed")]
    snapshot = spark.sql("SELECT snapshot_id FROM lake.shared.public__t.snapshots").collect()
    state, before = state_rows(spark, "shared"), staged(tmp_path)

    # another pipeline name: the table's owner refuses it
    with pytest.raises(ApplyError) as refused:
        apply_changes.run(spark, ApplyOptions(third.as_uri(), "q", "lake", "shared"))
    message = str(refused.value)
    assert f"Iceberg table `lake`.`shared`.`public__t` is owned by {json.dumps(mine, sort_keys=True)}" in message
    assert '"pipeline": "q"' in message and "table_map={source: target}" in message
    assert message.endswith("Nothing was applied")
    # the same pipeline name (its snapshot even has the same LSN here: both clusters are fresh)
    with pytest.raises(ApplyError, match=r"pipeline 'p' of namespace shared applies database \{.*\}, but this "
                                         r"staging's pipeline 'p' reads database \{.*subscriber.*\}: two pipelines "
                                         r"share one name .* Give this one another pipeline name"):
        apply_changes.run(spark, ApplyOptions(second.as_uri(), "p", "lake", "shared"))
    assert spark.sql("SELECT snapshot_id FROM lake.shared.public__t.snapshots").collect() == snapshot
    assert lake_rows(spark, "shared", "public__t") == [(1, "first, changed")]
    assert state_rows(spark, "shared") == state and staged(tmp_path) == before


def test_columns_iceberg_reserves_or_that_differ_only_in_case_are_refused(
        publisher, publisher_hook, spark, tmp_path):
    publisher.execute('CREATE TABLE meta(id int PRIMARY KEY, "_pos" int, "_file" text, "_spec_id" int,'
                      ' "_partition" text, "_deleted" bool);'
                      'CREATE TABLE cased(id int PRIMARY KEY, "ID" int); CREATE TABLE ok(id int PRIMARY KEY, v text);'
                      "INSERT INTO ok VALUES (1, 'one')")
    # at the initial sync: before a slot or a batch exists
    publisher_hook.create_publication("bad", [PublishedTable("meta"), PublishedTable("cased")])
    root = tmp_path / "staging"
    with pytest.raises(PublicationError) as refused:
        run_initial_sync(publisher_hook, slot="s0", publications=["bad"], root=ObjectStoragePath(root.as_uri()),
                         pipeline="bad")
    message = str(refused.value)
    for column in ("_pos", "_file", "_spec_id", "_partition", "_deleted"):
        assert f"table public.meta: column '{column}' has a name Iceberg or this provider reserves" in message
    assert "table public.cased: columns 'id' and 'ID' differ only in case" in message
    assert "fix for public.cased: rename the column at the source (ALTER TABLE … RENAME COLUMN), or leave it " \
           "out of the publication's column list" in message and message.endswith("Nothing was changed")
    assert publisher.query("SELECT count(*) FROM pg_replication_slots")[0][0] == 0 and not root.exists()

    # added after the slot exists: the apply refuses before it writes anything
    storage = sync(publisher_hook, root, [PublishedTable("ok")])
    apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "cols"))
    snapshot = spark.sql("SELECT snapshot_id FROM lake.cols.public__ok.snapshots").collect()
    publisher.execute("""ALTER TABLE ok ADD COLUMN "_pos" int, ADD COLUMN "ID" int;
                         INSERT INTO ok VALUES (2, 'two', 2, 2)""")
    run_pull(publisher_hook, slot="s1", publications=["pub_p"], root=storage, pipeline="p")
    state, before = state_rows(spark, "cols"), staged(root)
    with pytest.raises(ApplyError, match=r"table public.ok: column '_pos' has a name Iceberg .*; table public.ok: "
                                         r"columns 'id' and 'ID' differ only in case.*; fix for public.ok: rename .*"
                                         r"Nothing was applied"):
        apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "cols"))
    assert spark.sql("SELECT snapshot_id FROM lake.cols.public__ok.snapshots").collect() == snapshot
    assert spark.table("lake.cols.public__ok").columns == ["id", "v"]
    assert state_rows(spark, "cols") == state and staged(root) == before
