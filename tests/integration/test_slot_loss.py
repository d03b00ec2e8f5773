"""A lost slot: invalidated by ``max_slot_wal_keep_size``, it fails permanently by default and a
``on_slot_lost="resync"`` pull recovers it, leaving a lakehouse equal to the source."""

from __future__ import annotations

import json

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until
from airflow_provider_pglogical.exceptions import SlotLostError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.verification.witness import verify_pipeline
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.staging.pipeline_record import read_record
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from tests.support.spark_jobs import submit_apply


def files(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


@pytest.mark.spark
def test_an_invalidated_slot_fails_permanently_then_resyncs_to_the_source(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    with LocalPostgres(name="slot-loss", settings={"max_slot_wal_keep_size": "1MB"}) as cluster:
        monkeypatch.setenv("AIRFLOW_CONN_LOSSY", cluster.connection_uri("postgres"))
        cluster.execute("CREATE TABLE t(id int PRIMARY KEY, v text); CREATE TABLE filler(pad text);"
                        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
        hook = PgLogicalHook(postgres_conn_id="lossy")
        hook.create_publication("p", [PublishedTable("t")])
        root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
        storage = ObjectStoragePath(root.as_uri())
        common = dict(slot="s1", publications=["p"], root=storage, pipeline="p")
        first = run_initial_sync(hook, **common)
        cluster.execute("UPDATE t SET v = 'pulled' WHERE id = 1")
        assert run_pull(hook, **common)["changes"] == 1

        # Nobody pulls while the application writes on: the slot loses the WAL it needs.
        cluster.execute("UPDATE t SET v = 'lost with the slot' WHERE id = 2; DELETE FROM t WHERE id = 3")

        def invalidated() -> bool:
            cluster.execute("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100)")
            cluster.execute("SELECT pg_switch_wal()")
            cluster.execute("CHECKPOINT")
            return hook.get_slot("s1").wal_status == "lost"

        wait_until(invalidated, timeout=120, message="the slot to be invalidated")
        before = files(root)
        for attempt in (lambda: run_pull(hook, **common), lambda: run_initial_sync(hook, **common)):
            with pytest.raises(SlotLostError) as raised:
                attempt()
            message = str(raised.value)
            assert "slot 's1' of pipeline 'p' was invalidated" in message and "on_slot_lost='resync'" in message
            assert files(root) == before and hook.get_slot("s1").wal_status == "lost"

        result = run_pull(hook, **common, on_slot_lost="resync")
        assert result["resynced"] and result["tables"] == {"public.t": 99}
        slot = hook.get_slot("s1")
        assert slot.wal_status != "lost" and str(slot.confirmed_flush_lsn) == result["start_lsn"]
        record = read_record(storage, "p")
        assert record.created_lsn == result["start_lsn"] != first["lsn"] and record.state == "streaming"
        manifest = layout.read_manifest(storage, "p", result["batch"].rsplit("/", 1)[1])
        assert manifest.details["initial"] and manifest.details["resync"]

        cluster.execute("UPDATE t SET v = 'after the resync' WHERE id = 4")
        assert run_pull(hook, **common)["changes"] == 1
        submit_apply(root, warehouse)
        verdict = verify_pipeline(postgres_conn_id="lossy", publications=["p"], staging_path=root.as_uri(),
                                  pipeline="p", iceberg=IcebergConfig(warehouse=warehouse.as_uri(), namespace="toast"),
                                  report=lambda m: None)
        assert verdict["equal"], verdict["summary"]
        assert verdict["tables"][0]["source_rows"] == 99
