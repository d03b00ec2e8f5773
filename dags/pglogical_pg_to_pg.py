"""PostgreSQL → PostgreSQL with native logical replication, managed from Airflow.

Creates the publication on the publisher and a subscription on the subscriber (whose tables
must exist), then waits until every table finished its initial copy. Connections:
``PGLOGICAL_SOURCE_CONN_ID`` (publisher) and ``PGLOGICAL_TARGET_CONN_ID`` (subscriber, default
``pglogical_target``).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_pglogical import PgCreatePublicationOperator, PgCreateSubscriptionOperator
from airflow_provider_pglogical.sensors.pglogical import PgSubscriptionReadySensor

import pglogical_settings as settings

TARGET_CONN_ID = os.environ.get("PGLOGICAL_TARGET_CONN_ID", "pglogical_target")
PUBLICATION = os.environ.get("PGLOGICAL_PG2PG_PUBLICATION", "shop_replica")
SUBSCRIPTION = os.environ.get("PGLOGICAL_PG2PG_SUBSCRIPTION", "shop_replica")

with DAG(
    dag_id="pglogical_pg_to_pg",
    description="Native logical replication from one PostgreSQL to another",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["pglogical", "postgres"],
) as dag:
    publication = PgCreatePublicationOperator(
        task_id="publication",
        postgres_conn_id=settings.SOURCE_CONN_ID,
        publication=PUBLICATION,
        tables=settings.TABLES,
        publish_via_partition_root=settings.PUBLISH_VIA_PARTITION_ROOT,
    )
    subscription = PgCreateSubscriptionOperator(
        task_id="subscription",
        postgres_conn_id=TARGET_CONN_ID,
        subscription=SUBSCRIPTION,
        publications=[PUBLICATION],
        publisher_conn_id=settings.SOURCE_CONN_ID,
    )
    ready = PgSubscriptionReadySensor(
        task_id="ready",
        postgres_conn_id=TARGET_CONN_ID,
        subscription=SUBSCRIPTION,
        poke_interval=2,
        timeout=600,
        deferrable=False,
    )
    publication >> subscription >> ready
