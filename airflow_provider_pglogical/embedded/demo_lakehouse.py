"""Where the demo's lakehouse is: the embedded default, or object storage with a transactional catalog.

``local`` (the default): an Iceberg Hadoop catalog on a local directory. ``s3``: the production
shape (docs/lakehouse.md): the warehouse on moto's S3 server on loopback, Iceberg's JDBC catalog
in a database of the demo's PostgreSQL, both reached through Airflow connections given as
environment variables, like the demo's other connections. The S3 secret and the catalog's
password are made up per run and reach Spark only through the operators' private properties file.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_pglogical.embedded.object_store import S3Server, require_moto, start_s3_server
from airflow_provider_pglogical.embedded.postgres import LocalPostgres

LAKEHOUSES = ("local", "s3")
BUCKET = "demo-lake"
WAREHOUSE_PREFIX = "warehouse"
#: Iceberg's JDBC catalog: its own database and role in the demo's PostgreSQL
CATALOG_DB = "iceberg_catalog"
CATALOG_USER = "iceberg"
#: the Airflow connections the example DAGs read (dags/pglogical_settings.py)
CATALOG_CONN_ID = "pglogical_catalog"
STORAGE_CONN_ID = "pglogical_lake_s3"


@dataclass
class DemoLakehouse:
    """The demo's lakehouse: the variables the DAGs read, what the summary says, what to stop."""

    env: dict[str, str]
    where: str
    #: values the demo must never print (a failed command's output is shown)
    redact: list[str] = field(default_factory=list)
    s3: S3Server | None = None

    def describe(self) -> str:
        """Where the lakehouse is, for the summary (with the warehouse's object count on S3)."""
        if self.s3 is None:
            return self.where
        objects = len(self.s3.keys(BUCKET, f"{WAREHOUSE_PREFIX}/"))  # moto takes any key
        return f"{self.where} ({objects:,} objects)"

    def close(self, keep: bool) -> None:
        """Stop the S3 server, or leave it running with ``--keep`` and say where it is."""
        if self.s3 is None:
            return
        if keep:
            print(f"  the S3 server keeps running at {self.s3.endpoint} (pid {self.s3.process.pid}; "
                  "it holds the warehouse in memory: stop it with `kill <pid>`)")
        else:
            self.s3.stop()


def check(kind: str) -> None:
    """What ``kind`` needs, checked before the demo changes anything: moto, the S3A and JDBC jars."""
    if kind == "s3":
        from airflow_provider_pglogical.lakehouse.iceberg_config import postgresql_jdbc_jar, s3a_jars

        require_moto()
        s3a_jars()
        postgresql_jdbc_jar()


def local_lakehouse(home: Path) -> DemoLakehouse:
    """The embedded default: a Hadoop catalog on a directory of the demo's home."""
    warehouse = (home / "warehouse").as_uri()
    return DemoLakehouse(env={"PGLOGICAL_WAREHOUSE": warehouse}, where=f"Iceberg Hadoop catalog, warehouse {warehouse}")


def s3_lakehouse(pg: LocalPostgres) -> DemoLakehouse:
    """Start the S3 server with a bucket, create the catalog's database and role, and name them in
    Airflow connections: the warehouse on ``s3a://``, the catalog ``jdbc``."""
    from psycopg2 import sql

    key, secret, password = f"demo-{secrets.token_hex(4)}", secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    server = start_s3_server()
    try:
        server.client(key, secret).create_bucket(Bucket=BUCKET)
        conn = pg.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(CATALOG_USER)),
                            (password,))
                cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(CATALOG_DB),
                                                                         sql.Identifier(CATALOG_USER)))
        finally:
            conn.close()
    except BaseException:
        server.stop()
        raise
    warehouse = f"s3a://{BUCKET}/{WAREHOUSE_PREFIX}"
    staging = f"s3://{STORAGE_CONN_ID}@{BUCKET}/staging"  # the connection in the root, as ObjectStoragePath takes it
    env = {
        "PGLOGICAL_WAREHOUSE": warehouse,
        "PGLOGICAL_STAGING": staging,
        "PGLOGICAL_CATALOG_TYPE": "jdbc",
        "PGLOGICAL_CATALOG_CONN_ID": CATALOG_CONN_ID,
        "PGLOGICAL_STORAGE_CONN_ID": STORAGE_CONN_ID,
        f"AIRFLOW_CONN_{CATALOG_CONN_ID.upper()}": json.dumps(
            {"conn_type": "postgres", "host": pg.host, "port": pg.port, "schema": CATALOG_DB,
             "login": CATALOG_USER, "password": password}),
        f"AIRFLOW_CONN_{STORAGE_CONN_ID.upper()}": json.dumps(
            {"conn_type": "aws", "login": key, "password": secret,
             "extra": {"endpoint_url": server.endpoint, "region_name": "us-east-1"}}),
    }
    where = (f"Iceberg JDBC catalog in database {CATALOG_DB} on {pg.host}:{pg.port}, "
             f"warehouse {warehouse} and staging {staging} on the S3 server {server.endpoint}")
    return DemoLakehouse(env=env, where=where, redact=[secret, password], s3=server)
