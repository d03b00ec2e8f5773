"""PostgreSQL → Apache Iceberg with logical replication: set up once, then pull → apply every tick.

Every task is idempotent, so the same DAG does both: on the first run the publication and the
slot are created and the initial snapshot is staged and applied; on later runs those tasks find
their work done and return at once, the slot-lag sensor checks the slot, and the pull stages the
new changes that the apply task merges into Iceberg.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.publication import PgCreatePublicationOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.sensors.pglogical import PgSlotLagSensor

import pglogical_settings as settings

ICEBERG = IcebergConfig(warehouse=settings.WAREHOUSE, namespace=settings.NAMESPACE)

with DAG(
    dag_id="pglogical_lakehouse_sync",
    description="Incremental sync of published PostgreSQL tables into Apache Iceberg",
    schedule="*/10 * * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": pendulum.duration(seconds=30)},
    params={"max_changes": 200_000},
    tags=["pglogical", "iceberg"],
) as dag:
    publication = PgCreatePublicationOperator(
        task_id="publication",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        publication=settings.PUBLICATION,
        tables=settings.TABLES,
        publish_via_partition_root=settings.PUBLISH_VIA_PARTITION_ROOT,
    )
    snapshot = PgInitialSyncOperator(
        task_id="initial_sync",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        slot=settings.SLOT,
        publications=[settings.PUBLICATION],
        staging_path=settings.STAGING,
        pipeline=settings.PIPELINE,
    )
    slot_lag = PgSlotLagSensor(
        task_id="slot_lag",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        slot=settings.SLOT,
        max_retained_wal_bytes=8 << 30,
        fail_on_breach=False,
        poke_interval=15,
        timeout=600,
        mode="reschedule",
    )
    pull = PgSlotPullOperator(
        task_id="pull",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        slot=settings.SLOT,
        publications=[settings.PUBLICATION],
        staging_path=settings.STAGING,
        pipeline=settings.PIPELINE,
        max_changes="{{ params.max_changes }}",
    )
    apply = IcebergApplyOperator(
        task_id="apply",
        conn_id=settings.SPARK_CONN_ID,
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
        iceberg=ICEBERG,
    )
    publication >> snapshot >> slot_lag >> pull >> apply
