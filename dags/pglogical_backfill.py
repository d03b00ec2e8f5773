"""Ops backfill: re-snapshot one table (or a key range of it) while the incremental sync keeps running.

Trigger with a conf such as ``{"table": "public.orders"}`` or
``{"table": "public.orders", "key_column": "id", "key_start": 1000, "key_end": 2000}``.
The snapshot is positioned by its own LSN: the apply replaces the table (or the range) at that
LSN and re-applies the changes committed after it, so the result equals the source.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_provider_pglogical import IcebergApplyOperator, PgBackfillOperator

import pglogical_settings as settings

with DAG(
    dag_id="pglogical_backfill",
    description="Re-snapshot one published table into the lakehouse while the sync keeps flowing",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    render_template_as_native_obj=True,
    params={
        "table": Param("public.customers", type="string", description="schema.table to re-snapshot"),
        "key_column": Param(None, type=["null", "string"], description="column of an optional key range"),
        "key_start": Param(None, type=["null", "integer", "string"], description="range start (inclusive)"),
        "key_end": Param(None, type=["null", "integer", "string"], description="range end (exclusive)"),
    },
    tags=["pglogical", "iceberg", "ops"],
) as dag:
    backfill = PgBackfillOperator(
        task_id="backfill",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        tables="{{ params.table }}",
        key_range="{{ {'column': params.key_column, 'start': params.key_start, 'end': params.key_end} "
                  "if params.key_column else None }}",
        publications=[settings.PUBLICATION],
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
    )
    apply = IcebergApplyOperator(
        task_id="apply",
        conn_id=settings.SPARK_CONN_ID,
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
        iceberg=settings.iceberg_config(),
    )
    backfill >> apply
