"""Settings shared by the example DAGs, read from the environment so no host is hard-coded.

Copy the DAGs and change these defaults, or set the variables where Airflow runs:

- ``PGLOGICAL_SOURCE_CONN_ID``: the publisher's ``postgres`` connection (default ``pglogical_source``)
- ``PGLOGICAL_STAGING``: staging root URI (default ``file://$AIRFLOW_HOME/pglogical/staging``)
- ``PGLOGICAL_WAREHOUSE``: Iceberg warehouse URI (default ``file://$AIRFLOW_HOME/pglogical/warehouse``)
- ``PGLOGICAL_CATALOG_TYPE``: the Iceberg catalog's type (default ``hadoop``, the embedded one; on an
  object store a transactional one: ``jdbc``, ``rest``, ``glue``; docs/lakehouse.md)
- ``PGLOGICAL_CATALOG_CONN_ID``: for ``jdbc``, the ``postgres`` connection of the catalog's database
  (default none)
- ``PGLOGICAL_CATALOG_URI``: the catalog's ``uri`` when no connection gives it (a REST URL; default none)
- ``PGLOGICAL_STORAGE_CONN_ID``: the ``aws`` connection of an ``s3a://`` warehouse: keys, endpoint
  (default none: the machine's AWS credentials chain)
- ``PGLOGICAL_NAMESPACE``: the Iceberg namespace of the tables (default ``shop``)
- ``PGLOGICAL_SPARK_CONN_ID``: the Spark connection (default ``spark_default``; host ``local[*]`` for local mode)
- ``PGLOGICAL_MAINTENANCE_EVERY_HOURS``: how often the sync DAG runs the Iceberg housekeeping (default 6)
- ``PGLOGICAL_STREAM_WINDOW_MINUTES`` / ``PGLOGICAL_STREAM_PULL_SECONDS`` / ``PGLOGICAL_STREAM_POLL_SECONDS``:
  how long each run of the streaming DAG keeps pulling and applying, how often it pulls, and how
  often the apply looks for new batches (default 10 minutes, 1 s, 0.5 s)
- ``PGLOGICAL_STREAM_LEAD_SECONDS``: how long two runs of the streaming DAG overlap, so that the next
  run's windows are ready when the previous ones end (default 60: its task starts and JVM start)
- ``PGLOGICAL_STREAM_RETENTION_HOURS``: how long the streaming DAG keeps applied batches in staging
  (default 0.5: it stages a batch per poll, and every poll lists what is kept)
- ``PGLOGICAL_STREAM_MAINTENANCE_EVERY_HOURS`` / ``PGLOGICAL_STREAM_SNAPSHOT_HOURS``: how often the
  streaming pipeline's housekeeping DAG runs, and how old a snapshot it expires (default 1 and 1: a
  round a second adds a snapshot a second to each changed table's metadata)
- ``PGLOGICAL_WATCH_SECONDS``: how often the event-driven apply's watcher lists the staging area for
  new batches (default 30; ``pglogical_lakehouse_events.py``)
- ``PGLOGICAL_DRIVER_JAVA_OPTIONS``: the apply driver's JVM options (default C1 only, docs/operators.md
  "Tuning the driver JVM"; set it empty to keep the JVM's defaults)
- ``PGLOGICAL_TASK_RETRIES`` / ``PGLOGICAL_RETRY_DELAY_SECONDS``: how often and after how long
  Airflow retries a failed task of the sync DAG (default 2, after 30 s)
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path

from airflow_provider_pglogical import IcebergConfig

_home = Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")).resolve()

SOURCE_CONN_ID = os.environ.get("PGLOGICAL_SOURCE_CONN_ID", "pglogical_source")
SPARK_CONN_ID = os.environ.get("PGLOGICAL_SPARK_CONN_ID", "spark_default")
STAGING = os.environ.get("PGLOGICAL_STAGING", (_home / "pglogical" / "staging").as_uri())
WAREHOUSE = os.environ.get("PGLOGICAL_WAREHOUSE", (_home / "pglogical" / "warehouse").as_uri())

#: the pipeline of the lakehouse DAGs: what to publish and where it goes
PIPELINE = os.environ.get("PGLOGICAL_PIPELINE", "shop")
PUBLICATION = os.environ.get("PGLOGICAL_PUBLICATION", "shop_lake")
SLOT = os.environ.get("PGLOGICAL_SLOT", "shop_lake")
NAMESPACE = os.environ.get("PGLOGICAL_NAMESPACE", "shop")
TABLES = [
    {"name": "public.customers"},
    {"name": "public.orders", "columns": ["id", "customer_id", "region", "status", "total", "created_at", "note"],
     "where": "region = 'EU'"},
    {"name": "public.products", "columns": ["sku", "name", "price", "tags", "attributes"]},
    {"name": "public.events"},
]
PUBLISH_VIA_PARTITION_ROOT = True


def iceberg_config(environ: Mapping[str, str] = os.environ) -> IcebergConfig:
    """The lakehouse every example DAG applies to, maintains and verifies, from ``environ``: a fresh
    config per DAG (operators render its templates), and the demo builds it from its own run's environment."""
    return IcebergConfig(
        catalog_type=environ.get("PGLOGICAL_CATALOG_TYPE") or "hadoop",
        catalog_conn_id=environ.get("PGLOGICAL_CATALOG_CONN_ID") or None,
        catalog_uri=environ.get("PGLOGICAL_CATALOG_URI") or None,
        storage_conn_id=environ.get("PGLOGICAL_STORAGE_CONN_ID") or None,
        warehouse=environ.get("PGLOGICAL_WAREHOUSE") or WAREHOUSE,
        namespace=environ.get("PGLOGICAL_NAMESPACE") or NAMESPACE,
    )


#: the sync DAG compacts, expires and cleans the Iceberg tables after the apply of one run in every
#: period (the run whose data interval holds 00:00, 06:00, 12:00 or 18:00 UTC with 6 hours)
MAINTENANCE_EVERY = dt.timedelta(hours=float(os.environ.get("PGLOGICAL_MAINTENANCE_EVERY_HOURS", "6")))

#: the streaming DAG's windows: a run starts every STREAM_WINDOW and pulls and applies for that long
#: plus STREAM_LEAD (a task start, a DAG run and a JVM start once per window), looking for changes
#: every STREAM_POLL_INTERVAL seconds
STREAM_WINDOW = dt.timedelta(minutes=float(os.environ.get("PGLOGICAL_STREAM_WINDOW_MINUTES", "10")))
#: how long two runs overlap: the next run's pull window starts pulling beside the previous one,
#: and its apply window starts its JVM, warms it up and takes the lease over the moment the previous
#: window releases it, so there is never a time with no pull and no apply (docs/streaming.md). It
#: must cover a run's start: the scheduler's delay, the task starts and the JVM's start (measured
#: here 10-40 s on a busy 2-core machine)
STREAM_LEAD = dt.timedelta(seconds=float(os.environ.get("PGLOGICAL_STREAM_LEAD_SECONDS", "60")))
STREAM_POLL_INTERVAL = float(os.environ.get("PGLOGICAL_STREAM_POLL_SECONDS", "0.5"))
#: seconds between two pulls of the streaming DAG: each pull that finds changes stages a batch, and
#: the apply pays a data commit and a state commit per batch (about 0.4 s idle, over 1 s on a busy
#: 2-core machine), so the pull also waits while STREAM_MAX_UNAPPLIED batches are not applied yet
STREAM_PULL_INTERVAL = float(os.environ.get("PGLOGICAL_STREAM_PULL_SECONDS", "1"))
STREAM_MAX_UNAPPLIED = 2
#: applied batches the streaming DAG keeps: up to one per poll is staged, and each poll lists them
#: all, so a week's worth (the sync DAG's retention) would slow every poll; a dropped Iceberg table
#: older than this is rebuilt by a backfill instead of from staging (docs/streaming.md)
STREAM_RETENTION = dt.timedelta(hours=float(os.environ.get("PGLOGICAL_STREAM_RETENTION_HOURS", "0.5")))

#: the streaming pipeline's housekeeping (its own DAG, beside the windows): how often, and the snapshots it keeps. Every apply round commits
#: each table it changes (a round a second when changes keep coming), and a table's metadata file
#: lists every snapshot not expired, rewritten at each commit: after 500 rounds it was 0.5 MB; a day
#: of them kept (the sync DAG's 24 hours) would be ~80 MB per commit. An hour's snapshots keep
#: it to a few MB, and time travel works within that hour (docs/streaming.md, "What it costs")
STREAM_MAINTENANCE_EVERY = dt.timedelta(hours=float(os.environ.get("PGLOGICAL_STREAM_MAINTENANCE_EVERY_HOURS", "1")))
STREAM_SNAPSHOT_HOURS = float(os.environ.get("PGLOGICAL_STREAM_SNAPSHOT_HOURS", "1"))

#: the event-driven apply (pglogical_lakehouse_events.py): seconds between two listings of the
#: staging area by its asset watcher, in the triggerer (a listing, no JVM)
WATCH_INTERVAL = float(os.environ.get("PGLOGICAL_WATCH_SECONDS", "30"))

#: JVM options of the apply's Spark driver: a deployment's setting, kept here so the example's small
#: ticks start quickly (docs/operators.md, "Tuning the driver JVM"); the operators set none themselves
DRIVER_JAVA_OPTIONS = os.environ.get("PGLOGICAL_DRIVER_JAVA_OPTIONS",
                                     "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m")
SPARK_CONF = {"spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS} if DRIVER_JAVA_OPTIONS else {}

#: retries of the sync DAG's tasks: every task is idempotent, so a retry applies exactly what is left
TASK_RETRIES = int(os.environ.get("PGLOGICAL_TASK_RETRIES", "2"))
RETRY_DELAY = dt.timedelta(seconds=float(os.environ.get("PGLOGICAL_RETRY_DELAY_SECONDS", "30")))
