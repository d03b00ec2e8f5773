"""``airflow pglogical status`` and ``airflow pglogical drop`` against a real pipeline: real
PostgreSQL, a real initial sync, apply (Spark, Iceberg) and pull, and the real ``airflow`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.publication import PgCreatePublicationOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.management.consumer_lock import slot_consumer_lock
from airflow_provider_pglogical.ui.history import read_history

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def pglogical(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home"), "PYTHONPATH": str(REPO),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    return subprocess.run([AIRFLOW, "pglogical", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)


@pytest.fixture
def pipeline(publisher, publisher_hook, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    publisher.execute("CREATE TABLE orders(id int PRIMARY KEY, status text); "
                      "INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 25) g")
    staging = f"file://{tmp_path}/staging"
    common = {"postgres_conn_id": publisher.conn_id, "staging_path": staging, "pipeline": "shop"}
    PgCreatePublicationOperator(task_id="pub", publication="shop", tables=["public.orders"],
                                postgres_conn_id=publisher.conn_id).execute({})
    synced = PgInitialSyncOperator(task_id="sync", slot="shop_slot", publications=["shop"], **common).execute({})
    IcebergApplyOperator(task_id="apply", staging_root=staging, pipeline="shop",
                         iceberg=IcebergConfig(warehouse=f"file://{tmp_path}/warehouse", namespace="shop"),
                         conf={"spark.ui.enabled": "false"}, env_vars={"SPARK_LOCAL_IP": "127.0.0.1"},
                         ).execute({"outlet_events": OutletEventAccessors()})
    publisher.execute("UPDATE orders SET status = 'paid' WHERE id < 4")
    pulled = PgSlotPullOperator(task_id="pull", slot="shop_slot", publications=["shop"], **common).execute({})
    return staging, synced, pulled


def test_status_shows_slot_lag_last_batch_and_applied_positions(pipeline, publisher, publisher_hook, tmp_path):
    staging, synced, pulled = pipeline
    args = ["--conn-id", publisher.conn_id, "--staging-root", staging, "--pipeline", "shop"]
    proc = pglogical(tmp_path, "status", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    slot = publisher_hook.get_slot("shop_slot")
    assert (status["slot"], status["state"], status["publications"]) == ("shop_slot", "streaming", ["shop"])
    assert status["slot_active"] is False and status["wal_status"] == slot.wal_status
    assert status["confirmed_flush_lsn"] == str(slot.confirmed_flush_lsn) == pulled["advanced_to"]
    assert status["retained_wal_bytes"] > 0 and status["lag_bytes"] >= 0
    assert status["committed_batches"] == 2 and pulled["batch"].endswith(status["last_batch"])
    assert status["last_batch_end_lsn"] == pulled["end_lsn"]
    # the apply ran before the pull: orders is applied up to the snapshot, not the pulled batch
    applied = status["applied"]["public.orders"]
    assert (applied["target"], applied["kind"], applied["rows"]) == ("public__orders", "snapshot", 25)
    assert applied["lsn"] == synced["lsn"]

    table = pglogical(tmp_path, "status", *args)
    assert table.returncode == 0, table.stderr[-3000:]
    assert "shop_slot" in table.stdout and "public__orders" in table.stdout and synced["lsn"] in table.stdout

    # the tasks recorded their figures for the UI's charts (airflow_provider_pglogical/ui/history.py)
    root = ObjectStoragePath(staging)
    [applied_run] = read_history(root, "shop", "apply")
    assert (applied_run["rows"], applied_run["steps"], applied_run["freshness_seconds"]) == (25, 1, None)
    [pulled_run] = read_history(root, "shop", "pull")
    assert (pulled_run["rows"], pulled_run["end_lsn"]) == (3, pulled["advanced_to"])
    assert pulled_run["lag_bytes"] >= 0 and pulled_run["retained_wal_bytes"] > 0


def test_drop_removes_the_slot_then_staging_and_keeps_the_lakehouse(pipeline, publisher, publisher_hook, tmp_path):
    staging, _, _ = pipeline
    args = ["--conn-id", publisher.conn_id, "--staging-root", staging, "--pipeline", "shop"]
    staging_dir = tmp_path / "staging" / "shop"
    warehouse_table = tmp_path / "warehouse" / "shop" / "public__orders"
    assert warehouse_table.is_dir()

    preview = pglogical(tmp_path, "drop", *args)
    assert preview.returncode == 0, preview.stderr[-3000:]
    assert "would drop slot shop_slot" in preview.stdout and "Pass --yes" in preview.stdout
    assert publisher_hook.get_slot("shop_slot") is not None and staging_dir.is_dir()

    # a pull holding the pipeline's lock: drop waits briefly, then refuses and changes nothing
    with slot_consumer_lock(publisher_hook.connect_kwargs(), "shop_slot", "pull"):
        busy = pglogical(tmp_path, "drop", *args, "--yes")
    assert busy.returncode == 1 and "is being consumed by another run" in busy.stderr
    assert publisher_hook.get_slot("shop_slot") is not None and staging_dir.is_dir()

    done = pglogical(tmp_path, "drop", *args, "--yes")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "batches": 2, "slot": "shop_slot", "slot_dropped": True, "staging": staging_dir.as_uri(),
        "staging_removed": True}
    assert publisher_hook.get_slot("shop_slot") is None and not staging_dir.exists()
    assert (warehouse_table / "metadata").is_dir() and any((warehouse_table / "data").iterdir())

    again = pglogical(tmp_path, "drop", *args, "--yes")
    assert again.returncode == 1 and "has no record" in again.stderr


def test_status_against_a_bad_port_names_the_connection_and_the_fix(tmp_path, monkeypatch):
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_pglogical.cli.definition import main
    from airflow_provider_pglogical.embedded.postgres import free_port
    from airflow_provider_pglogical.staging.pipeline_record import PipelineRecord, write_record

    staging = f"file://{tmp_path}/staging"
    write_record(ObjectStoragePath(staging), "shop", PipelineRecord(
        slot="shop_slot", plugin="pgoutput", database="shop", created_lsn="0/1", publications=["shop"]))
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_PGLOGICAL_BAD", f"postgres://lake:s3cret-word@127.0.0.1:{port}/shop")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    with pytest.raises(SystemExit) as exited:
        main(["status", "--conn-id", "pglogical_bad", "--staging-root", staging, "--pipeline", "shop"])
    message = str(exited.value.code)
    assert message.startswith(f"error: cannot reach the publisher of Airflow connection 'pglogical_bad' at "
                              f"127.0.0.1:{port}: ")
    assert "Connection refused" in message and "s3cret-word" not in message
    assert message.endswith("Fix: check that connection's host, port and credentials (airflow connections get "
                            "pglogical_bad) and that PostgreSQL accepts connections there")
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
