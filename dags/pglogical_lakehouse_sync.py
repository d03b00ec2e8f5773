"""PostgreSQL → Apache Iceberg with logical replication: set up once, then pull → apply every tick.

Every task is idempotent, so the same DAG does both: on the first run the publication and the
slot are created and the initial snapshot is staged and applied; on later runs those tasks find
their work done and return at once, the slot-lag sensor checks the slot, and the pull stages the
new changes that the apply task merges into Iceberg.

Housekeeping (compaction, snapshot expiry, orphan-file removal) runs after the apply of one run in
every ``settings.MAINTENANCE_EVERY`` (6 hours by default); in the other runs ``maintenance_due``
skips it, and a skipped task leaves the run successful. It never races the apply: both are in the
same DAG run, one after the other, and ``max_active_runs=1`` keeps runs from overlapping.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import DAG, CronTriggerTimetable, TriggerRule, task

from airflow_provider_pglogical import (
    IcebergApplyOperator,
    IcebergMaintenanceOperator,
    PgCreatePublicationOperator,
    PgInitialSyncOperator,
    PgSlotLagSensor,
    PgSlotPullOperator,
)
from airflow_provider_pglogical.lakehouse.maintenance_window import maintenance_due

import pglogical_settings as settings

ICEBERG = settings.iceberg_config()
#: the schedule's period: a run's data interval is the tick before it, so the housekeeping gate
#: sees every moment once (change both together)
TICK = dt.timedelta(minutes=10)

with DAG(
    dag_id="pglogical_lakehouse_sync",
    description="Incremental sync of published PostgreSQL tables into Apache Iceberg",
    schedule=CronTriggerTimetable("*/10 * * * *", timezone="UTC", interval=TICK),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": settings.TASK_RETRIES, "retry_delay": settings.RETRY_DELAY},
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
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
    )
    slot_lag = PgSlotLagSensor(
        task_id="slot_lag",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        slot=settings.SLOT,
        pipeline=settings.PIPELINE,  # exports the slot's figures as metrics (docs/metrics.md)
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
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
        max_changes="{{ params.max_changes }}",
    )
    apply = IcebergApplyOperator(
        task_id="apply",
        conn_id=settings.SPARK_CONN_ID,
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
        iceberg=ICEBERG,
        conf=settings.SPARK_CONF,
    )

    # after an apply that succeeded or had nothing to do (skipped); not after a failed one
    @task.short_circuit(task_id="maintenance_due", trigger_rule=TriggerRule.NONE_FAILED)
    def is_maintenance_due(data_interval_start=None, data_interval_end=None) -> bool:
        """Let the housekeeping run once per MAINTENANCE_EVERY; skip it (not fail it) in the other runs."""
        return maintenance_due(data_interval_start, data_interval_end, settings.MAINTENANCE_EVERY)

    maintenance = IcebergMaintenanceOperator(
        task_id="maintenance",
        conn_id=settings.SPARK_CONN_ID,
        iceberg=ICEBERG,
    )
    publication >> snapshot >> slot_lag >> pull >> apply >> is_maintenance_due() >> maintenance
