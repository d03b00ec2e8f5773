"""The pipeline view (airflow_provider_pglogical/ui), in a real Airflow API server and a real browser.

One API server (SQLite, the simple auth manager with an allowed and a role-less user) serves a DAG
folder with two pipelines: ``shop``, staged from a real publisher by the operators (an initial sync
and two pulls), and ``lost``, whose publisher cannot be reached. No Spark: what an apply leaves
under staging is written by the same functions IcebergApplyOperator calls after its job.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from airflow_provider_pglogical.embedded.postgres import available_servers
from airflow_provider_pglogical.staging.applied_positions import record_applied
from airflow_provider_pglogical.staging.apply_marker import write_marker
from airflow_provider_pglogical.ui.history import apply_entry, record_history
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from tests.support.airflow_server import start_api_server
from tests.support.browser import Browser
from tests.support.databases import drop_database, new_database

UNREACHABLE_PASSWORD = "not-shown-anywhere-7f3a"
USERS = {"alice": ("viewer", "alice-pw"), "bob": ("", "bob-pw")}

DAGS = '''
from airflow.sdk import DAG
from airflow_provider_pglogical import PgInitialSyncOperator, PgSlotPullOperator

with DAG("shop_sync", schedule=None):
    PgInitialSyncOperator(task_id="initial_sync", slot="shop_slot", publications=["shop"],
                          staging_root="{staging}", pipeline="shop", postgres_conn_id="pglogical_publisher")
    PgSlotPullOperator(task_id="pull", slot="shop_slot", publications=["shop"], staging_root="{staging}",
                       pipeline="shop", postgres_conn_id="pglogical_publisher")

with DAG("lost_sync", schedule=None):
    PgSlotPullOperator(task_id="pull", slot="lost_slot", publications=["lost"], staging_root="{staging}",
                       pipeline="lost", postgres_conn_id="pglogical_unreachable")
'''


def _bytes(n: int) -> str:
    """The page's formatting of a byte count (page.js ``bytes``)."""
    units, i, value = ["B", "kB", "MB", "GB", "TB"], 0, float(n)
    while abs(value) >= 1024 and i < len(units) - 1:
        value, i = value / 1024, i + 1
    return f"{value:.1f} {units[i]}" if i else f"{value:.0f} {units[i]}"


@pytest.fixture(scope="module")
def shop(cluster_pool, tmp_path_factory):
    """The ``shop`` pipeline staged by the operators, and the API server with the DAGs naming it."""

    tmp = tmp_path_factory.mktemp("ui")
    cluster = cluster_pool.get("publisher", next(iter(available_servers())))
    with pytest.MonkeyPatch.context() as mp:
        db = new_database(cluster, "publisher", mp.setenv)
        try:
            staging = f"file://{tmp}/staging"
            dags = tmp / "dags"
            dags.mkdir()
            (dags / "pipelines.py").write_text(textwrap.dedent(DAGS).replace("{staging}", staging))
            # the server starts (database, DAGs, API) while the operators stage the pipeline
            server = start_api_server(
                tmp / "airflow-home", dags, USERS,
                AIRFLOW_CONN_PGLOGICAL_PUBLISHER=cluster.connection_uri(db.name),
                AIRFLOW_CONN_PGLOGICAL_UNREACHABLE=f"postgresql://lost:{UNREACHABLE_PASSWORD}@127.0.0.1:9/lost",
            )
            try:
                yield {**stage_shop(db, staging, server), "tmp": tmp}
            finally:
                server.stop()
        finally:
            drop_database(db)


def stage_shop(db, staging: str, server) -> dict:
    """Stage ``shop`` with the operators (an initial sync, two pulls) and write what an apply of the
    first two batches leaves; then wait for the server."""
    from airflow_provider_pglogical import PgInitialSyncOperator, PgSlotPullOperator
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.lakehouse.staging_roots import staging_path
    from airflow_provider_pglogical.management.publications import PublishedTable

    db.execute("CREATE TABLE orders(id int PRIMARY KEY, status text); "
               "INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 20) g")
    hook = PgLogicalHook(postgres_conn_id=db.conn_id)
    hook.create_publication("shop", [PublishedTable("public.orders")])
    common = {"postgres_conn_id": db.conn_id, "staging_root": staging, "pipeline": "shop"}
    PgInitialSyncOperator(task_id="initial_sync", slot="shop_slot", publications=["shop"], **common).execute({})
    pull = PgSlotPullOperator(task_id="pull", slot="shop_slot", publications=["shop"], **common)
    db.execute("UPDATE orders SET status = 'paid' WHERE id <= 5")
    first = pull.execute({})
    db.execute("INSERT INTO orders SELECT g, 'new' FROM generate_series(21, 27) g")
    pull.execute({})
    # what IcebergApplyOperator writes once its job applied the snapshot and the first change batch
    root = staging_path(staging)
    applied = [name for name, *_ in committed_batches(root, "shop")][:2]
    steps = [{"table": "public.orders", "target": "public__orders", "batch": name,
              "kind": read_manifest(root, "shop", name).kind,
              "rows": read_manifest(root, "shop", name).tables["public.orders"].rows} for name in applied]
    record_applied(root, "shop", steps)
    write_marker(root, "shop", {"catalog": "lake"}, applied)
    record_history(root, "shop", "apply", apply_entry(root, "shop", steps, 4.2))
    server.wait_ready()
    return {"db": db, "server": server, "first": first}


def test_api_lists_only_pipelines_of_dags_the_user_may_read(shop):
    server, db = shop["server"], shop["db"]
    assert server.get("/pglogical/api/pipelines")[0] == 401, "no login, no figures"
    status, nobody = server.get("/pglogical/api/pipelines", server.token("bob", "bob-pw"))
    assert (status, nobody["pipelines"]) == (200, []), "a user who may read no DAG sees no pipeline"

    token = server.token("alice", "alice-pw")
    status, plugins = server.get("/api/v2/plugins", token)
    [plugin] = [p for p in plugins["plugins"] if p["name"] == "pglogical"]
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/pglogical"
    assert plugin["external_views"][0]["href"] == "/pglogical/"

    status, body = server.get("/pglogical/api/pipelines", token)
    assert status == 200, body
    raw = json.dumps(body)
    assert UNREACHABLE_PASSWORD not in raw and "password" not in raw
    pipelines = {p["pipeline"]: p for p in body["pipelines"]}
    assert sorted(pipelines) == ["lost", "shop"]

    lost = pipelines["lost"]
    assert "pglogical_unreachable" in lost["slot_error"] and "Fix" in lost["slot_error"]
    assert lost["state"] == "no pipeline record"

    p = pipelines["shop"]
    assert (p["dags"], p["slot"], p["publications"], p["state"]) == (["shop_sync"], "shop_slot", ["shop"], "streaming")
    # the slot's figures as the publisher itself reports them (a psycopg2 query, not the UI's code)
    [(confirmed, wal_status, headroom_mb)] = db.query(
        "SELECT confirmed_flush_lsn::text, wal_status, (SELECT setting::bigint FROM pg_settings "
        "WHERE name = 'max_slot_wal_keep_size') FROM pg_replication_slots WHERE slot_name = 'shop_slot'")
    health = p["slot_health"]
    assert (health["state"], health["confirmed_flush_lsn"], health["wal_status"]) == ("ok", confirmed, wal_status)
    assert health["lag_bytes"] >= 0 and health["retained_wal_bytes"] > 0
    assert health["max_slot_wal_keep_size_bytes"] == (None if headroom_mb < 0 else headroom_mb * 1024 * 1024)
    # three committed batches: the snapshot and the first change batch applied, the second pending
    assert (p["committed_batches"], p["pending_batches"], p["pending_rows"]) == (3, 1, 7)
    [table] = p["tables"]
    assert (table["table"], table["target"], table["applied_lsn"]) == ("public.orders", "public__orders",
                                                                       shop["first"]["end_lsn"])
    assert 0 < table["freshness_seconds"] < 600
    assert p["last_pull"]["rows"] == 7 and p["last_apply"]["rows"] == 25
    lag = p["history"]["slot_lag"]
    assert len(lag) == 2 and all(point["lag_bytes"] is not None for point in lag)
    assert p["history"]["freshness"][0]["seconds"] == table["freshness_seconds"]


def test_page_shows_the_pipeline_its_tables_lag_and_a_chart_in_chromium(shop):
    server = shop["server"]
    browser = Browser(shop["tmp"] / "chromium-profile")
    try:
        browser.set_cookie(server.url, "_token", server.token("alice", "alice-pw"))
        browser.open(f"{server.url}/pglogical/")
        browser.wait_for("document.body.dataset.loaded === 'true'", message="the pipelines to load")
        screenshot = browser.screenshot(shop["tmp"] / "pipelines.png")
        print(f"screenshot of the pipeline view: {screenshot}")
        text = browser.evaluate("document.body.innerText")
        shop_card = browser.evaluate("document.querySelector('[data-pipeline=shop]').innerText")
        points = browser.evaluate("document.querySelectorAll('[data-pipeline=shop] svg.lag circle').length")
        freshness = browser.evaluate("document.querySelectorAll('[data-pipeline=shop] svg.freshness circle').length")
    finally:
        browser.close()
    assert "Replication pipelines" in text and "2 pipeline(s)" in text
    assert "lost" in text and "cannot read slot 'lost_slot'" in text, "the broken pipeline shows its error"
    assert "shop_slot" in shop_card and "public.orders" in shop_card and "public__orders" in shop_card
    status, body = server.get("/pglogical/api/pipelines", server.token("alice", "alice-pw"))
    health = next(p for p in body["pipelines"] if p["pipeline"] == "shop")["slot_health"]
    assert re.search(r"[\d.]+ (B|kB|MB)\nslot lag", shop_card), shop_card
    assert f"{_bytes(health['retained_wal_bytes'])}\nretained WAL" in shop_card
    assert "pending batches" in shop_card and "Slot lag" in shop_card
    assert points == 2 and freshness == 1, "the charts draw the history the tasks recorded"
    assert screenshot.stat().st_size > 10_000
