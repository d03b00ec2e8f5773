"""A DAG scheduled on an Iceberg table's Asset runs after an apply that changed that table.

Real everything: PostgreSQL, Spark (local), Iceberg, and Airflow's own scheduler and API server
(LocalExecutor on SQLite). The lakehouse DAG runs with ``airflow dags test``; its apply emits
asset events through its alias; the scheduler turns the event on ``orders`` into a run of
``pglogical_orders_downstream``, which reports the apply's extra.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_pglogical.embedded import demo
from airflow_provider_pglogical.embedded.postgres import wait_until
from tests.support.airflow_server import answers, free_port

pytestmark = pytest.mark.spark

AIRFLOW = str(Path(sys.executable).parent / "airflow")
ORDERS = "iceberg://lake/shop/public__orders"
CUSTOMERS = "iceberg://lake/shop/public__customers"


def _run(env: dict, *args: str) -> str:
    proc = subprocess.run([AIRFLOW, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        pytest.fail(f"airflow {' '.join(args)} failed:\n{proc.stdout[-6000:]}")
    return proc.stdout


def _query(env: dict, statement: str) -> list:
    code = ("import json, sys\nfrom sqlalchemy import text\nfrom airflow.utils.session import create_session\n"
            "with create_session() as s:\n"
            f"    rows = s.execute(text({statement!r})).fetchall()\n"
            "print('ROWS ' + json.dumps([list(r) for r in rows], default=str))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = [line for line in proc.stdout.splitlines() if line.startswith("ROWS ")][-1]
    return json.loads(line[5:])


@pytest.fixture
def airflow_services(tmp_path, publisher):
    demo.load(publisher.cluster, publisher.name, random.Random(11))
    port = free_port()
    env = demo.airflow_env(tmp_path, publisher.cluster, publisher.name)
    env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://127.0.0.1:{port}/execution/"
    _run(env, "db", "migrate")
    _run(env, "dags", "reserialize")
    _run(env, "dags", "unpause", "pglogical_orders_downstream")
    processes = []
    logs = []
    try:
        for name, args in (("api-server", ["api-server", "--host", "127.0.0.1", "--port", str(port)]),
                           ("scheduler", ["scheduler"])):
            log = open(tmp_path / f"{name}.log", "w")
            logs.append(log)
            processes.append(subprocess.Popen([AIRFLOW, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            if name == "api-server":
                wait_until(lambda: answers(f"http://127.0.0.1:{port}/execution/health"), timeout=180,
                           message="the Airflow API server to answer")
        yield env
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for log in logs:
            log.close()


def _downstream_runs(env: dict) -> list:
    return _query(env, "SELECT run_id, run_type, state FROM dag_run WHERE dag_id = 'pglogical_orders_downstream' "
                       "ORDER BY id")


def _asset_events(env: dict, uri: str) -> list:
    return _query(env, "SELECT e.extra, e.source_task_id FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                       f"WHERE a.uri = '{uri}' ORDER BY e.id")


def test_a_dag_scheduled_on_the_orders_asset_runs_after_an_apply_changed_orders(airflow_services, publisher):
    env = airflow_services
    assert _downstream_runs(env) == []
    # runs whose intervals hold no 6-hour boundary: the housekeeping is skipped (test_dags runs it)
    _run(env, "dags", "test", "pglogical_lakehouse_sync", "2026-01-01T00:10:00+00:00")

    [(extra, task)] = _asset_events(env, ORDERS)
    extra = json.loads(extra) if isinstance(extra, str) else extra
    (eu_orders,), = publisher.query("SELECT count(*) FROM orders WHERE region = 'EU'")
    assert task == "apply" and extra["rows"] == eu_orders and extra["source_table"] == "public.orders"
    assert extra["pipeline"] == "shop" and "/" in extra["lsn"]

    def downstream_done() -> bool:
        runs = _downstream_runs(env)
        return bool(runs) and runs[-1][2] in ("success", "failed")

    wait_until(downstream_done, timeout=300, interval=2, message="the downstream DAG run to finish")
    [(run_id, run_type, state)] = _downstream_runs(env)
    assert (run_type, state) == ("asset_triggered", "success")
    [(value,)] = _query(env, "SELECT value FROM xcom WHERE dag_id = 'pglogical_orders_downstream' "
                             "AND key = 'return_value'")
    reported = json.loads(value) if isinstance(value, str) else value
    assert [entry["asset"] for entry in reported] == [ORDERS]
    assert reported[0]["rows"] == eu_orders

    # An apply that changes customers only emits no event for orders: nothing new is queued for it.
    publisher.execute("UPDATE customers SET name = name || ' (renamed)' WHERE id IN (1, 2)")
    _run(env, "dags", "test", "pglogical_lakehouse_sync", "2026-01-01T00:20:00+00:00")
    assert len(_asset_events(env, ORDERS)) == 1
    customer_events = _asset_events(env, CUSTOMERS)
    assert len(customer_events) == 2
    last = customer_events[-1][0]
    assert (json.loads(last) if isinstance(last, str) else last)["rows"] == 2
    assert _query(env, "SELECT count(*) FROM asset_dag_run_queue WHERE target_dag_id = 'pglogical_orders_downstream'") == [[0]]
    assert len(_downstream_runs(env)) == 1
