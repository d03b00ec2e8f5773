"""One lakehouse per catalog kind on the S3 server, for the tests and benchmarks that run on each.

Each kind's lakehouse is what a deployment configures: the warehouse in a bucket of the loopback
S3 server (moto's), the catalog's credentials in Airflow connections, and a real catalog:

- ``jdbc``: Iceberg's JDBC catalog in a database of the test PostgreSQL cluster (warehouse through S3A);
- ``rest``: Iceberg's REST catalog fixture on loopback behind OAuth2 client credentials
  (``embedded/rest_catalog.py``), from an ``iceberg`` connection, warehouse through S3FileIO;
- ``glue``: moto's Glue API (the same moto server), from an ``aws`` connection, warehouse through S3FileIO.

Each comes with the secrets that must never show (on a command line, in a log) and a way to ask
its catalog which tables it lists, by the catalog's own API.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_pglogical.embedded.object_store import S3Server
from airflow_provider_pglogical.embedded.rest_catalog import RestCatalogServer, RestCatalogSettings, start_rest_catalog
from airflow_provider_pglogical.lakehouse.catalog_kinds import CatalogConnection, CatalogKind
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from tests.support.databases import Database
from tests.support.environment import subprocess_env

STORAGE_CONN_ID = "pglogical_lake_s3"
REST_CONN_ID = "pglogical_lake_rest"
GLUE_CONN_ID = "pglogical_lake_glue"
REGION = "us-east-1"
#: the REST catalog's OAuth2 client (its secret is made per server)
REST_CLIENT_ID = "pglogical-tests"


@dataclass
class RestCatalog:
    """A REST catalog server of the tests, with the bucket it keeps its warehouse in."""

    server: RestCatalogServer
    bucket: str
    client_secret: str

    def token(self) -> str:
        form = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": REST_CLIENT_ID,
                                       "client_secret": self.client_secret, "scope": "catalog"}).encode()
        with urllib.request.urlopen(f"{self.server.uri}/v1/oauth/tokens", data=form, timeout=10) as answer:
            return json.load(answer)["access_token"]

    def tables(self, namespace: str) -> list[str]:
        """The tables the catalog lists in ``namespace``, asked by its REST API."""
        request = urllib.request.Request(f"{self.server.uri}/v1/namespaces/{namespace}/tables",
                                         headers={"Authorization": f"Bearer {self.token()}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return sorted(identifier["name"] for identifier in json.load(answer)["identifiers"])


def start_test_rest_catalog(s3_server: S3Server, bucket: str) -> RestCatalog:
    """A REST catalog whose warehouse is ``s3://<bucket>/warehouse`` on ``s3_server`` (the bucket is made)."""
    s3_server.create_bucket(bucket)
    secret = f"rest-secret-{uuid.uuid4().hex}"
    settings = RestCatalogSettings(warehouse=f"s3://{bucket}/warehouse", s3_endpoint=s3_server.endpoint,
                                   access_key="rest-server-key", secret_key=f"rest-s3-{uuid.uuid4().hex}",
                                   client_id=REST_CLIENT_ID, client_secret=secret, region=REGION)
    return RestCatalog(start_rest_catalog(settings, env=subprocess_env()), bucket, secret)


@dataclass
class CatalogUnderTest:
    """A lakehouse of one catalog kind: its config, the secrets that must not show, and its catalog's listing.

    :param table_prefix: the bucket key prefix of the namespace's tables (Glue's locations end in ``.db``).
    :param logs: files a server of the test wrote (they must hold no secret either).
    """

    kind: CatalogKind
    iceberg: IcebergConfig
    bucket: str
    secrets: list[str]
    listed: Callable[[], list[str]]
    table_prefix: str
    logs: list[Path] = field(default_factory=list)
    catalog_db: Database | None = None


def lakehouse_on(kind: CatalogKind, s3_server: S3Server, setenv: Callable[[str, str], None], *, namespace: str,
                 bucket: str, rest: RestCatalog | None = None, catalog_db: Database | None = None) -> CatalogUnderTest:
    """The lakehouse of ``kind`` on ``s3_server``, its Airflow connections registered through ``setenv``.

    :param rest: the REST catalog (kind ``rest``: its bucket is the warehouse's).
    :param catalog_db: the JDBC catalog's database (kind ``jdbc``).
    """
    if rest is None:
        s3_server.create_bucket(bucket)
    s3_secret = f"s3-secret-{uuid.uuid4().hex}"
    setenv(f"AIRFLOW_CONN_{STORAGE_CONN_ID.upper()}", json.dumps(
        {"conn_type": "aws", "login": "lake-key", "password": s3_secret,
         "extra": {"endpoint_url": s3_server.endpoint, "region_name": REGION}}))
    if kind is CatalogKind.JDBC:
        assert catalog_db is not None
        iceberg = IcebergConfig(catalog_type=kind, catalog_conn_id=catalog_db.conn_id, warehouse=f"s3a://{bucket}/warehouse",
                                storage_conn_id=STORAGE_CONN_ID, namespace=namespace)
        query = "SELECT table_name FROM iceberg_tables WHERE table_namespace = %s"
        return CatalogUnderTest(kind, iceberg, bucket, [s3_secret, catalog_db.cluster.password],
                                lambda: sorted(name for (name,) in catalog_db.query(query, (namespace,))),
                                f"warehouse/{namespace}/", catalog_db=catalog_db)
    if kind is CatalogKind.REST:
        assert rest is not None
        setenv(f"AIRFLOW_CONN_{REST_CONN_ID.upper()}", json.dumps(
            {"conn_type": CatalogConnection.ICEBERG.value, "host": rest.server.uri, "login": REST_CLIENT_ID,
             "password": rest.client_secret, "extra": {"scope": "catalog"}}))
        iceberg = IcebergConfig(catalog_type=kind, catalog_conn_id=REST_CONN_ID, warehouse=f"s3://{rest.bucket}/warehouse",
                                storage_conn_id=STORAGE_CONN_ID, namespace=namespace)
        return CatalogUnderTest(kind, iceberg, rest.bucket, [s3_secret, rest.client_secret],
                                lambda: rest.tables(namespace), f"warehouse/{namespace}/", [rest.server.log_path])
    if kind is CatalogKind.GLUE:
        glue_secret = f"glue-secret-{uuid.uuid4().hex}"
        setenv(f"AIRFLOW_CONN_{GLUE_CONN_ID.upper()}", json.dumps(
            {"conn_type": CatalogConnection.AWS.value, "login": "glue-key", "password": glue_secret,
             "extra": {"endpoint_url": s3_server.endpoint, "region_name": REGION}}))
        iceberg = IcebergConfig(catalog_type=kind, catalog_conn_id=GLUE_CONN_ID, warehouse=f"s3://{bucket}/warehouse",
                                storage_conn_id=STORAGE_CONN_ID, namespace=namespace)

        def glue_tables() -> list[str]:
            import boto3

            glue = boto3.client("glue", endpoint_url=s3_server.endpoint, region_name=REGION,
                                aws_access_key_id="glue-key", aws_secret_access_key=glue_secret)
            return sorted(table["Name"] for table in glue.get_tables(DatabaseName=namespace)["TableList"])

        return CatalogUnderTest(kind, iceberg, bucket, [s3_secret, glue_secret], glue_tables,
                                f"warehouse/{namespace}.db/")
    raise ValueError(f"no test lakehouse for catalog kind {kind}")
