"""The pipeline's figures as Airflow metrics (docs/metrics.md), received by a StatsD socket on loopback,
and the warning before PostgreSQL invalidates a slot, on a real server with a small WAL limit.

Airflow is pointed at the socket with its own ``[metrics]`` settings (environment variables), and its
``Stats`` is started the way a task's process starts it. The apply's metrics are checked where a
real ``airflow dags test`` runs the sync DAG's pull and apply (tests/integration/test_dags.py).
"""

from __future__ import annotations

import contextlib

import pendulum
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical import PgInitialSyncOperator, PgSlotLagSensor, PgSlotPullOperator
from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.ui.discovery import PipelineRef
from airflow_provider_pglogical.ui.figures import slot_figures, staging_figures
from airflow_provider_pglogical.ui.history import read_history
from tests.support.statsd import OtlpReceiver, StatsdListener

TICK = {"data_interval_start": pendulum.datetime(2026, 1, 1, tz="UTC"),
        "data_interval_end": pendulum.datetime(2026, 1, 1, 0, 10, tz="UTC")}


@contextlib.contextmanager
def airflow_statsd(monkeypatch, tags: bool = True):
    """A StatsD socket, and Airflow's Stats sending to it as a task's process starts it: from the
    ``[metrics]`` settings in the environment (then back to no metrics)."""
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability.metrics import stats_utils

    with StatsdListener() as listener:
        for name, value in listener.airflow_env(tags).items():
            monkeypatch.setenv(name, value)
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
        try:
            yield listener
        finally:
            stats.initialize(factory=NoStatsLogger, export_legacy_names=True)


def value(listener: StatsdListener, name: str, **tags: str) -> float:
    """The newest value of a metric ``airflow.pglogical.<name>`` with ``tags``."""
    found = listener.named(f"airflow.pglogical.{name}", **tags)
    assert found, f"no metric {name} {tags} in {sorted({m.name for m in listener.received()})}"
    return found[-1].value


def test_a_pull_exports_the_figures_the_view_shows(publisher, publisher_hook, tmp_path, monkeypatch):
    publisher.execute("CREATE TABLE orders(id int PRIMARY KEY, status text); "
                      "INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 20) g")
    publisher_hook.create_publication("shop", [PublishedTable("public.orders")])
    staging = (tmp_path / "staging").as_uri()
    common = {"postgres_conn_id": publisher.conn_id, "staging_root": staging, "pipeline": "shop"}
    PgInitialSyncOperator(task_id="initial_sync", slot="shop_slot", publications=["shop"], **common).execute({})
    publisher.execute("UPDATE orders SET status = 'paid' WHERE id <= 5")

    with airflow_statsd(monkeypatch) as statsd:  # StatsD with InfluxDB-style tags
        result = PgSlotPullOperator(task_id="pull", slot="shop_slot", publications=["shop"], **common).execute(TICK)
    with airflow_statsd(monkeypatch, tags=False) as untagged:  # plain StatsD: the tags go into a second name
        sensed = PgSlotLagSensor(task_id="slot_lag", slot="shop_slot", pipeline="shop",
                                 postgres_conn_id=publisher.conn_id).poke(TICK)

    root = ObjectStoragePath(staging)
    [entry] = read_history(root, "shop", "pull")
    view = staging_figures(root, PipelineRef(staging, "shop", publisher.conn_id, "shop_slot"))
    # the round: rows as a count, seconds as Airflow's timers (ms), tagged and under the legacy name
    [rows] = statsd.named("airflow.pglogical.pull.rows", pipeline="shop")
    assert (rows.kind, rows.value) == ("c", result["changes"]) and result["changes"] == 5
    assert not statsd.named("airflow.pglogical.pull.rows.shop"), "tags kept: no second name"
    [duration] = statsd.named("airflow.pglogical.pull.duration", pipeline="shop")
    assert duration.kind == "ms" and duration.value == pytest.approx(entry["seconds"] * 1000, abs=1)
    # the slot as the pull left it: the numbers the view's history holds
    assert value(statsd, "slot.lag_bytes", pipeline="shop") == entry["lag_bytes"] is not None
    assert value(statsd, "slot.retained_wal_bytes", pipeline="shop") == entry["retained_wal_bytes"] > 0
    assert value(statsd, "slot.at_risk", pipeline="shop") == 0 and sensed.xcom_value["warnings"] == []
    # pending: the snapshot (20 rows) and the change batch (5), no apply yet, as the view counts them
    assert (value(statsd, "pending.batches", pipeline="shop"), value(statsd, "pending.rows", pipeline="shop")) == (
        view["pending_batches"], view["pending_rows"]) == (2, 25)
    # the sensor exported the slot too, its figures the view's; plain StatsD gets both names, untagged
    health = slot_figures(publisher_hook, "shop_slot")
    [lag, legacy] = untagged.named("airflow.pglogical.slot.lag_bytes"), untagged.named(
        "airflow.pglogical.slot.lag_bytes.shop")
    assert [m.value for m in lag + legacy] == [health["lag_bytes"]] * 2 and lag[0].tags == legacy[0].tags == {}
    assert (health["warnings"], health["wal_keep_share"]) == ([], None)  # the test clusters keep all WAL
    names = {m.name for m in statsd.received() + untagged.received()}
    assert all(name.startswith("airflow.pglogical.") for name in names), names


def test_an_apply_window_sends_the_rounds_its_job_recorded_when_it_ends(tmp_path, monkeypatch):
    """A keep-running window's job (Spark, no Airflow) records each round in the history; the task sends
    the rounds of its own window when it ends, not older ones."""
    from airflow_provider_pglogical.ui.history import record_history
    from airflow_provider_pglogical.ui.metrics import after_apply

    root = ObjectStoragePath((tmp_path / "staging").as_uri())
    now = pendulum.now("UTC")
    for minutes, rows, freshness in ((30, 999, 99.0), (2, 10, 1.5), (1, 20, 0.75)):  # the first: an older window
        record_history(root, "p", "apply", {"at": now.subtract(minutes=minutes).isoformat(), "round": 1, "rows": rows,
                                            "seconds": 0.5, "tables": {"public.t": freshness}})
    warnings: list[str] = []
    with airflow_statsd(monkeypatch) as statsd:
        after_apply(root, "p", None, warnings.append, seconds=600)
    assert warnings == []
    assert [m.value for m in statsd.named("airflow.pglogical.apply.rows", pipeline="p")] == [10, 20]
    assert value(statsd, "table.freshness_seconds", pipeline="p", table="public.t") == 0.75
    assert value(statsd, "pending.batches", pipeline="p") == 0


def test_with_opentelemetry_the_metrics_reach_the_collector_with_their_tags(monkeypatch):
    """Airflow configured for OpenTelemetry: the same calls reach an OTLP collector, the pipeline and
    table as attributes (no second name: OpenTelemetry keeps them)."""
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability.metrics import stats_utils

    from airflow_provider_pglogical.ui.metrics import round_metrics, slot_metrics

    with OtlpReceiver() as collector:
        for name, setting in collector.airflow_env().items():
            monkeypatch.setenv(name, setting)
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
        try:
            round_metrics("apply", "shop", {"rows": 25, "seconds": 1.5, "tables": {"public.orders": 3.25}})
            slot_metrics("shop", {"lag_bytes": 4096, "retained_wal_bytes": 8192, "warnings": []})

            def received() -> dict:
                return {(name, tuple(sorted(attrs.items()))): v for name, v, attrs in collector.points
                        if name.startswith("airflow.pglogical.")}

            wait_until(lambda: collector.errors or len(received()) >= 6, timeout=30, interval=0.1, message="the collector's export")
        finally:
            from opentelemetry import metrics

            metrics.get_meter_provider().shutdown()  # its reader's last export, while the collector still answers
            stats.initialize(factory=NoStatsLogger, export_legacy_names=True)
    assert collector.errors == []
    got, shop = received(), (("pipeline", "shop"),)
    assert got[("airflow.pglogical.apply.rows", shop)] == 25
    assert got[("airflow.pglogical.apply.duration", shop)] == 1500  # Airflow's timers: milliseconds
    assert got[("airflow.pglogical.table.freshness_seconds", (("pipeline", "shop"), ("table", "public.orders")))] == 3.25
    assert (got[("airflow.pglogical.slot.lag_bytes", shop)], got[("airflow.pglogical.slot.at_risk", shop)]) == (4096, 0)
    assert not [key for key in got if key[0].endswith(".shop") or ".shop." in key[0]], "no second name"


def test_the_warning_comes_before_the_slot_is_lost(tmp_path, monkeypatch):
    """Nobody pulls while the application writes: the sensor, the view and the metric warn while the
    slot is still valid; only later does a checkpoint invalidate it."""
    with LocalPostgres(name="wal-limit", settings={"max_slot_wal_keep_size": "1MB"}) as cluster, \
            airflow_statsd(monkeypatch) as statsd:
        monkeypatch.setenv("AIRFLOW_CONN_LIMITED", cluster.connection_uri("postgres"))
        cluster.execute("CREATE TABLE t(id int PRIMARY KEY); CREATE TABLE filler(pad text)")
        hook = PgLogicalHook(postgres_conn_id="limited")
        hook.create_publication("p", [PublishedTable("t")])
        staging = (tmp_path / "staging").as_uri()
        PgInitialSyncOperator(task_id="initial_sync", slot="s1", publications=["p"], staging_root=staging,
                              pipeline="p", postgres_conn_id="limited").execute({})
        sensor = PgSlotLagSensor(task_id="slot_lag", slot="s1", pipeline="p", postgres_conn_id="limited")
        # per step of about 100 kB of WAL (under the warning's 20% of the limit), then, once warned, of
        # about 2 MB to reach the loss sooner: (warnings, at_risk metric, invalidated after a checkpoint)
        seen: list[tuple] = []
        for _ in range(400):  # a 16 MB segment at most: the slot's WAL is removed a segment at a time
            rows = 25000 if any(warnings for warnings, _m, _i in seen) else 1500
            cluster.execute(f"INSERT INTO filler SELECT md5(random()::text) FROM generate_series(1, {rows})")
            try:
                status = sensor.poke(TICK).xcom_value
            except Exception as lost:  # noqa: BLE001 - the sensor's verdict once the slot is gone
                seen.append((str(lost), None, True))
                break
            at_risk = value(statsd, "slot.at_risk", pipeline="p")
            assert slot_figures(hook, "s1")["warnings"] == status["warnings"], "the view says the same"
            cluster.execute("CHECKPOINT")
            seen.append((status["warnings"], at_risk, hook.get_slot("s1").invalidated))
            if seen[-1][2]:
                break
        lost_at = next(i for i, (_w, _m, invalidated) in enumerate(seen) if invalidated)
        warned_at = next(i for i, (warnings, _m, _i) in enumerate(seen) if warnings)
        print(f"warned at step {warned_at}, lost at step {lost_at}")
        assert warned_at < lost_at, seen[max(0, lost_at - 2):lost_at + 1]
        [warning] = seen[warned_at][0]
        assert "slot 's1' has used" in warning and "of max_slot_wal_keep_size (1,048,576 bytes" in warning
        assert "Fix: pull now" in warning and "ALTER SYSTEM SET max_slot_wal_keep_size" in warning
        assert seen[warned_at][1] == 1 and all(m == 0 for _w, m, _i in seen[:warned_at]), "the metric said so"
        assert "invalidated" in str(seen[lost_at][0]) or hook.get_slot("s1").invalidated
