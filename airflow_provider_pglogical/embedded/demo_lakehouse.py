"""Where the demo's lakehouse is: the embedded default, or object storage with a transactional catalog.

``local`` (the default): an Iceberg Hadoop catalog on a local directory. ``s3``: the production
shape (docs/lakehouse.md): the warehouse on moto's S3 server on loopback, Iceberg's JDBC catalog
in a database of the demo's PostgreSQL, both reached through Airflow connections given as
environment variables, like the demo's other connections. ``rest``: the warehouse on the same S3
server through Iceberg's S3FileIO, the tables in Iceberg's REST catalog fixture on loopback
(``rest_catalog.py``) behind OAuth2 client credentials from an ``iceberg`` connection. The S3
secret, the catalog's password and its client secret are made up per run and reach Spark only
through the operators' private properties file.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_pglogical.embedded.object_store import S3Server, require_moto, start_s3_server
from airflow_provider_pglogical.embedded.postgres import LocalPostgres
from airflow_provider_pglogical.embedded.rest_catalog import RestCatalogServer, RestCatalogSettings, start_rest_catalog

LAKEHOUSES = ("local", "s3", "rest")
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
    rest: RestCatalogServer | None = None

    def describe(self) -> str:
        """Where the lakehouse is, for the summary (with the warehouse's object count on S3)."""
        if self.s3 is None:
            return self.where
        objects = len(self.s3.keys(BUCKET, f"{WAREHOUSE_PREFIX}/"))  # moto takes any key
        return f"{self.where} ({objects:,} objects)"

    def close(self, keep: bool) -> None:
        """Stop the S3 server (and the REST catalog), or leave them running with ``--keep`` and say where."""
        if self.rest is not None:
            if keep:
                print(f"  the REST catalog keeps running at {self.rest.uri} (pid {self.rest.process.pid}; it holds "
                      "its tables in memory: stop it with `kill <pid>`)")
            else:
                self.rest.stop()
        if self.s3 is None:
            return
        if keep:
            print(f"  the S3 server keeps running at {self.s3.endpoint} (pid {self.s3.process.pid}; "
                  "it holds the warehouse in memory: stop it with `kill <pid>`)")
        else:
            self.s3.stop()


def check(kind: str) -> None:
    """What ``kind`` needs, checked before the demo changes anything: moto, the S3A and JDBC jars, the
    REST catalog's jars and iceberg-aws-bundle."""
    from airflow_provider_pglogical.lakehouse.iceberg_config import iceberg_aws_jars, postgresql_jdbc_jar, s3a_jars

    if kind in ("s3", "rest"):
        require_moto()
        s3a_jars()
    if kind == "s3":
        postgresql_jdbc_jar()
    if kind == "rest":
        from airflow_provider_pglogical.embedded.rest_catalog import RESOLVE_HINT, RestCatalogUnavailable, problems

        iceberg_aws_jars()
        if problems():
            raise RestCatalogUnavailable(f"the REST catalog's jars are not ready: {RESOLVE_HINT}")


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


def rest_lakehouse(home: Path, log_requests: bool = False) -> DemoLakehouse:
    """Start the S3 server with a bucket and the REST catalog (its warehouse in that bucket), and name
    them in Airflow connections: the catalog ``rest`` (an ``iceberg`` connection: URI, client id and
    secret), the warehouse on ``s3://`` through S3FileIO. ``log_requests``: the S3 server logs each
    request into ``home`` (``s3.log_path``), as the REST catalog always does (``rest.log_path``)."""
    key, secret, client_secret = f"demo-{secrets.token_hex(4)}", secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    client_id = "pglogical-demo"
    server = start_s3_server(log_path=home / "s3-server.log" if log_requests else None)
    try:
        server.client(key, secret).create_bucket(Bucket=BUCKET)
        warehouse = f"s3://{BUCKET}/{WAREHOUSE_PREFIX}"
        rest = start_rest_catalog(RestCatalogSettings(warehouse=warehouse, s3_endpoint=server.endpoint,
                                                      access_key=key, secret_key=secret, client_id=client_id,
                                                      client_secret=client_secret), log_dir=home)
    except BaseException:
        server.stop()
        raise
    staging = f"s3://{STORAGE_CONN_ID}@{BUCKET}/staging"
    env = {
        "PGLOGICAL_WAREHOUSE": warehouse,
        "PGLOGICAL_STAGING": staging,
        "PGLOGICAL_CATALOG_TYPE": "rest",
        "PGLOGICAL_CATALOG_CONN_ID": CATALOG_CONN_ID,
        "PGLOGICAL_STORAGE_CONN_ID": STORAGE_CONN_ID,
        f"AIRFLOW_CONN_{CATALOG_CONN_ID.upper()}": json.dumps(
            {"conn_type": "iceberg", "host": rest.uri, "login": client_id, "password": client_secret,
             "extra": {"scope": "catalog"}}),
        f"AIRFLOW_CONN_{STORAGE_CONN_ID.upper()}": json.dumps(
            {"conn_type": "aws", "login": key, "password": secret,
             "extra": {"endpoint_url": server.endpoint, "region_name": "us-east-1"}}),
    }
    where = (f"Iceberg REST catalog (Iceberg's REST fixture {rest.uri}, OAuth2 client credentials), "
             f"warehouse {warehouse} (S3FileIO) and staging {staging} on the S3 server {server.endpoint}")
    return DemoLakehouse(env=env, where=where, redact=[secret, client_secret], s3=server, rest=rest)
