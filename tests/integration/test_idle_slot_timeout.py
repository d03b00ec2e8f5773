"""PostgreSQL 18's ``idle_replication_slot_timeout``: a slot nobody consumed for that long is invalidated at
the next checkpoint. The pipeline says so in those words, not as WAL removal: in SlotLostError, in
PgSlotLagSensor and in ``airflow pglogical status``; the publisher check warns of a short timeout first.
"""

from __future__ import annotations

import json

import pendulum
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until
from airflow_provider_pglogical.exceptions import SlotError, SlotLostError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators.publication import PgCheckPublisherOperator
from airflow_provider_pglogical.sensors.pglogical import PgSlotLagSensor
from tests.integration.test_cli import pglogical


def files(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def test_an_idle_timeout_is_told_apart_from_removed_wal(tmp_path, monkeypatch):
    # The unit is seconds on 18: one second makes the next checkpoint invalidate the idle slot.
    with LocalPostgres(name="idle", version=18) as cluster:
        monkeypatch.setenv("AIRFLOW_CONN_IDLE", cluster.connection_uri())
        cluster.execute("CREATE TABLE t(id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 10)")
        hook = PgLogicalHook(postgres_conn_id="idle")
        hook.create_publication("p", [PublishedTable("t")])
        assert hook.check_publisher(["p"]) == []
        root = tmp_path / "staging"
        common = dict(slot="s1", publications=["p"], root=ObjectStoragePath(root.as_uri()), pipeline="p")
        run_initial_sync(hook, **common)

        # two days: fine for a DAG pulling every 10 minutes, one late run from a resync for a daily one
        cluster.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '2d'")
        cluster.execute("SELECT pg_reload_conf()")
        wait_until(lambda: cluster.query("SHOW idle_replication_slot_timeout")[0][0] == "2d", message="the reload")
        start = pendulum.datetime(2026, 1, 1, tz="UTC")
        check = PgCheckPublisherOperator(task_id="check", publications=["p"], postgres_conn_id="idle")
        assert check.execute({"data_interval_start": start, "data_interval_end": start.add(minutes=10)}) == []
        (daily,) = check.execute({"data_interval_start": start, "data_interval_end": start.add(days=1)})
        assert "under 3 of the DAG's pull intervals (1 day each)" in daily and "'3d'" in daily, daily

        # an hour: the slot-lag sensor of a daily DAG warns (with the fix) while the slot is still valid,
        # since it will idle a day until the next run's pull; a DAG pulling every 10 minutes is safe
        cluster.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '1h'")
        cluster.execute("SELECT pg_reload_conf()")
        wait_until(lambda: cluster.query("SHOW idle_replication_slot_timeout")[0][0] == "1h", message="the reload")
        sensor = PgSlotLagSensor(task_id="lag", slot="s1", postgres_conn_id="idle")
        (warning,) = sensor.poke({"data_interval_start": start, "data_interval_end": start.add(days=1)}).xcom_value[
            "warnings"]
        assert "reaches idle_replication_slot_timeout (3600 s) before the next scheduled pull (in 86400 s)" in warning
        assert "ALTER SYSTEM SET idle_replication_slot_timeout" in warning and not hook.get_slot("s1").invalidated
        assert sensor.poke({"data_interval_start": start, "data_interval_end": start.add(minutes=10)}).xcom_value[
            "warnings"] == []

        cluster.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '1s'")
        cluster.execute("SELECT pg_reload_conf()")
        wait_until(lambda: cluster.query("SHOW idle_replication_slot_timeout")[0][0] == "1s", message="the reload")
        warnings = hook.check_publisher(["p"])
        assert len(warnings) == 1 and "idle_replication_slot_timeout is 1s" in warnings[0], warnings

        def invalidated() -> bool:
            cluster.execute("CHECKPOINT")
            return hook.get_slot("s1").invalidated

        wait_until(invalidated, timeout=30, interval=0.5, message="the idle slot to be invalidated")
        assert hook.get_slot("s1").invalidation_reason == "idle_timeout"

        before = files(root)
        with pytest.raises(SlotLostError) as lost:
            run_pull(hook, **common)
        message = str(lost.value)
        assert "slot 's1' of pipeline 'p' was invalidated (invalidation_reason = idle_timeout" in message
        assert "idle_replication_slot_timeout" in message and "max_slot_wal_keep_size" not in message
        assert files(root) == before and hook.get_slot("s1").invalidation_reason == "idle_timeout"

        with pytest.raises(SlotError, match="idle_replication_slot_timeout") as sensed:
            PgSlotLagSensor(task_id="lag", slot="s1", postgres_conn_id="idle").poke({})
        assert "max_slot_wal_keep_size" not in str(sensed.value)

        args = ["--conn-id", "idle", "--staging-root", root.as_uri(), "--pipeline", "p"]
        proc = pglogical(tmp_path, "status", *args, "-o", "json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        status = json.loads(proc.stdout.strip().splitlines()[-1])
        assert status["invalidation_reason"] == "idle_timeout" and "idle_timeout" in status["state"]
