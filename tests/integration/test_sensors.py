"""Sensors and their triggers against real clusters: healthy, busy, over limits, invalidated."""

from __future__ import annotations

import asyncio
import threading

import psycopg2.extras
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until
from airflow_provider_pglogical.exceptions import SlotError, SubscriptionError
from airflow_provider_pglogical.sensors.pglogical import PgSlotLagSensor, PgSubscriptionReadySensor
from airflow_provider_pglogical.triggers.pglogical import SlotHealthTrigger, SubscriptionReadyTrigger


def first_event(trigger):
    async def run():
        async for event in trigger.run():
            return event.payload
    return asyncio.run(asyncio.wait_for(run(), timeout=60))


def sensor(**kwargs) -> PgSlotLagSensor:
    return PgSlotLagSensor(task_id="lag", postgres_conn_id="pglogical_publisher", poke_interval=0.2, **kwargs)


def test_healthy_slot_passes_and_returns_its_metrics(publisher, publisher_hook):
    publisher_hook.create_slot("s1")
    status = sensor(slot="s1").poke({})
    assert status.is_done and status.xcom_value["state"] == "ok"
    assert status.xcom_value["retained_wal_bytes"] >= 0
    assert first_event(SlotHealthTrigger("pglogical_publisher", "s1"))["state"] == "ok"


def test_thresholds_fail_or_warn(publisher, publisher_hook):
    publisher_hook.create_slot("s1")
    publisher.execute("CREATE TABLE w(x int); INSERT INTO w SELECT generate_series(1, 50000)")
    with pytest.raises(SlotError, match="retains .* bytes of WAL \\(limit 1,000\\)") as breach:
        sensor(slot="s1", max_retained_wal_bytes=1000).poke({})
    assert not isinstance(breach.value, AirflowFailException)  # the next pull brings it down: retry
    warned = sensor(slot="s1", max_lag_bytes=1000, fail_on_breach=False).poke({})
    assert warned.is_done and warned.xcom_value["state"] == "breach"


def test_busy_slot_waits_until_the_other_consumer_leaves(publisher, publisher_hook, monkeypatch):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
    publisher_hook.create_slot("s1")
    consumer = psycopg2.connect(publisher.conninfo, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    consumer.cursor().start_replication(slot_name="s1", decode=False,
                                        options={"proto_version": "1", "publication_names": "p"})
    wait_until(lambda: publisher_hook.get_slot("s1").active, message="slot to be active")
    assert sensor(slot="s1").poke({}) is False

    # Count the trigger's polls of the real slot: two "busy" answers prove it keeps waiting.
    from airflow_provider_pglogical.triggers import pglogical as triggers

    real_status, answers, polled_twice = triggers._slot_status, [], threading.Event()

    def counted_status(*args):
        status = real_status(*args)
        answers.append(status["state"])
        if len(answers) >= 2:
            polled_twice.set()
        return status

    monkeypatch.setattr(triggers, "_slot_status", counted_status)

    async def wait_then_release():
        trigger = SlotHealthTrigger("pglogical_publisher", "s1", poll_interval=0.2)
        waiting = asyncio.ensure_future(trigger.run().__anext__())
        assert await asyncio.to_thread(polled_twice.wait, 30)
        assert not waiting.done() and answers[:2] == ["busy", "busy"]  # still busy; the loop was free meanwhile
        await asyncio.to_thread(consumer.close)
        return (await asyncio.wait_for(waiting, timeout=30)).payload

    assert asyncio.run(wait_then_release())["state"] == "ok"


def test_missing_slot_fails_with_the_fix_and_is_not_retried(publisher):
    with pytest.raises(AirflowFailException, match="does not exist: run the initial sync") as missing:
        sensor(slot="nope").execute({})
    assert isinstance(missing.value, SlotError)


def test_invalidated_slot_fails_pointing_at_the_re_snapshot(monkeypatch):
    settings = {"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0", "min_wal_size": "32MB", "max_wal_size": "64MB"}
    with LocalPostgres(name="lost", settings=settings) as pg:
        monkeypatch.setenv("AIRFLOW_CONN_PGLOGICAL_PUBLISHER", pg.connection_uri())
        pg.execute("SELECT pg_create_logical_replication_slot('s1', 'pgoutput')")
        pg.execute("CREATE TABLE w(x int)")

        def lose() -> bool:
            pg.execute("INSERT INTO w SELECT generate_series(1, 100000); SELECT pg_switch_wal(); CHECKPOINT")
            return pg.query("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 's1'")[0][0] == "lost"

        wait_until(lose, timeout=120, interval=0, message="the slot to be invalidated")
        with pytest.raises(AirflowFailException, match="invalidated .*re-snapshot"):
            sensor(slot="s1").poke({})
        assert first_event(SlotHealthTrigger("pglogical_publisher", "s1"))["state"] == "invalidated"


def test_subscription_ready_sensor_and_trigger(publisher, subscriber, publisher_hook, subscriber_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); INSERT INTO t VALUES (1); CREATE PUBLICATION p FOR TABLE t")
    subscriber.execute("CREATE TABLE t(id int PRIMARY KEY)")
    ready = PgSubscriptionReadySensor(task_id="ready", subscription="sub", postgres_conn_id="pglogical_subscriber")
    with pytest.raises(SubscriptionError, match="does not exist"):
        ready.poke({})
    subscriber_hook.create_subscription("sub", ["p"], publisher_conn_id=publisher.conn_id)
    event = first_event(SubscriptionReadyTrigger("pglogical_subscriber", "sub", poll_interval=0.2))
    assert event["state"] == "ready" and event["tables"] == {"public.t": "r"}
    assert ready.poke({}).is_done
    assert subscriber.query("SELECT id FROM t") == [(1,)]


def test_triggers_serialize_round_trip():
    trigger = SlotHealthTrigger("c", "s", 10, 20, 5.0)
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_pglogical.triggers.pglogical.SlotHealthTrigger"
    assert SlotHealthTrigger(**kwargs).serialize() == (path, kwargs)
    path, kwargs = SubscriptionReadyTrigger("c", "sub", 3.0).serialize()
    assert SubscriptionReadyTrigger(**kwargs).serialize() == (path, kwargs)
