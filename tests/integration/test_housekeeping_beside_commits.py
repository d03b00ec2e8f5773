"""Housekeeping beside another writer's commits: what it expires is what it reports (issue 35).

The maintenance job's session keeps each Iceberg table it loaded (Spark's catalog cache, on by
default); an apply in another process commits to the same tables meanwhile. Iceberg's
``expire_snapshots`` commits from the table's latest metadata but, started from a stale copy,
counted and cleaned only the snapshots that copy knew: the snapshots committed since were expired
silently and their files left on storage. Here the other writer is a second catalog of the same
session with its cache off, so the commits land exactly between two runs of the job's steps.
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping
from airflow_provider_pglogical.spark.jobs import maintenance
from tests.support.spark_jobs import applying_session

pytestmark = pytest.mark.spark


def manifest_lists(table_dir) -> set[str]:
    return {path.name for path in (table_dir / "metadata").glob("snap-*.avro")}


@pytest.fixture
def spark(tmp_path):
    """The job's session (Spark's catalog cache on, as in the maintenance job) over ``tmp_path``;
    stopped after the test, so no later test of this worker finds its catalogs."""
    session = applying_session(tmp_path / "warehouse", "test-housekeeping-beside-commits")
    yield session
    session.stop()


def test_expiry_after_another_writers_commits_reports_and_removes_every_snapshot_it_expired(spark, tmp_path):
    warehouse = tmp_path / "warehouse"
    # the other writer: the same warehouse through a catalog that never caches a table
    for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "hadoop",
                       ".warehouse": warehouse.as_uri(), ".cache-enabled": "false"}.items():
        spark.conf.set(f"spark.sql.catalog.writer{key}", value)
    spark.sql("CREATE TABLE lake.hk.t (id int) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql("INSERT INTO lake.hk.t VALUES (1)")
    table_dir = warehouse / "hk" / "t"
    first = manifest_lists(table_dir)

    # the job's first steps load the table into its catalog's cache (nothing to compact or expire yet)
    maintenance.run(spark, "lake", "hk", ["t"], Housekeeping(expire_snapshots=False, remove_orphan_files=False))
    # an apply commits twice meanwhile
    spark.sql("INSERT INTO writer.hk.t VALUES (2)")
    spark.sql("INSERT INTO writer.hk.t VALUES (3)")
    second_and_third = manifest_lists(table_dir) - first
    assert len(first) == 1 and len(second_and_third) == 2, (first, second_and_third)

    # the job's expiry keeps the newest snapshot only: the first and the second go, both reported
    expire_only = Housekeeping(compact_data_files=False, compact_delete_files=False, rewrite_manifests=False,
                               older_than_hours=0, retain_last=1, remove_orphan_files=False)
    done = maintenance.run(spark, "lake", "hk", ["t"], expire_only)
    report = done["tables"]["t"]["expire_snapshots"]
    left = manifest_lists(table_dir)
    assert len(left) == 1 and left < second_and_third, (first, second_and_third, left)
    assert report["deleted_manifest_lists_count"] == 2, report
    assert sorted(r.id for r in spark.table("writer.hk.t").collect()) == [1, 2, 3]


def test_housekeeping_beside_a_running_apply_window_leaves_the_lakehouse_equal_to_the_source(
        publisher, publisher_hook, tmp_path):
    """Issue 51: the streaming pipeline's housekeeping runs in a DAG of its own, beside the windows
    (dags/pglogical_lakehouse_housekeeping.py). Here the maintenance job runs again and again, in a
    session of its own (its catalog caching tables, as the job's does), with every step on and the
    most eager settings (compaction of two files, expiry of every snapshot but the newest), while
    a pull window and an apply window commit a writer's changes in rounds, until the window ends. The window ends without
    error (a round that met a housekeeping commit is applied again), and the lakehouse equals the
    source: read by Spark, and by the witness that reads the source by row hashes in PostgreSQL."""
    import json
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from airflow_provider_pglogical.capture import source_projection
    from airflow_provider_pglogical.embedded.postgres import wait_until
    from airflow_provider_pglogical.verification.witness import verify_tables
    from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
    from airflow_provider_pglogical.spark.jobs import apply_changes, verify_tables as verify_job
    from airflow_provider_pglogical.lakehouse.staging_roots import storage_path
    from airflow_provider_pglogical.ui.history import read_history
    from tests.integration.test_one_apply import Lake
    from tests.integration.test_window_handover import Writer
    from tests.support.spark_jobs import reading_session

    warehouse = tmp_path / "warehouse"
    spark = reading_session(warehouse, "test-housekeeping-beside-a-window")
    apply_changes.tune_session(spark)
    try:
        lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "beside", spark)
        housekeeping = spark.newSession()  # its own catalogs, caching tables as the maintenance job's do
        housekeeping.conf.set("spark.sql.catalog.lake.cache-enabled", "true")
        eager = Housekeeping(min_input_files=2, older_than_hours=0, retain_last=1, orphan_older_than_hours=24)
        pull = PgSlotPullOperator(task_id="pull_window", slot="s1", publications=["p"], pipeline="p",
                                  staging_root=lake.root.as_uri(), postgres_conn_id=publisher.conn_id,
                                  keep_running=25, poll_interval=0.5)
        writer, reports, rounds_during = Writer(publisher), [], []

        def rounds() -> int:
            return sum(1 for entry in read_history(lake.storage, "p", "apply") if "round" in entry)

        def keep_housekeeping(stop: threading.Event) -> None:
            while not stop.is_set():
                before = rounds()
                reports.append(maintenance.run(housekeeping, "lake", "beside", None, eager))
                rounds_during.append(rounds() - before)
                # paced by the window, as hourly housekeeping is: the next run starts once a round
                # has committed since this one, so the two keep meeting without one starving the
                # other (unpaced, on a slow machine every round could meet a compaction)
                while not stop.is_set() and rounds() == before + rounds_during[-1]:
                    stop.wait(0.2)

        stop = threading.Event()
        with ThreadPoolExecutor(max_workers=3) as pool:
            try:
                window = pool.submit(lake.run_in_process, keep_running=40, poll_interval=0.25)
                wait_until(lambda: rounds() or window.done(), timeout=300, interval=0.2,
                           message="the window's first round")
                pulling = pool.submit(pull.execute, {})
                writer.start()
                keeping = pool.submit(keep_housekeeping, stop)
                writing = time.monotonic()  # the writer stops before the pull window ends: every commit is pulled
                wait_until(lambda: time.monotonic() > writing + 18 or keeping.done() or window.done(), timeout=60,
                           interval=0.5, message="the writer's time")
                writer.done.set()
                writer.join(timeout=60)
                pulling.result(timeout=120)
                applied = window.result(timeout=300)  # its last listing comes after the pull window's last pull
            finally:
                # whatever failed above, the loop and the writer end, so the pool's exit cannot wait forever
                stop.set()
                writer.done.set()
            keeping.result(timeout=300)
        started = time.monotonic()
        assert lake.lake() == lake.source()
        tables = source_projection.source_tables(publisher_hook.published_tables(["p"]), "lake", "beside")
        verified = verify_tables(publisher_hook.connect_kwargs(), tables, lake.storage, "p",
                                 lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text())))
        assert verified["equal"], verified["summary"]
        compacted = sum(report["tables"][t]["rewrite_data_files"].get("rewritten_data_files_count", 0)
                        for report in reports for t in report["tables"])
        expired = sum(report["tables"][t]["expire_snapshots"].get("deleted_manifest_lists_count", 0)
                      for report in reports for t in report["tables"])
        print(f"housekeeping beside a window: {len(reports)} runs, {compacted} data files compacted, {expired} "
              f"snapshots expired, window rounds during each run {rounds_during}, conflicts met by the window "
              f"{applied['window']['conflicts']}; verified in {time.monotonic() - started:.1f} s")
        # the housekeeping did work while the window committed rounds
        assert compacted > 0 and expired > 0 and sum(rounds_during) > 0, (reports, rounds_during)
    finally:
        spark.stop()
