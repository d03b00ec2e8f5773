"""The initial copy as Spark tasks on a standalone cluster with two workers: every executor imports
the exported snapshot, the batch equals the source's published projection at the snapshot and a
one-worker copy of it, the password stays out of every command line and log, and a failed unit
commits nothing."""

from __future__ import annotations

import json
import logging
import os
from decimal import Decimal

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture import snapshot
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators.spark_copy import SparkCopy
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from tests.integration.sync_helpers import staged_rows
from tests.support.spark_cluster import standalone_cluster

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE orders(id int PRIMARY KEY, region text NOT NULL, total numeric(10,2), note text);
INSERT INTO orders SELECT g, (ARRAY['EU','US','APAC'])[1 + g % 3], g * 1.25, repeat('x', g % 50)
  FROM generate_series(1, 6000) g;
CREATE TABLE events(kind text, n int);  -- keyless: a multiset
ALTER TABLE events REPLICA IDENTITY FULL;
INSERT INTO events SELECT (ARRAY['click','view'])[1 + g % 2], g % 7 FROM generate_series(1, 5000) g;
"""
PROJECTION = {
    "orders": "SELECT id, region, total FROM orders WHERE id % 4 <> 0",
    "events": "SELECT kind, n FROM events",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two workers of one core each; the Airflow connection ``spark_copy_cluster`` points at them."""
    directory = tmp_path_factory.mktemp("spark-cluster")
    with standalone_cluster(directory, workers=2, cores=1, memory="1g") as (port, _env):
        os.environ["AIRFLOW_CONN_SPARK_COPY_CLUSTER"] = json.dumps(
            {"conn_type": "spark", "host": "spark://127.0.0.1", "port": port})
        try:
            yield directory
        finally:
            os.environ.pop("AIRFLOW_CONN_SPARK_COPY_CLUSTER", None)


@pytest.fixture(autouse=True)
def small_work_units(monkeypatch):
    monkeypatch.setattr(snapshot, "MIN_BLOCKS_PER_UNIT", 4)  # several ctid ranges per table


def spark_copy() -> SparkCopy:
    return SparkCopy(conn_id="spark_copy_cluster", conf={"spark.ui.enabled": "false", "spark.executor.cores": "1"},
                     env_vars={"SPARK_LOCAL_IP": "127.0.0.1"})


def publish(publisher, publisher_hook) -> None:
    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [
        PublishedTable("orders", columns=["id", "region", "total"], where="id % 4 <> 0"), PublishedTable("events")])


def test_copy_on_two_workers_equals_the_snapshot_and_a_one_worker_copy(publisher, publisher_hook, tmp_path, cluster):
    publish(publisher, publisher_hook)
    before = {name: sorted(publisher.query(query)) for name, query in PROJECTION.items()}
    root = ObjectStoragePath((tmp_path / "spark").as_uri())
    on_spark = spark_copy().copier(publisher_hook.connect_kwargs(), root, 2)
    units = []

    def copier(plan, writer, snapshot_name, report):
        units.extend(plan.units)
        # committed after the snapshot was exported: no executor may see it
        publisher.execute("DELETE FROM orders WHERE id <= 100; INSERT INTO events VALUES ('late', 1);"
                          "UPDATE orders SET total = 0 WHERE id > 5000")
        return on_spark(plan, writer, snapshot_name, report)

    run_initial_sync(publisher_hook, slot="s_spark", publications=["p"], root=root, pipeline="p", parallelism=2,
                     copier=copier)
    assert len({u.table.name for u in units}) == 2 and len(units) > 2  # both tables, split into ranges
    staged = staged_rows(root, "p")
    assert staged == before
    assert staged["events"].count(("click", 1)) > 1  # the multiset kept its duplicates
    assert staged["orders"][0] == (1, "US", Decimal("1.25"))
    # one worker, the same snapshot position's data (nothing changed since the changes above: the
    # staged batch equals the source before them, the pull holds them)
    manifest = read_manifest(root, "p", committed_batches(root, "p")[0][0])
    assert sorted(f["path"] for f in manifest.tables["public.orders"].files) == \
        [f["path"] for f in manifest.tables["public.orders"].files]
    assert manifest.tables["public.orders"].rows == len(before["orders"])
    pulled = run_pull(publisher_hook, slot="s_spark", publications=["p"], root=root, pipeline="p")
    assert pulled["changes"] > 0
    local = ObjectStoragePath((tmp_path / "local").as_uri())
    publisher.execute("DELETE FROM events WHERE kind = 'late'; UPDATE orders SET total = id * 1.25 WHERE id > 5000;"
                      "INSERT INTO orders SELECT g, (ARRAY['EU','US','APAC'])[1 + g % 3], g * 1.25, repeat('x', g % 50)"
                      "  FROM generate_series(1, 100) g")
    run_initial_sync(publisher_hook, slot="s_local", publications=["p"], root=local, pipeline="p", parallelism=1)
    assert staged_rows(local, "p") == staged


def test_operator_keeps_the_password_out_of_logs_and_a_failed_unit_commits_nothing(
        publisher, publisher_hook, tmp_path, cluster, caplog):
    publish(publisher, publisher_hook)
    publisher.execute("UPDATE orders SET total = 'NaN' WHERE id = 5999")  # no Iceberg decimal holds it
    password = publisher_hook.connect_kwargs()["password"]
    operator = PgInitialSyncOperator(task_id="snapshot", slot="s_fail", publications=["p"],
                                     staging_root=(tmp_path / "staging").as_uri(), pipeline="p",
                                     postgres_conn_id=publisher.conn_id, parallelism=2, copy_on_spark=spark_copy())
    caplog.set_level(logging.INFO)
    with pytest.raises(Exception, match=r"(?s)snapshot copy on Spark failed in public\.orders.*NaN.*type_overrides"):
        operator.execute(context={})
    root = tmp_path / "staging" / "p"
    assert not [p for p in root.iterdir() if p.name.endswith("-snapshot")]  # no batch, committed or not
    assert not list((root / "_results").iterdir())  # plan and result removed
    assert not publisher.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = 's_fail'")
    # the rerun with the fix is clean, and reports progress per unit
    caplog.clear()
    operator.type_overrides = {"public.orders.total": "string"}
    result = operator.execute(context={})
    assert result["tables"] == {"public.orders": 4500, "public.events": 5000}
    assert "PGLOGICAL_COPY public.orders:" in caplog.text and "rows/s" in caplog.text
    logged = caplog.text + "".join(p.read_text(errors="replace") for p in cluster.rglob("*") if p.is_file())
    assert "Spark-Submit cmd" in caplog.text and password not in logged
