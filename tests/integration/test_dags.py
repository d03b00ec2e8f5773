"""The example DAGs, run with `airflow dags test` against real PostgreSQL, Spark local and Iceberg."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pendulum
import pytest

from airflow_provider_pglogical.embedded import demo
from airflow_provider_pglogical.embedded.postgres import wait_until
from tests.support.statsd import StatsdListener

DAGS = Path(demo.DAGS)


def test_dagbag_loads_every_example_dag_without_errors(monkeypatch):
    monkeypatch.syspath_prepend(str(DAGS))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["pglogical_backfill", "pglogical_lakehouse_apply", "pglogical_lakehouse_housekeeping",
                                   "pglogical_lakehouse_pull",
                                   "pglogical_lakehouse_stream", "pglogical_lakehouse_sync",
                                   "pglogical_orders_downstream", "pglogical_pg_to_pg"]
    sync = bag.dags["pglogical_lakehouse_sync"]
    assert [t.task_id for t in sync.topological_sort()] == ["publication", "initial_sync", "slot_lag", "pull", "apply",
                                                            "maintenance_due", "maintenance"]


def test_stream_dag_overlaps_its_runs_windows_and_its_housekeeping_runs_in_a_dag_of_its_own(monkeypatch):
    monkeypatch.syspath_prepend(str(DAGS))
    from airflow.dag_processing.dagbag import DagBag

    import pglogical_settings as settings

    stream = DagBag(dag_folder=str(DAGS / "pglogical_lakehouse_stream.py")).dags["pglogical_lakehouse_stream"]
    # a run every window, two at once: the next run's windows start before the previous ones end
    assert type(stream.timetable).__name__ == "DeltaTriggerTimetable" and stream.max_active_runs == 2
    assert stream.timetable.delta == settings.STREAM_WINDOW
    assert stream.timetable.active_runs_limit is None  # @continuous would hold it to one run
    pull, apply = stream.get_task("pull_window"), stream.get_task("apply_window")
    # the setup tasks before the pull only; the apply's JVM starts beside them; no housekeeping in the run
    assert pull.upstream_task_ids == {"initial_sync"} and stream.get_task("initial_sync").upstream_task_ids == {
        "publication"}
    assert apply.upstream_task_ids == set() and apply.downstream_task_ids == set()
    assert sorted(stream.task_ids) == ["apply_window", "initial_sync", "publication", "pull_window"]
    # each window lasts the run's period plus the lead: two runs overlap by the lead
    assert pull.keep_running == apply.keep_running == settings.STREAM_WINDOW + settings.STREAM_LEAD
    assert settings.STREAM_LEAD.total_seconds() == 60 and settings.STREAM_WINDOW.total_seconds() == 600
    assert pull.poll_interval == settings.STREAM_PULL_INTERVAL and apply.poll_interval == settings.STREAM_POLL_INTERVAL
    assert pull.max_unapplied_batches == settings.STREAM_MAX_UNAPPLIED  # paced to the apply
    options = apply.apply_options()
    assert options.keep_running == 660 and options.poll_interval == settings.STREAM_POLL_INTERVAL
    assert apply.staging_retention == settings.STREAM_RETENTION  # a batch per poll: kept for less than a week

    housekeeping = DagBag(dag_folder=str(DAGS / "pglogical_lakehouse_housekeeping.py")).dags[
        "pglogical_lakehouse_housekeeping"]
    maintenance = housekeeping.get_task("maintenance")
    assert housekeeping.task_ids == ["maintenance"] and housekeeping.max_active_runs == 1
    assert type(housekeeping.timetable).__name__ == "DeltaTriggerTimetable"
    assert housekeeping.timetable.delta == settings.STREAM_MAINTENANCE_EVERY
    assert apply.iceberg == maintenance.iceberg
    # a snapshot per round: an hour of them kept, housekeeping every hour (the metadata stays small)
    assert maintenance.housekeeping.older_than_hours == settings.STREAM_SNAPSHOT_HOURS == 1
    assert settings.STREAM_MAINTENANCE_EVERY.total_seconds() == 3600
    # orphans a day old at least: a round's files in flight beside it are never taken
    assert maintenance.housekeeping.orphan_older_than_hours >= 24


def test_events_dags_pull_on_a_clock_and_apply_when_a_batch_lands(monkeypatch):
    monkeypatch.syspath_prepend(str(DAGS))
    from airflow.dag_processing.dagbag import DagBag

    import pglogical_settings as settings
    from airflow_provider_pglogical.triggers.staged_batches import StagedBatchTrigger

    bag = DagBag(dag_folder=str(DAGS / "pglogical_lakehouse_events.py"))
    pull, apply = bag.dags["pglogical_lakehouse_pull"], bag.dags["pglogical_lakehouse_apply"]
    assert [t.task_id for t in pull.topological_sort()] == ["publication", "initial_sync", "slot_lag", "pull"]
    assert pull.get_task("slot_lag").pipeline == settings.PIPELINE  # the sensor exports the slot's metrics
    assert [t.task_id for t in apply.topological_sort()] == ["apply"] and apply.max_active_runs == 1
    # the apply DAG runs on the staged-batches asset, watched in the triggerer by a listing of staging
    [asset] = apply.timetable.asset_condition.objects
    [watcher] = asset.watchers
    assert isinstance(watcher.trigger, StagedBatchTrigger)
    assert watcher.trigger.serialize()[1] == {"staging_root": settings.STAGING, "pipeline": settings.PIPELINE,
                                              "poll_interval": settings.WATCH_INTERVAL}


def test_sync_dag_runs_the_housekeeping_after_the_apply_every_six_hours(monkeypatch):
    monkeypatch.syspath_prepend(str(DAGS))
    from airflow.dag_processing.dagbag import DagBag

    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import TimeRestriction

    from airflow_provider_pglogical.operators.iceberg_maintenance import IcebergMaintenanceOperator

    sync = DagBag(dag_folder=str(DAGS / "pglogical_lakehouse_sync.py")).dags["pglogical_lakehouse_sync"]
    gate, maintenance = sync.get_task("maintenance_due"), sync.get_task("maintenance")
    assert isinstance(maintenance, IcebergMaintenanceOperator)
    assert maintenance.upstream_task_ids == {"maintenance_due"} and gate.upstream_task_ids == {"apply"}
    assert maintenance.iceberg == sync.get_task("apply").iceberg  # the same lakehouse
    # the gate runs after an apply that succeeded or was skipped (idle), not after a failed one
    assert gate.trigger_rule == "none_failed"
    assert sync.max_active_runs == 1  # the housekeeping of one run never overlaps the next run's apply
    # a day of scheduled runs, as the scheduler plans them: each run's data interval is the tick
    # before it, and the gate lets one run in every 6 hours through
    timetable, last, decided = coerce_to_core_timetable(sync.timetable), None, {}
    restriction = TimeRestriction(earliest=pendulum.datetime(2026, 1, 1, tz="UTC"), latest=None, catchup=True)
    for _ in range(24 * 6):
        info = timetable.next_dagrun_info(last_automated_data_interval=last, restriction=restriction)
        last = info.data_interval
        assert last.end - last.start == pendulum.duration(minutes=10)
        decided[info.run_after.strftime("%H:%M")] = gate.python_callable(data_interval_start=last.start,
                                                                         data_interval_end=last.end)
    assert len(decided) == 144
    assert [at for at, due in decided.items() if due] == ["00:00", "06:00", "12:00", "18:00"]
    assert gate.python_callable() is False  # a manual run without a data interval skips it


def _run(env: dict, *args: str, expect_ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(Path(sys.executable).parent / "airflow"), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if expect_ok and proc.returncode != 0:
        pytest.fail(f"airflow {' '.join(args)} failed:\n{proc.stdout[-6000:]}")
    return proc


def _committed_batches(env: dict) -> list[str]:
    """The pipeline's committed batch names under the demo's staging root."""
    import importlib.util

    from airflow.sdk import ObjectStoragePath

    from airflow_provider_pglogical.staging.layout import committed_batches

    spec = importlib.util.spec_from_file_location("pglogical_settings", DAGS / "pglogical_settings.py")
    settings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(settings)
    return [name for name, *_ in committed_batches(ObjectStoragePath(env["PGLOGICAL_STAGING"]), settings.PIPELINE)]


def _task_states(env: dict, dag_id: str, logical_date: str) -> dict[str, str]:
    """Each task's state in the DAG run, from Airflow's own metadata database (the demo's SQLite
    file, read directly: ``airflow tasks states-for-dag-run`` costs an Airflow start per call)."""
    import sqlite3

    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        rows = db.execute(
            "SELECT ti.task_id, ti.state FROM task_instance ti JOIN dag_run r ON r.dag_id = ti.dag_id AND "
            "r.run_id = ti.run_id WHERE r.dag_id = ? AND datetime(r.logical_date) = datetime(?)",
            (dag_id, logical_date)).fetchall()
    assert rows, f"no DAG run of {dag_id} at {logical_date}"
    return dict(rows)


def assert_pull_and_apply_metrics(statsd: StatsdListener, env: dict) -> None:
    """The metrics of the run's pull and apply are the figures their history (the view's) recorded."""
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_pglogical.ui.history import read_history

    root, pipeline = ObjectStoragePath(env["PGLOGICAL_STAGING"]), "shop"
    pull, apply = read_history(root, pipeline, "pull")[-1], read_history(root, pipeline, "apply")[-1]
    received = {m.name for m in statsd.received() if m.name.startswith("airflow.pglogical.")}  # and Airflow's own

    def newest(name: str, **tags: str) -> float:
        found = statsd.named(f"airflow.pglogical.{name}", pipeline=pipeline, **tags)
        assert found, f"no {name} {tags} among {sorted(received)}"
        return found[-1].value

    assert newest("pull.rows") == pull["rows"] > 0 and newest("apply.rows") == apply["rows"] > 0
    assert newest("apply.duration") == pytest.approx(apply["seconds"] * 1000, abs=1)
    assert newest("slot.lag_bytes") == pull["lag_bytes"] and newest("slot.at_risk") == 0
    assert newest("pending.batches") == newest("pending.rows") == 0, "the apply applied every batch"
    assert apply["tables"], apply
    for table, seconds in apply["tables"].items():  # freshness per table: source commit to Iceberg commit
        assert newest("table.freshness_seconds", table=table) == seconds > 0


@pytest.fixture
def airflow_home(tmp_path, publisher):
    rng = random.Random(7)
    demo.load(publisher.cluster, publisher.name, rng)
    env = demo.airflow_env(tmp_path, publisher.cluster, publisher.name)
    _run(env, "db", "migrate")
    return env, rng


@pytest.mark.spark
def test_lakehouse_sync_with_an_injected_apply_failure_then_the_next_run_verifies(airflow_home, publisher, monkeypatch):
    """The first run fails in its apply; the next run applies what it staged. (The demo, which CI
    runs after the suite, takes the happy path through every DAG and the backfill; this test pays
    Airflow's ``dags test`` only twice.)"""
    env, rng = airflow_home
    # Injected failure: Spark cannot run for this run (a YARN master without YARN's configuration:
    # spark-submit gives up at once, where an unreachable standalone master costs a minute of
    # registration retries), so the apply fails after the initial sync staged the snapshot and
    # created the slot. Without retries: Airflow's retries are not what this test is about.
    broken = {**{k: v for k, v in env.items() if k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")},
              "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "yarn"}),
              "PGLOGICAL_TASK_RETRIES": "0"}
    failed = _run(broken, "dags", "test", "pglogical_lakehouse_sync", "2026-01-01T05:50:00+00:00", expect_ok=False)
    assert failed.returncode != 0
    states = _task_states(env, "pglogical_lakehouse_sync", "2026-01-01T05:50:00+00:00")
    assert states["initial_sync"] == states["pull"] == "success" and states["apply"] == "failed", states
    assert states["maintenance_due"] == states["maintenance"] == "upstream_failed", states
    # it failed for the injected reason: spark-submit could not use the master, and said so
    assert re.search(r"Cannot execute: spark-submit --master yarn .*Error code is: 1", failed.stdout), failed.stdout[-4000:]
    # what the initial sync staged stays committed for the next apply
    assert _committed_batches(env), "the failed run's snapshot batch is gone"
    # The retry (next run) applies what the failed run staged; nothing is lost or doubled. Its
    # interval (05:50, 06:00] holds a 6-hour boundary: it runs the housekeeping after the apply.
    demo.workload(publisher.cluster, publisher.name, rng, 1)
    demo.workload(publisher.cluster, publisher.name, rng, 2)
    # Airflow's StatsD client sends to a socket of the test (docs/metrics.md): the pull's and the apply's metrics
    with StatsdListener() as statsd:
        _run({**env, **statsd.airflow_env()}, "dags", "test", "pglogical_lakehouse_sync", "2026-01-01T06:00:00+00:00")
    states = _task_states(env, "pglogical_lakehouse_sync", "2026-01-01T06:00:00+00:00")
    assert states["apply"] == states["maintenance_due"] == states["maintenance"] == "success", states
    assert_pull_and_apply_metrics(statsd, env)
    for key, value in env.items():
        if key.startswith(("AIRFLOW_CONN", "PGLOGICAL", "SPARK")):
            monkeypatch.setenv(key, value)
    result = demo.verify(env)
    assert result["equal"], result["summary"]
    assert {t["table"] for t in result["tables"]} == {"public.customers", "public.orders", "public.products", "public.events"}
    assert all(t["source_rows"] > 0 for t in result["tables"])


def test_pg_to_pg_dag_waits_until_every_table_is_ready(publisher, subscriber, subscriber_hook, tmp_path):
    rng = random.Random(3)
    demo.load(publisher.cluster, publisher.name, rng)
    subscriber.execute(demo.SCHEMA)
    env = demo.airflow_env(tmp_path, publisher.cluster, publisher.name)
    env["AIRFLOW_CONN_PGLOGICAL_TARGET"] = subscriber.cluster.connection_uri(subscriber.name)
    _run(env, "db", "migrate")
    _run(env, "dags", "test", "pglogical_pg_to_pg", "2026-01-01T00:00:00+00:00")
    status = subscriber_hook.subscription_status("shop_replica")
    assert status.ready and len(status.tables) == 4
    assert subscriber.query("SELECT count(*) FROM customers") == publisher.query("SELECT count(*) FROM customers")
    assert subscriber.query("SELECT count(*) FROM orders") == publisher.query(
        "SELECT count(*) FROM orders WHERE region = 'EU'")
    # The column list holds back internal_note.
    assert subscriber.query("SELECT count(*) FROM orders WHERE internal_note IS NOT NULL") == [(0,)]
    publisher.execute("INSERT INTO customers(id, name) VALUES (9999, 'late')")
    wait_until(lambda: subscriber.query("SELECT name FROM customers WHERE id = 9999") == [("late",)], timeout=30,
               message="the late insert to replicate")
