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
from airflow_provider_pglogical.operators.sync import PgBackfillOperator, PgInitialSyncOperator
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import staged_rows
from tests.support.spark_cluster import standalone_cluster

try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Task SDK 1.0 (Airflow 3.0)
    from airflow.exceptions import AirflowFailException

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


class SourceChangedAfterExport(SparkCopy):
    """Commits ``changes`` on the source after the snapshot was exported, before the executors copy."""

    def __init__(self, database, changes: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.database, self.changes, self.units = database, changes, []

    def copier(self, *args, **kwargs):
        run = super().copier(*args, **kwargs)

        def changed_then_run(plan, writer, snapshot_name, report):
            self.units.extend(plan.units)
            self.database.execute(self.changes)
            return run(plan, writer, snapshot_name, report)

        return changed_then_run


def logged_text(caplog, capfd, cluster) -> str:
    """The task's log (the Spark hook's lines reach stdout), and every file the cluster wrote."""
    out, err = capfd.readouterr()
    return caplog.text + out + err + "".join(p.read_text(errors="replace") for p in cluster.rglob("*") if p.is_file())


def sync_operator(publisher, root, slot: str, copy_on_spark: SparkCopy | None, **kwargs) -> PgInitialSyncOperator:
    return PgInitialSyncOperator(task_id="snapshot", slot=slot, publications=["p"], staging_root=root.as_uri(),
                                 pipeline="p", postgres_conn_id=publisher.conn_id, parallelism=2,
                                 copy_on_spark=copy_on_spark, **kwargs)


def test_copy_on_two_workers_equals_the_snapshot_and_a_one_worker_copy(
        publisher, publisher_hook, tmp_path, cluster, caplog, capfd):
    publish(publisher, publisher_hook)
    before = {name: sorted(publisher.query(query)) for name, query in PROJECTION.items()}
    changes = ("DELETE FROM orders WHERE id <= 100; INSERT INTO events VALUES ('late', 1);"
               "UPDATE orders SET total = 0 WHERE id > 5000")  # committed after the export: no executor sees them
    on_spark = SourceChangedAfterExport(publisher, changes, conn_id="spark_copy_cluster",
                                        conf={"spark.ui.enabled": "false", "spark.executor.cores": "1"},
                                        env_vars={"SPARK_LOCAL_IP": "127.0.0.1"})
    caplog.set_level(logging.INFO)
    root = tmp_path / "spark"
    result = sync_operator(publisher, root, "s_spark", on_spark).execute(context={})
    assert result["tables"] == {"public.orders": 4500, "public.events": 5000}
    assert len({u.table.name for u in on_spark.units}) == 2 and len(on_spark.units) > 2  # both tables, in ranges
    storage = ObjectStoragePath(root.as_uri())
    staged = staged_rows(storage, "p")
    assert staged == before
    assert staged["events"].count(("click", 1)) > 1  # the multiset kept its duplicates
    assert staged["orders"][0] == (1, "US", Decimal("1.25"))
    logged = logged_text(caplog, capfd, cluster)
    assert "PGLOGICAL_COPY public.orders:" in logged and "rows/s" in logged  # progress per finished unit
    assert "Spark-Submit cmd" in logged and publisher_hook.connect_kwargs()["password"] not in logged
    # the changes are the slot's first batch; undone, a one-worker copy stages the same rows
    pulled = run_pull(publisher_hook, slot="s_spark", publications=["p"], root=storage, pipeline="p")
    assert pulled["changes"] == 75 + 1 + 750  # the published rows the changes touched
    # a ranged backfill on Spark (its temporary slot's snapshot) stages exactly the range, filter applied
    backfill = PgBackfillOperator(task_id="backfill", tables=["public.orders"], publications=["p"], pipeline="p",
                                  key_range={"column": "id", "start": 50, "end": 3000}, staging_root=root.as_uri(),
                                  postgres_conn_id=publisher.conn_id, parallelism=2, copy_on_spark=spark_copy())
    assert backfill.execute(context={})["tables"] == {"public.orders": 2175}  # ids 101..2999: 1..100 were deleted
    assert staged_rows(storage, "p")["orders"] == sorted(publisher.query(
        "SELECT id, region, total FROM orders WHERE id % 4 <> 0 AND id >= 50 AND id < 3000"))
    applied_to_iceberg(publisher, root, tmp_path / "warehouse", len([u for u in on_spark.units if u.table.name == "orders"]))
    publisher.execute("DELETE FROM events WHERE kind = 'late'; UPDATE orders SET total = id * 1.25 WHERE id > 5000;"
                      "INSERT INTO orders SELECT g, (ARRAY['EU','US','APAC'])[1 + g % 3], g * 1.25, repeat('x', g % 50)"
                      "  FROM generate_series(1, 100) g")
    local = ObjectStoragePath((tmp_path / "local").as_uri())
    run_initial_sync(publisher_hook, slot="s_local", publications=["p"], root=local, pipeline="p", parallelism=1)
    assert staged_rows(local, "p") == staged


def applied_to_iceberg(publisher, root, warehouse, orders_units: int) -> None:
    """The Spark-copied snapshot, the changes after it and the Spark-copied ranged backfill, applied
    to Iceberg in this process: the keyed table's staged files (one per executor's unit) adopted by
    a link, the keyless one rewritten with its copies numbered; the lakehouse equals the source."""
    from collections import Counter

    from airflow_provider_pglogical.spark.jobs import apply_changes
    from tests.support.spark_jobs import applying_session

    spark = applying_session(warehouse, "test-spark-copy-apply")
    try:
        summary = apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "copied", retention_hours=None))
        kinds = [(step["table"], step["kind"], step["adopted_files"]) for step in summary["steps"]]
        assert ("public.orders", "snapshot", orders_units) in kinds and ("public.events", "snapshot", 0) in kinds
        adopted = list((warehouse / "copied" / "public__orders" / "data").glob("*-adopted.parquet"))
        assert len(adopted) == orders_units and all(path.stat().st_nlink == 2 for path in adopted)  # linked
        for name, columns in (("orders", "id, region, total"), ("events", "kind, n")):
            lake = Counter(tuple(row) for row in spark.sql(f"SELECT {columns} FROM lake.copied.public__{name}").collect())
            assert lake == Counter(publisher.query(PROJECTION[name])), name
    finally:
        spark.stop()


def test_a_failed_unit_commits_nothing_and_drops_the_slot(publisher, publisher_hook, tmp_path, cluster, caplog, capfd):
    publish(publisher, publisher_hook)
    publisher.execute("UPDATE orders SET total = 'NaN' WHERE id = 5999")  # no Iceberg decimal holds it
    caplog.set_level(logging.INFO)
    operator = sync_operator(publisher, tmp_path / "staging", "s_fail", spark_copy())
    with pytest.raises(AirflowFailException,
                       match=r"(?s)snapshot copy on Spark failed in public\.orders.*NaN.*type_overrides"):
        operator.execute(context={})
    root = tmp_path / "staging" / "p"
    assert not [p for p in root.iterdir() if p.name.endswith("-snapshot")]  # no batch, committed or not
    assert not list((root / "_results").iterdir())  # the plan and the result are removed
    assert not publisher.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = 's_fail'")
    assert publisher_hook.connect_kwargs()["password"] not in logged_text(caplog, capfd, cluster)
