"""Downstream of the lakehouse sync: runs whenever an apply changed the Iceberg ``orders`` table.

``IcebergApplyOperator`` emits one Airflow Asset event per Iceberg table it changed
(``iceberg://<catalog>/<namespace>/<table>``, extra: pipeline, source table, batch, LSN, rows);
a DAG scheduled on that asset runs after each such apply. This one just reports what arrived.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_pglogical.operators.iceberg_apply import iceberg_table_asset

import pglogical_settings as settings

ORDERS = iceberg_table_asset("lake", settings.NAMESPACE, "public__orders")

with DAG(
    dag_id="pglogical_orders_downstream",
    description="Runs after every apply that changed the lakehouse's orders table",
    schedule=[ORDERS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["pglogical", "iceberg", "downstream"],
) as dag:

    @task
    def report_applied_changes(triggering_asset_events=None) -> list[dict]:
        """What the apply that triggered this run changed: one entry per asset event."""
        applied, seen = [], set()
        # an event is listed under its asset and under the alias it came through: count it once
        for events in (triggering_asset_events or {}).values():
            for event in events:
                key = (event.asset.uri, event.source_run_id, event.timestamp)
                if key not in seen:
                    seen.add(key)
                    applied.append({"asset": event.asset.uri, **(event.extra or {})})
        print(f"orders changed: {applied}")
        return applied

    report_applied_changes()
