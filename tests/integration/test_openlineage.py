"""OpenLineage: the lakehouse DAG, run by ``airflow dags test`` with the OpenLineage provider and the
OpenLineage client's file transport, reports PostgreSQL tables → staging (initial sync, pull) and
staging → Iceberg tables (apply), each dataset with its schema. Real PostgreSQL, Spark, Iceberg."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_pglogical.embedded import demo

# the OpenLineage provider is a test dependency (extra "openlineage"): imported, never skipped
from airflow.providers.openlineage.extractors import OperatorLineage  # noqa: E402,F401

pytestmark = pytest.mark.spark

AIRFLOW = str(Path(sys.executable).parent / "airflow")


def _run(env: dict, *args: str) -> None:
    proc = subprocess.run([AIRFLOW, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        pytest.fail(f"airflow {' '.join(args)} failed:\n{proc.stdout[-6000:]}")


def _complete(events: list[dict], task: str) -> list[dict]:
    return [e for e in events if e["eventType"] == "COMPLETE" and e["job"]["name"].endswith(f".{task}")]


def _fields(dataset: dict) -> dict[str, str]:
    return {f["name"]: f["type"] for f in dataset["facets"]["schema"]["fields"]}


def test_initial_sync_pull_and_apply_report_their_datasets(tmp_path, publisher):
    rng = random.Random(5)
    demo.load(publisher.cluster, publisher.name, rng)
    events_file = tmp_path / "openlineage.jsonl"
    env = demo.airflow_env(tmp_path, publisher.cluster, publisher.name)
    env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
        {"type": "file", "log_file_path": str(events_file), "append": True})
    env["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "pglogical-test"
    _run(env, "db", "migrate")
    # runs whose intervals hold no 6-hour boundary: the housekeeping is skipped (test_dags runs it)
    _run(env, "dags", "test", "pglogical_lakehouse_sync", "2026-01-01T00:10:00+00:00")
    demo.workload(publisher.cluster, publisher.name, rng, 1)
    _run(env, "dags", "test", "pglogical_lakehouse_sync", "2026-01-01T00:20:00+00:00")
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]

    pg_namespace = f"postgres://{publisher.cluster.host}:{publisher.cluster.port}"
    staging = str(tmp_path / "staging" / "shop")
    [sync, _] = _complete(events, "initial_sync")  # the second run finds the snapshot done: same lineage
    inputs = {d["name"]: d for d in sync["inputs"]}
    assert {d["namespace"] for d in sync["inputs"]} == {pg_namespace}
    assert set(inputs) == {f"{publisher.name}.public.{t}" for t in ("customers", "orders", "products", "events")}
    # the publication's column list: internal_note is not published, so not in the schema
    orders_columns = _fields(inputs[f"{publisher.name}.public.orders"])
    assert list(orders_columns) == ["id", "customer_id", "region", "status", "total", "created_at", "note"]
    assert {d["name"] for d in sync["outputs"]} == {f"{staging}/public.{t}" for t in
                                                    ("customers", "orders", "products", "events")}
    assert {d["namespace"] for d in sync["outputs"]} == {"file"}

    pulls = _complete(events, "pull")
    changed = [p for p in pulls if p["inputs"]]
    assert changed, "the pull after the workload staged changes and reports them"
    assert all(d["namespace"] == pg_namespace for d in changed[-1]["inputs"])
    assert {d["name"].rsplit("/", 1)[-1] for d in changed[-1]["outputs"]} == {
        d["name"].split(".", 1)[1] for d in changed[-1]["inputs"]}

    applies = _complete(events, "apply")
    first = applies[0]
    assert {d["name"] for d in first["inputs"]} == {d["name"] for d in sync["outputs"]}
    warehouse = (tmp_path / "warehouse").as_uri()
    assert {(d["namespace"], d["name"]) for d in first["outputs"]} == {
        (warehouse, f"shop.public__{t}") for t in ("customers", "orders", "products", "events")}
    iceberg_orders = next(d for d in first["outputs"] if d["name"] == "shop.public__orders")
    assert _fields(iceberg_orders) == orders_columns
