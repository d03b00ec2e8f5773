"""Tables added to (or removed from) a running pipeline's publications.

A table added with ``ALTER PUBLICATION … ADD TABLE`` gets its own snapshot, ordered before its
changes, so the lakehouse never holds a partial table; the oracle is a native subscriber that
refreshes its publication (``copy_data``). A table removed stops receiving changes.
"""

from __future__ import annotations

import json

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.exceptions import PipelineStateError
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.verification.witness import verify_pipeline
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.staging.pipeline_record import read_record
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from tests.support.spark_jobs import submit_apply
from tests.support.source_state import SourceState

DDL = "CREATE TABLE a(id int PRIMARY KEY, v text); CREATE TABLE b(id int PRIMARY KEY, v text);"


def kinds(root) -> list[tuple[str, list[str]]]:
    return [(kind, sorted(layout.read_manifest(root, "p", name).tables))
            for name, _s, _e, kind in layout.committed_batches(root, "p")]


@pytest.mark.spark
def test_a_table_added_mid_stream_equals_the_source(publisher, subscriber, publisher_hook, subscriber_hook,
                                                     tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    publisher.execute(DDL + "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 10) g;"
                            "INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 100) g")
    subscriber.execute(DDL)
    publisher_hook.create_publication("p", [PublishedTable("a")])
    root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    subscriber_hook.create_subscription("native", ["p"], publisher_conn_id=publisher.conn_id)
    wait_until(lambda: (s := subscriber_hook.subscription_status("native")) and s.ready, timeout=60,
               message="the native subscriber to be ready")

    publisher.execute("UPDATE a SET v = 'changed' WHERE id = 1")
    publisher_hook.add_publication_tables("p", [PublishedTable("b")])
    publisher.execute("INSERT INTO b VALUES (101, 'new'); UPDATE b SET v = 'changed' WHERE id = 2;"
                      "DELETE FROM b WHERE id = 3")
    result = run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    # The snapshot of b was committed before, and sorts after, the change batch holding b's changes.
    assert kinds(storage) == [("snapshot", ["public.a"]), ("changes", ["public.a", "public.b"]),
                              ("snapshot", ["public.b"])]
    assert result["tables"] == {"public.a": 1, "public.b": 3}
    assert set(read_record(storage, "p").tables) == {"public.a", "public.b"}
    publisher.execute("UPDATE b SET v = 'later' WHERE id = 4")
    run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    submit_apply(root, warehouse)

    subscriber_hook.refresh_subscription("native", copy_data=True)
    wait_until(lambda: subscriber.query("SELECT count(*), max(v) FILTER (WHERE id = 4) FROM b") == [(100, "later")],
               timeout=60, message="the native subscriber to copy and catch up b")
    iceberg = IcebergConfig(warehouse=warehouse.as_uri(), namespace="toast")
    common = dict(postgres_conn_id=publisher.conn_id, publications=["p"], staging_path=root.as_uri(),
                  pipeline="p", iceberg=iceberg, report=lambda m: None)
    against_native = verify_pipeline(**common, source_conn_id=subscriber.conn_id)
    assert against_native["equal"], against_native["summary"]
    assert sorted(t["source_rows"] for t in against_native["tables"]) == [10, 100]


def test_new_tables_fail_names_the_backfill_and_changes_nothing(publisher, publisher_hook, tmp_path):
    publisher.execute(DDL + "INSERT INTO a VALUES (1, 'x'); INSERT INTO b VALUES (1, 'y')")
    publisher_hook.create_publication("p", [PublishedTable("a")])
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    publisher_hook.add_publication_tables("p", [PublishedTable("b")])
    publisher.execute("UPDATE b SET v = 'z'")
    before = SourceState.capture(publisher, tmp_path / "staging")
    with pytest.raises(PipelineStateError) as raised:
        run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p", new_tables="fail")
    message = str(raised.value)
    assert "public.b have changes in slot 's1' but pipeline 'p' never snapshotted them" in message
    assert "PgBackfillOperator(tables=['public.b'])" in message
    assert SourceState.capture(publisher, tmp_path / "staging") == before


def test_a_table_added_and_removed_again_is_never_staged_partially(publisher, publisher_hook, tmp_path):
    publisher.execute(DDL + "INSERT INTO a VALUES (1, 'x'); INSERT INTO b VALUES (1, 'y')")
    publisher_hook.create_publication("p", [PublishedTable("a")])
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    publisher_hook.add_publication_tables("p", [PublishedTable("b")])
    publisher.execute("UPDATE b SET v = 'z'; UPDATE a SET v = 'w'")
    publisher_hook.drop_publication_tables("p", ["b"])
    result = run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    assert result["tables"] == {"public.a": 1}
    assert kinds(storage) == [("snapshot", ["public.a"]), ("changes", ["public.a"])]
