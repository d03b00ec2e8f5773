"""Generated columns: the snapshot copies exactly the columns pgoutput sends, on every version.

PostgreSQL 15-17 never publish generated columns; 18 publishes the stored ones with
``publish_generated_columns = stored`` or when a column list names them (the list wins), and never
the virtual ones. The snapshot, the changes and verify must agree on the same column set.
"""

from __future__ import annotations

import json

import psycopg2
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture import source_projection
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.exceptions import PublicationError
from airflow_provider_pglogical.verification.witness import verify_tables
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.lakehouse.staging_roots import storage_path
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.replay import replay, table_rows


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


def staged_columns(root) -> dict[str, dict[str, list[str]]]:
    """``{kind: {table: column names}}`` of the pipeline's committed batches (the last of each kind)."""
    out: dict[str, dict[str, list[str]]] = {}
    for name, _start, _end, kind in layout.committed_batches(root, "p"):
        for qualified, table in layout.read_manifest(root, "p", name).tables.items():
            out.setdefault(kind, {})[qualified] = [c.name for c in table.columns]
    return out


def sync_and_pull(publisher, publisher_hook, root, publications: list[str]) -> None:
    run_initial_sync(publisher_hook, slot="s1", publications=publications, root=root, pipeline="p")
    publisher.execute("INSERT INTO g (id, a, note) VALUES (3, 30, 'c'); UPDATE g SET a = a + 1 WHERE id = 1; "
                      "DELETE FROM g WHERE id = 2")
    assert run_pull(publisher_hook, slot="s1", publications=publications, root=root, pipeline="p")["changes"] == 3


def test_without_the_option_no_generated_column_is_copied_or_streamed(publisher, publisher_hook, root, pg_version):
    publisher.execute("CREATE TABLE g(id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 2) STORED, note text);"
                      "INSERT INTO g (id, a, note) VALUES (1, 10, 'a'), (2, 20, 'b')")
    if pg_version < 18:  # refused before anything is created, naming the version and the fix
        with pytest.raises(PublicationError, match=r"publish_generated_columns = 'stored' needs PostgreSQL 18.*"
                                                   rf"publisher runs {pg_version}.*Nothing was changed"):
            publisher_hook.ensure_publication("pub", [PublishedTable("g")], publish_generated_columns="stored")
        with pytest.raises(PublicationError, match="needs PostgreSQL 18"):
            publisher_hook.create_publication("pub", [PublishedTable("g")], publish_generated_columns="stored")
        assert publisher.query("SELECT count(*) FROM pg_publication")[0][0] == 0
        with pytest.raises(psycopg2.Error, match="generated column"):  # PostgreSQL's own refusal
            publisher_hook.ensure_publication("pub", [PublishedTable("g", columns=["id", "a", "s"])])
        assert publisher.query("SELECT count(*) FROM pg_publication")[0][0] == 0
    publisher_hook.ensure_publication("pub", [PublishedTable("g")])
    sync_and_pull(publisher, publisher_hook, root, ["pub"])
    assert staged_columns(root) == {kind: {"public.g": ["id", "a", "note"]} for kind in ("snapshot", "changes")}
    assert table_rows(replay(root, "p"), "public.g", ["id", "a", "note"]) == sorted(
        publisher.query("SELECT id, a, note FROM g"))


@pytest.mark.spark
@pytest.mark.min_server(18)  # generated columns are published from PostgreSQL 18 on
def test_stored_generated_columns_reach_iceberg_and_verify_on_18_also_when_added_later(publisher, publisher_hook, root, pg_version, tmp_path):
    from airflow_provider_pglogical.spark.jobs import apply_changes
    from airflow_provider_pglogical.spark.jobs import verify_tables as verify_job
    from tests.support.spark_jobs import applying_session

    publisher.execute(
        "CREATE TABLE g(id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a * 2) STORED,"
        " v int GENERATED ALWAYS AS (a * 3) VIRTUAL, note text);"
        "CREATE TABLE h(id int PRIMARY KEY, a int, s int GENERATED ALWAYS AS (a + 1) STORED,"
        " t int GENERATED ALWAYS AS (a - 1) STORED);"
        "INSERT INTO g (id, a, note) VALUES (1, 10, 'a'), (2, 20, 'b'); INSERT INTO h (id, a) VALUES (1, 5)")
    # a column list naming a virtual generated column: PostgreSQL refuses it, nothing is created
    with pytest.raises(psycopg2.Error, match="virtual generated column"):
        publisher_hook.ensure_publication("pub_bad", [PublishedTable("g", columns=["id", "a", "v"])],
                                          publish_generated_columns="stored")
    assert publisher.query("SELECT count(*) FROM pg_publication")[0][0] == 0
    publisher_hook.ensure_publication("pub_all", [PublishedTable("g")], publish_generated_columns="stored")
    # a column list naming a stored generated column wins over publish_generated_columns = none
    publisher_hook.ensure_publication("pub_list", [PublishedTable("h", columns=["id", "a", "s"])])
    assert publisher_hook.describe_publication("pub_all").generated_columns == "stored"
    publications = ["pub_all", "pub_list"]
    sync_and_pull(publisher, publisher_hook, root, publications)
    publisher.execute("UPDATE h SET a = 7 WHERE id = 1")
    run_pull(publisher_hook, slot="s1", publications=publications, root=root, pipeline="p")
    expected = {"public.g": ["id", "a", "s", "note"], "public.h": ["id", "a", "s"]}
    assert staged_columns(root) == {"snapshot": expected, "changes": expected}

    spark = applying_session(tmp_path / "warehouse", "test-generated-columns")
    try:
        apply_changes.run(spark, ApplyOptions(str(root), "p", catalog="lake", namespace="gen"))
        for table, columns in expected.items():
            name = table.split(".")[1]
            frame = spark.table(f"lake.gen.public__{name}")
            assert [c for c in frame.columns if not c.startswith("_pglogical")] == columns
            lake = sorted(tuple(r) for r in frame.select(*columns).collect())
            assert lake == sorted(publisher.query(f"SELECT {', '.join(columns)} FROM {name}")), table
        tables = source_projection.source_tables(publisher_hook.published_tables(publications), "lake", "gen")
        result = verify_tables(publisher_hook.connect_kwargs(), tables, root, "p",
                               lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text())))
        assert result["equal"], result["summary"]

        # a stored generated column added later: PostgreSQL computes it for every existing row,
        # which no change carries, so the pull re-snapshots the table (never NULLs in old rows)
        publisher.execute("ALTER TABLE g ADD COLUMN d int GENERATED ALWAYS AS (a + 100) STORED;"
                          "UPDATE g SET note = 'after' WHERE id = 3")
        run_pull(publisher_hook, slot="s1", publications=publications, root=root, pipeline="p")
        assert staged_columns(root)["snapshot"]["public.g"] == ["id", "a", "s", "note", "d"]
        apply_changes.run(spark, ApplyOptions(str(root), "p", catalog="lake", namespace="gen"))
        columns = ["id", "a", "s", "note", "d"]
        lake = sorted(tuple(r) for r in spark.table("lake.gen.public__g").select(*columns).collect())
        assert lake == sorted(publisher.query(f"SELECT {', '.join(columns)} FROM g"))
        assert all(row[4] == row[1] + 100 for row in lake)
        tables = source_projection.source_tables(publisher_hook.published_tables(publications), "lake", "gen")
        result = verify_tables(publisher_hook.connect_kwargs(), tables, root, "p",
                               lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text())))
        assert result["equal"], result["summary"]
    finally:
        spark.stop()
