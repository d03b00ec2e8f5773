"""The streaming pipeline's Iceberg housekeeping, in a DAG of its own beside the windows.

Every apply round commits each table it changes, so the streaming DAG's tables gather a snapshot
a second and small files: compaction, snapshot expiry and orphan removal must run often (every
``settings.STREAM_MAINTENANCE_EVERY``, an hour by default; snapshots older than
``STREAM_SNAPSHOT_HOURS`` expire). Run inside the streaming DAG's runs, after the apply window, it
held the next window up for its whole duration (87 s measured at a boundary: docs/benchmarks.md).
Here it runs while the windows keep applying: no commit of either is blind (every apply commit
validates what it read, and so does the compaction's), so when the two meet on the same files one
commits nothing; an apply round that meets it is applied again at the next poll
(``spark/jobs/apply_window.py``), a compaction group that meets a round is left for the next run.
Orphan removal only takes files a day old, so a round's files in flight are never taken
(tests/integration/test_housekeeping_beside_commits.py runs it beside a running window).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, DeltaTriggerTimetable

from airflow_provider_pglogical import IcebergMaintenanceOperator

import pglogical_settings as settings

with DAG(
    dag_id="pglogical_lakehouse_housekeeping",
    description="Iceberg housekeeping of the streaming pipeline's tables, beside its windows",
    schedule=DeltaTriggerTimetable(settings.STREAM_MAINTENANCE_EVERY),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": settings.TASK_RETRIES, "retry_delay": settings.RETRY_DELAY},
    tags=["pglogical", "iceberg", "streaming", "housekeeping"],
) as dag:
    IcebergMaintenanceOperator(
        task_id="maintenance",
        conn_id=settings.SPARK_CONN_ID,
        iceberg=settings.iceberg_config(),
        older_than_hours=settings.STREAM_SNAPSHOT_HOURS,  # each round is a snapshot in the metadata
    )
