"""Failover slots (PostgreSQL 17+): the pipeline continues on a promoted standby, nothing lost or doubled.

A primary and its physical standby on 18 (the newest server here, always installed). The pipeline
``p`` has a failover slot that the standby synchronizes; the pipeline ``q`` has an ordinary slot.
The Airflow connection is one multi-host connection (both hosts, ``target_session_attrs =
read-write``): libpq picks the primary, and after the promotion, unchanged, the new primary. ``p``
pulls on and its lakehouse equals the new primary; ``q`` stops with SlotLostError and stages nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath
from psycopg2 import sql

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until
from airflow_provider_pglogical.exceptions import PublisherCheckError, SlotLostError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB
from tests.support.spark_jobs import apply_args, reading_session, run_job, submit_command

SETUP = """
CREATE TABLE orders(id int PRIMARY KEY, region text NOT NULL, n int);
CREATE UNIQUE INDEX orders_id_region ON orders(id, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_id_region;
INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'EU' ELSE 'US' END, g FROM generate_series(1, 200) g;
"""


def files(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def alter_system(cluster: LocalPostgres, setting: str, value: str) -> None:
    """ALTER SYSTEM cannot run in the implicit transaction of a multi-statement query: one at a time."""
    conn = cluster.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.SQL("ALTER SYSTEM SET {} = %s").format(sql.Identifier(setting)), (value,))
            cursor.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()


def multi_host_connection(primary: LocalPostgres, standby: LocalPostgres) -> str:
    """One Airflow connection to whichever of the two servers accepts writes (libpq tries each)."""
    return json.dumps({
        "conn_type": "postgres", "host": f"{primary.host},{standby.host}", "login": primary.superuser,
        "password": primary.password, "schema": "postgres",
        "extra": {"port": f"{primary.port},{standby.port}", "target_session_attrs": "read-write"},
    })


def test_failover_is_refused_below_17_before_anything_is_created(publisher, publisher_hook, tmp_path):
    """The session publisher is 15: failover=True fails with the fix, no slot, no staging."""
    publisher.execute("CREATE TABLE fo_refused(id int PRIMARY KEY)")
    publisher_hook.create_publication("fo_refused", [PublishedTable("fo_refused")])
    root = tmp_path / "staging"
    with pytest.raises(PublisherCheckError) as raised:
        run_initial_sync(publisher_hook, slot="fo_refused", publications=["fo_refused"],
                         root=ObjectStoragePath(root.as_uri()), pipeline="p", failover=True)
    assert "failover=True needs PostgreSQL 17 or later" in str(raised.value)
    assert publisher_hook.get_slot("fo_refused") is None and files(root) == []


@pytest.mark.spark
def test_a_failover_slot_carries_the_pipeline_onto_the_promoted_standby(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    primary = LocalPostgres(name="primary", version=18).start()
    standby = None
    try:
        primary.execute(SETUP)
        standby = primary.start_standby("standby", "standby_1")
        monkeypatch.setenv("AIRFLOW_CONN_PROD", multi_host_connection(primary, standby))
        monkeypatch.setenv("AIRFLOW_CONN_PROD_STANDBY", standby.connection_uri())
        hook = PgLogicalHook(postgres_conn_id="prod")
        assert hook.connect_kwargs()["port"] == f"{primary.port},{standby.port}"
        with hook.autocommit_cursor() as cursor:  # the primary: the standby does not accept writes
            cursor.execute("SELECT pg_is_in_recovery(), current_setting('port')::int")
            assert cursor.fetchone() == (False, primary.port)
        hook.create_publication("orders", [PublishedTable("orders", where="region = 'EU'")])
        failover = dict(slot="fo", publications=["orders"], root=storage, pipeline="p")
        plain = dict(slot="plain", publications=["orders"], root=storage, pipeline="q")

        # The preflight check names every missing setting, on both servers; the sync refuses to start.
        with pytest.raises(PublisherCheckError) as raised:
            hook.check_publisher(["orders"], failover=True, standby=PgLogicalHook(postgres_conn_id="prod_standby"))
        message = str(raised.value)
        for missing in ("synchronized_standby_slots is empty", "sync_replication_slots is off",
                        "hot_standby_feedback is off"):
            assert missing in message, message
        assert "primary_slot_name" not in message and "dbname" not in message and primary.password not in message
        with pytest.raises(PublisherCheckError, match="synchronized_standby_slots"):
            run_initial_sync(hook, **failover, failover=True)
        assert hook.get_slot("fo") is None and files(root) == []

        alter_system(primary, "synchronized_standby_slots", "standby_1")
        alter_system(standby, "hot_standby_feedback", "on")
        alter_system(standby, "sync_replication_slots", "on")
        wait_until(lambda: standby.query("SHOW sync_replication_slots")[0][0] == "on", message="the standby reload")
        assert hook.check_publisher(["orders"], failover=True,
                                    standby=PgLogicalHook(postgres_conn_id="prod_standby")) == []

        run_initial_sync(hook, **failover, failover=True)
        run_initial_sync(hook, **plain)
        assert hook.get_slot("fo").failover and not hook.get_slot("plain").failover

        primary.execute("UPDATE orders SET n = n + 1000 WHERE id <= 20; DELETE FROM orders WHERE id BETWEEN 21 AND 30;"
                        "INSERT INTO orders SELECT g, 'EU', g FROM generate_series(1001, 1010) g")
        pulled = run_pull(hook, **failover)
        assert pulled["changes"] == 10 + 5 + 10  # even ids only: the row filter
        run_pull(hook, **plain)

        # The standby's copy of the failover slot reaches the pipeline's position (its sync worker).
        # A synced slot needs a running-transactions record replayed on the standby, which the
        # primary otherwise logs every 15 s at most: log one at each look so a loaded machine waits
        # for the sync worker, not for that.
        confirmed = str(hook.get_slot("fo").confirmed_flush_lsn)

        def slot_synced() -> bool:
            primary.query("SELECT pg_log_standby_snapshot()::text")
            if standby.query("SELECT synced FROM pg_replication_slots WHERE slot_name = 'fo' AND NOT temporary "
                             "AND confirmed_flush_lsn >= %s::pg_lsn", params=(confirmed,)):
                return True
            # A copy the sync worker creates after the pulls reserves WAL from the standby's position
            # then, past the primary's slot: it stays temporary (dropped at promotion) until the
            # primary's slot moves beyond it, which a running pipeline's next pull does. Nothing new
            # was written, so this pull stages nothing; it only moves the slot on.
            assert run_pull(hook, **failover)["changes"] == 0
            return False

        # the sync worker naps up to 30 s between cycles; on a loaded machine (CI's two workers both
        # in Spark) one clean-clone run waited out 180 s
        wait_until(slot_synced, timeout=420, interval=1.0, message="the standby to sync slot fo")
        assert not standby.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'plain'")

        # Changes nobody pulled yet, replayed on the standby; then the primary is gone.
        primary.execute("UPDATE orders SET region = 'US' WHERE id BETWEEN 40 AND 50;"
                        "UPDATE orders SET n = -n WHERE id BETWEEN 60 AND 70; DELETE FROM orders WHERE id = 1002")
        flushed = primary.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]
        wait_until(lambda: standby.query("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", params=(flushed,))[0][0],
                   message="the standby to replay the primary's last changes")
        primary.stop()
        standby.promote()

        # The same connection, unchanged: libpq now finds the promoted standby.
        hook = PgLogicalHook(postgres_conn_id="prod")
        with hook.autocommit_cursor() as cursor:
            cursor.execute("SELECT current_setting('port')::int")
            assert cursor.fetchone() == (standby.port,)
        standby.execute("INSERT INTO orders SELECT g, 'EU', g FROM generate_series(2001, 2005) g;"
                        "UPDATE orders SET n = 0 WHERE id = 2")
        before = files(root / "q")
        with pytest.raises(SlotLostError) as lost:
            run_pull(hook, **plain)
        assert "replication slot 'plain' of pipeline 'q' no longer exists" in str(lost.value)
        assert "on_slot_lost='resync'" in str(lost.value) and files(root / "q") == before

        pulled = run_pull(hook, **failover)
        assert pulled["changes"] == 6 + 6 + 1 + 5 + 1  # region EU -> US leaves the filter: deletes
        assert run_pull(hook, **failover)["changes"] == 0

        command = submit_command(APPLY_JOB, apply_args(root.as_uri(), "p", namespace="fo"),
                                 IcebergConfig(warehouse=warehouse.as_uri(), namespace="fo"))
        code, output = run_job(command)
        assert code == 0, output[-5000:]
        source = sorted(standby.query("SELECT id, region, n FROM orders WHERE region = 'EU'"))
        assert len(source) == 100 - 5 - 6 + 9 + 5
        spark = reading_session(warehouse, "test-failover")
        try:
            lake = sorted(tuple(r) for r in spark.table("lake.fo.public__orders").select("id", "region", "n").collect())
        finally:
            spark.stop()
        assert lake == source  # nothing lost, nothing doubled
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()
