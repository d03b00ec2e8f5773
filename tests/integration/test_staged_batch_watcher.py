"""The event-driven apply (triggers/staged_batches.py): a batch a pull commits to staging starts a DAG
run through a running scheduler and triggerer, and an idle staging area starts none.

The DAG is scheduled on ``staged_batches_asset`` as dags/pglogical_lakehouse_events.py's apply DAG
is; its task is a no-op so the test pays for no Spark (the apply itself is tested elsewhere).
"""

from __future__ import annotations

import json
import sqlite3
import textwrap

from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical import PgInitialSyncOperator, PgSlotPullOperator
from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.staging.apply_marker import write_marker
from airflow_provider_pglogical.staging.layout import committed_batches
from tests.support.airflow_server import start_scheduler

DAG_FILE = '''
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow_provider_pglogical.triggers.staged_batches import staged_batches_asset

with DAG("apply_on_batches", schedule=[staged_batches_asset("{staging}", "shop", poll_interval=0.5)],
         is_paused_upon_creation=False):
    EmptyOperator(task_id="apply")
'''


def runs(home) -> list[tuple[str, str]]:
    """The DAG's runs (run type, the asset event's payload), from Airflow's own database."""
    with sqlite3.connect(home / "airflow.db") as db:
        rows = db.execute("SELECT r.run_type, e.extra FROM dag_run r "
                          "LEFT JOIN dagrun_asset_event de ON de.dag_run_id = r.id "
                          "LEFT JOIN asset_event e ON e.id = de.event_id "
                          "WHERE r.dag_id = 'apply_on_batches' ORDER BY r.id").fetchall()
    return [(kind, json.loads(extra or "{}").get("payload")) for kind, extra in rows]


def test_a_committed_batch_starts_the_dag_that_applies_it(publisher, publisher_hook, tmp_path):
    publisher.execute("CREATE TABLE orders(id int PRIMARY KEY, status text); "
                      "INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 5) g")
    publisher_hook.create_publication("shop", [PublishedTable("public.orders")])
    staging = (tmp_path / "staging").as_uri()
    common = {"postgres_conn_id": publisher.conn_id, "staging_root": staging, "pipeline": "shop"}
    PgInitialSyncOperator(task_id="initial_sync", slot="shop_slot", publications=["shop"], **common).execute({})
    root = ObjectStoragePath(staging)
    [snapshot] = [name for name, *_ in committed_batches(root, "shop")]
    write_marker(root, "shop", {"catalog": "lake"}, [snapshot])  # as an apply of the snapshot leaves it
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "apply_on_batches.py").write_text(textwrap.dedent(DAG_FILE).replace("{staging}", staging))
    home = tmp_path / "airflow-home"
    airflow = start_scheduler(home, dags)
    try:
        # idle: every committed batch was applied, so the watcher fires nothing while it lists
        wait_until(lambda: airflow.check_running() or "trigger ID 1 starting" in _log(home, "triggerer"),
                   timeout=120, interval=0.5,
                   message="the triggerer to run the watcher")
        assert runs(home) == []
        publisher.execute("UPDATE orders SET status = 'paid' WHERE id <= 2")
        pulled = PgSlotPullOperator(task_id="pull", slot="shop_slot", publications=["shop"], **common).execute({})
        batch = pulled["batch"].rsplit("/", 1)[-1]
        wait_until(lambda: airflow.check_running() or runs(home), timeout=180, interval=0.5,
                   message="the committed batch to start a DAG run")
        [(kind, payload)] = runs(home)
        assert kind == "asset_triggered"
        assert payload == {"pipeline": "shop", "staging_root": staging, "batches": [batch],
                           "end_lsn": pulled["end_lsn"]}
    except BaseException:
        for name in ("triggerer", "scheduler"):
            print(f"--- {name}.log ---\n{_log(home, name)[-4000:]}")
        raise
    finally:
        airflow.stop()


def _log(home, name: str) -> str:
    path = home / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""
