"""PostgreSQL → Apache Iceberg, event-driven: pulls on a clock, the apply when a batch lands.

Two DAGs instead of the sync DAG's one (enable these or ``pglogical_lakehouse_sync``, not both: they
apply the same pipeline). ``pglogical_lakehouse_pull`` sets up the pipeline and pulls every few
minutes; each pull that finds changes commits a batch under staging. ``pglogical_lakehouse_apply``
is scheduled on the pipeline's staged-batches asset, whose ``AssetWatcher`` lists the staging area
in the triggerer (no JVM, one listing per ``settings.WATCH_INTERVAL``) and fires when a committed
batch appears: the apply starts Spark only when there is something to apply, and as soon as there
is, instead of on the next tick. Housekeeping stays on the sync DAG's rhythm, after an apply that
falls in a new ``settings.MAINTENANCE_EVERY`` period (docs/operators.md, "An apply the staged
batches trigger").
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import DAG, CronTriggerTimetable

from airflow_provider_pglogical import (
    IcebergApplyOperator,
    PgCreatePublicationOperator,
    PgInitialSyncOperator,
    PgSlotLagSensor,
    PgSlotPullOperator,
)
from airflow_provider_pglogical.triggers.staged_batches import staged_batches_asset

import pglogical_settings as settings

#: the pulls' period: the slot-lag sensor judges the idle timeout against it
PULL_EVERY = dt.timedelta(minutes=5)
DEFAULTS = {"retries": settings.TASK_RETRIES, "retry_delay": settings.RETRY_DELAY}

with DAG(
    dag_id="pglogical_lakehouse_pull",
    description="Pull the slot's changes into staging; pglogical_lakehouse_apply follows each batch",
    schedule=CronTriggerTimetable("*/5 * * * *", timezone="UTC", interval=PULL_EVERY),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULTS,
    tags=["pglogical", "iceberg"],
):
    publication = PgCreatePublicationOperator(
        task_id="publication", postgres_conn_id=settings.SOURCE_CONN_ID, publication=settings.PUBLICATION,
        tables=settings.TABLES, publish_via_partition_root=settings.PUBLISH_VIA_PARTITION_ROOT,
    )
    snapshot = PgInitialSyncOperator(
        task_id="initial_sync", postgres_conn_id=settings.SOURCE_CONN_ID, slot=settings.SLOT,
        publications=[settings.PUBLICATION], staging_root=settings.STAGING, pipeline=settings.PIPELINE,
    )
    slot_lag = PgSlotLagSensor(
        task_id="slot_lag", postgres_conn_id=settings.SOURCE_CONN_ID, slot=settings.SLOT, pipeline=settings.PIPELINE,
        max_retained_wal_bytes=8 << 30, fail_on_breach=False, poke_interval=15, timeout=300, mode="reschedule",
    )
    pull = PgSlotPullOperator(
        task_id="pull", postgres_conn_id=settings.SOURCE_CONN_ID, slot=settings.SLOT,
        publications=[settings.PUBLICATION], staging_root=settings.STAGING, pipeline=settings.PIPELINE,
    )
    publication >> snapshot >> slot_lag >> pull

with DAG(
    dag_id="pglogical_lakehouse_apply",
    description="Apply committed batches to Apache Iceberg as they land in staging",
    schedule=[staged_batches_asset(settings.STAGING, settings.PIPELINE, poll_interval=settings.WATCH_INTERVAL)],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # batches that land during a run are applied by the next one
    default_args=DEFAULTS,
    tags=["pglogical", "iceberg"],
):
    IcebergApplyOperator(
        task_id="apply", conn_id=settings.SPARK_CONN_ID, staging_root=settings.STAGING, pipeline=settings.PIPELINE,
        iceberg=settings.iceberg_config(), conf=settings.SPARK_CONF,
    )
