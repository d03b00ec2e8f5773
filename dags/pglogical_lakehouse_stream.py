"""PostgreSQL → Apache Iceberg, streaming: each run pulls and applies for a window of minutes.

The sync DAG pays a DAG run, seven task starts and a Spark JVM for every pull and apply, so a
commit waits for the next tick and that tick's apply (p95 ≈ two ticks, 15-20 s at best). Here one
run holds a pull window and an apply window side by side for ``settings.STREAM_WINDOW`` (10
minutes by default): the pull stages a batch every ``STREAM_PULL_INTERVAL`` seconds (1) when there
are changes (and waits while the apply is two batches behind: larger batches, not more), and the apply's Spark session, started once per window, looks every
``STREAM_POLL_INTERVAL`` seconds (0.5) and applies each new batch in a round (docs/streaming.md). ``@continuous`` with ``max_active_runs=1`` starts the next run as
soon as one ends.

The apply window does not wait for the setup tasks: its JVM starts while the publication and the
initial sync (which find their work done after the first run) take their task starts, and it
applies the initial snapshot in a round as soon as it is committed. Housekeeping runs after the
apply window of one run in every ``settings.STREAM_MAINTENANCE_EVERY`` (an hour), in the same run: it never meets
an apply (the lease keeps out a second apply, not the housekeeping). Run this DAG or the sync DAG
for a pipeline, not both.

Cost: one Airflow worker slot for each window task and one Spark driver, held for the whole window.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, TriggerRule, task

from airflow_provider_pglogical import (
    IcebergApplyOperator,
    IcebergMaintenanceOperator,
    PgCreatePublicationOperator,
    PgInitialSyncOperator,
    PgSlotPullOperator,
)
from airflow_provider_pglogical.lakehouse.maintenance_window import maintenance_due

import pglogical_settings as settings

ICEBERG = settings.iceberg_config()

with DAG(
    dag_id="pglogical_lakehouse_stream",
    description="Streaming sync of published PostgreSQL tables into Apache Iceberg, in windows",
    schedule="@continuous",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": settings.TASK_RETRIES, "retry_delay": settings.RETRY_DELAY},
    params={"max_changes": 200_000},
    tags=["pglogical", "iceberg", "streaming"],
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
    pull = PgSlotPullOperator(
        task_id="pull_window",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        slot=settings.SLOT,
        publications=[settings.PUBLICATION],
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
        max_changes="{{ params.max_changes }}",
        keep_running=settings.STREAM_WINDOW,
        poll_interval=settings.STREAM_PULL_INTERVAL,
        max_unapplied_batches=settings.STREAM_MAX_UNAPPLIED,
    )
    apply = IcebergApplyOperator(
        task_id="apply_window",
        conn_id=settings.SPARK_CONN_ID,
        staging_root=settings.STAGING,
        pipeline=settings.PIPELINE,
        iceberg=ICEBERG,
        conf=settings.SPARK_CONF,
        keep_running=settings.STREAM_WINDOW,
        poll_interval=settings.STREAM_POLL_INTERVAL,
        staging_retention=settings.STREAM_RETENTION,
    )

    # after an apply window that succeeded; not after a failed one
    @task.short_circuit(task_id="maintenance_due", trigger_rule=TriggerRule.NONE_FAILED)
    def is_maintenance_due(data_interval_start=None, data_interval_end=None) -> bool:
        """Let the housekeeping run once per STREAM_MAINTENANCE_EVERY (continuous runs' intervals are contiguous)."""
        return maintenance_due(data_interval_start, data_interval_end, settings.STREAM_MAINTENANCE_EVERY)

    maintenance = IcebergMaintenanceOperator(
        task_id="maintenance",
        conn_id=settings.SPARK_CONN_ID,
        iceberg=ICEBERG,
        older_than_hours=settings.STREAM_SNAPSHOT_HOURS,  # each round is a snapshot in the metadata
    )
    publication >> snapshot >> pull
    apply >> is_maintenance_due() >> maintenance
