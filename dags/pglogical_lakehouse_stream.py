"""PostgreSQL → Apache Iceberg, streaming: each run pulls and applies for a window of minutes.

The sync DAG pays a DAG run, seven task starts and a Spark JVM for every pull and apply, so a
commit waits for the next tick and that tick's apply (p95 ≈ two ticks, 15-20 s at best). Here one
run holds a pull window and an apply window side by side: the pull stages a batch every
``STREAM_PULL_INTERVAL`` seconds (1) when there are changes (and waits while the apply is two
batches behind: larger batches, not more), and the apply's Spark session, started once per window,
looks every ``STREAM_POLL_INTERVAL`` seconds (0.5) and applies each new batch in a round
(docs/streaming.md).

**No stall at a boundary.** A run starts every ``settings.STREAM_WINDOW`` (10 minutes) and its
windows last that plus ``settings.STREAM_LEAD`` (60 s), with ``max_active_runs=2``: the next run's
windows start before the previous ones end. Its pull window pulls beside the previous one (each
pull takes the slot's consumer lock, waiting for the other's pull in flight). Its apply window
starts its JVM, warms it up, and waits for the lease: the previous window hands it over when it
ends (``spark/apply/lease.py``; a window still holding it a minute past its promised end is treated
as any other holder: the task fails and is retried), and the wait counts as part of the window, so
windows do not drift. So there is never a time with no pull and no apply, only one round's handover.
``@continuous`` cannot do this: Airflow holds it to one active run.

The apply window does not wait for the setup tasks: its JVM starts while the publication and the
initial sync (which find their work done after the first run) take their task starts, and it
applies the initial snapshot in a round as soon as it is committed. The housekeeping runs in a DAG
of its own (``pglogical_lakehouse_housekeeping.py``), beside the windows: it never holds a window
up, and a round that meets its commit on the same files is applied again at the next poll. Run this
DAG or the sync DAG for a pipeline, not both.

Cost: one Airflow worker slot for each window task and one Spark driver, held for the whole window;
twice that during the lead.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, DeltaTriggerTimetable

from airflow_provider_pglogical import (
    IcebergApplyOperator,
    PgCreatePublicationOperator,
    PgInitialSyncOperator,
    PgSlotPullOperator,
)

import pglogical_settings as settings

ICEBERG = settings.iceberg_config()
#: each window's length: a run's own period plus the overlap with the next run
WINDOW = settings.STREAM_WINDOW + settings.STREAM_LEAD

with DAG(
    dag_id="pglogical_lakehouse_stream",
    description="Streaming sync of published PostgreSQL tables into Apache Iceberg, in windows",
    schedule=DeltaTriggerTimetable(settings.STREAM_WINDOW),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,  # the previous run's windows end while this run's start
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
        keep_running=WINDOW,
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
        keep_running=WINDOW,
        poll_interval=settings.STREAM_POLL_INTERVAL,
        staging_retention=settings.STREAM_RETENTION,
    )

    publication >> snapshot >> pull  # the apply window beside them from the run's start: no upstream
