"""The catalog kinds: one enum, one table, and what each kind's entry makes of a config.

Adding a kind is a :class:`CatalogKind` member, its :data:`CATALOGS` entry and a case here.
The end-to-end proof of each kind on an S3 server is tests/integration/test_object_store_lakehouse.py.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.catalog_kinds import (
    CATALOGS,
    CatalogConnection,
    CatalogKind,
    FileIOKind,
    catalog_kind,
)
from airflow_provider_pglogical.lakehouse.catalog_tables import lists_tables_without_spark
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.lakehouse_access import job_access, lakehouse_access, spark_environment


def test_every_kind_has_one_entry_that_names_it():
    assert set(CATALOGS) == set(CatalogKind)
    assert all(spec.kind is kind for kind, spec in CATALOGS.items())
    assert len({spec.impl for spec in CATALOGS.values()}) == len(CATALOGS)
    for spec in CATALOGS.values():  # a credential is one of the kind's own keys, and only ever private
        assert set(spec.private_keys) <= set(spec.conf_keys), spec.kind


@pytest.mark.parametrize(("catalog_type", "catalog_impl", "kind"), [
    ("hadoop", None, CatalogKind.HADOOP), ("JDBC", None, CatalogKind.JDBC), (CatalogKind.REST, None, CatalogKind.REST),
    (None, "org.apache.iceberg.aws.glue.GlueCatalog", CatalogKind.GLUE),
    ("hadoop", "org.apache.iceberg.nessie.NessieCatalog", CatalogKind.NESSIE),  # the class wins, as in Iceberg
    (None, "com.example.OurCatalog", None), (None, None, None),
])
def test_a_config_names_its_kind_by_type_or_by_class(catalog_type, catalog_impl, kind):
    assert catalog_kind(catalog_type, catalog_impl) is kind


def test_an_unknown_type_is_refused_before_anything_runs_naming_the_known_ones():
    config = IcebergConfig(catalog_type="polaris", catalog_uri="http://c")
    with pytest.raises(InvalidInputError, match=r"'polaris' is not an Iceberg catalog type .*'rest'.*catalog_impl"):
        config.spark_conf()


@pytest.mark.parametrize("kind", [CatalogKind.JDBC, CatalogKind.REST])
def test_a_kind_that_needs_a_uri_or_a_connection_is_refused_without_either(kind):
    with pytest.raises(InvalidInputError, match=f"is a {kind.value} catalog without catalog_uri or catalog_conn_id"):
        IcebergConfig(catalog_type=kind, warehouse="s3a://b/wh").spark_conf()


@pytest.mark.parametrize("kind", [kind for kind, spec in CATALOGS.items() if not spec.transactional])
def test_a_catalog_that_commits_by_rename_is_refused_on_an_object_store(kind):
    with pytest.raises(InvalidInputError, match="atomic rename"):
        IcebergConfig(catalog_type=kind, warehouse="s3a://b/wh").spark_conf()


@pytest.mark.parametrize(("kind", "file_io"), [
    (CatalogKind.JDBC, FileIOKind.HADOOP), (CatalogKind.REST, FileIOKind.S3), (CatalogKind.GLUE, FileIOKind.S3)])
def test_the_warehouse_file_io_on_s3_follows_the_table(kind, file_io):
    config = IcebergConfig(catalog_type=kind, catalog_uri="x://c", warehouse="s3://b/wh", jars=[])
    assert config.file_io() is file_io is CATALOGS[kind].file_io_on_s3
    conf = config.spark_conf()
    assert conf.get("spark.sql.catalog.lake.io-impl") == (file_io.value if file_io is FileIOKind.S3 else None)
    assert conf["spark.sql.catalog.lake.type"] == kind.value
    # a warehouse on the local disk keeps Hadoop's FileIO whatever the catalog
    assert IcebergConfig(catalog_type=kind, catalog_uri="x://c", warehouse="/tmp/wh").file_io() is FileIOKind.HADOOP


def test_only_the_kinds_whose_tables_the_worker_can_list_are_asked_without_spark():
    for kind, spec in CATALOGS.items():
        config = IcebergConfig(catalog_type=kind, catalog_conn_id="cat")
        assert lists_tables_without_spark(config) is spec.lists_tables_without_spark, kind


def _connections(monkeypatch, **conns):
    for conn_id, conn in conns.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_a_rest_catalog_takes_its_uri_and_oauth2_client_from_an_iceberg_connection_the_secret_private(monkeypatch):
    _connections(monkeypatch, lake_rest={"conn_type": CatalogConnection.ICEBERG.value, "host": "http://127.0.0.1:8181",
                                         "login": "client", "password": "s3cr3t", "extra": {"scope": "catalog"}},
                 lake_s3={"conn_type": "aws", "login": "key", "password": "secret",
                          "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}})
    config = IcebergConfig(catalog_type="rest", catalog_conn_id="lake_rest", storage_conn_id="lake_s3",
                           warehouse="s3://lake/wh")
    access = lakehouse_access(config)
    p = "spark.sql.catalog.lake."
    assert access.public[p + "uri"] == "http://127.0.0.1:8181"
    assert access.private[p + "credential"] == "client:s3cr3t" and access.private[p + "scope"] == "catalog"
    assert access.public[p + "s3.endpoint"] == "http://127.0.0.1:9000"
    assert access.public[p + "s3.path-style-access"] == "true" and access.public[p + "client.region"] == "eu-west-1"
    assert access.private[p + "s3.access-key-id"] == "key" and access.private[p + "s3.secret-access-key"] == "secret"
    assert not any(secret in value for value in access.public.values() for secret in ("s3cr3t", "secret"))
    assert not access.environment


def test_a_rest_catalog_reports_no_metrics_unless_the_config_or_its_connection_asks(monkeypatch):
    """The REST client's metrics reports are two POSTs per table and round (the request count is
    proven against the real fixture in tests/integration/test_rest_requests.py); a deployment may
    turn them back on, by ``extra_conf`` or by its connection's extra, which the default never overrides."""
    key = "spark.sql.catalog.lake.rest-metrics-reporting-enabled"
    rest = IcebergConfig(catalog_type="rest", catalog_uri="http://127.0.0.1:8181", warehouse="s3://lake/wh")
    assert rest.spark_conf()[key] == "false"
    assert IcebergConfig(catalog_type="rest", catalog_uri="http://c", extra_conf={key: "true"}).spark_conf()[key] == "true"
    assert not any("metrics" in name for kind in CatalogKind if kind is not CatalogKind.REST
                   for name in IcebergConfig(catalog_type=kind, catalog_uri="jdbc:postgresql://h/db",
                                             catalog_conn_id="c").spark_conf())
    _connections(monkeypatch, lake_rest={"conn_type": "iceberg", "host": "http://127.0.0.1:8181",
                                         "extra": {"rest-metrics-reporting-enabled": "true"}})
    access = job_access(IcebergConfig(catalog_type="rest", catalog_conn_id="lake_rest"))
    assert access.private[key] == "true" and key not in access.public  # a --conf value would win over the file


def test_a_rest_client_id_without_its_secret_is_refused(monkeypatch):
    _connections(monkeypatch, lake_rest={"conn_type": "iceberg", "host": "https://c", "login": "client"})
    with pytest.raises(InvalidInputError, match="'lake_rest' has an OAuth2 client id without its secret"):
        lakehouse_access(IcebergConfig(catalog_type="rest", catalog_conn_id="lake_rest"))


def test_glue_takes_endpoint_and_region_from_an_aws_connection_and_its_keys_only_through_the_environment(monkeypatch):
    _connections(monkeypatch, lake_glue={"conn_type": "aws", "login": "gkey", "password": "gsecret",
                                         "extra": {"endpoint_url": "http://127.0.0.1:5000", "region_name": "us-east-1"}},
                 spark_yarn={"conn_type": "spark", "host": "yarn"}, spark_local={"conn_type": "spark", "host": "local[1]"})
    config = IcebergConfig(catalog_type="glue", catalog_conn_id="lake_glue", warehouse="s3://lake/wh")
    access = lakehouse_access(config)
    assert access.public["spark.sql.catalog.lake.glue.endpoint"] == "http://127.0.0.1:5000"
    assert access.environment == {"AWS_ACCESS_KEY_ID": "gkey", "AWS_SECRET_ACCESS_KEY": "gsecret", "AWS_REGION": "us-east-1"}
    assert "gsecret" not in json.dumps([access.public, access.private])
    assert spark_environment(access, {"SPARK_LOCAL_IP": "127.0.0.1"}, "spark_local") == {
        "SPARK_LOCAL_IP": "127.0.0.1", **access.environment}
    # on YARN the Spark provider would put the environment on the command line: refused, naming the fix
    with pytest.raises(InvalidInputError, match="would reach the command line.*IAM role"):
        spark_environment(access, None, "spark_yarn")


def test_no_module_but_the_table_compares_catalog_kind_names():
    """Adding a kind is one module (docs/architecture.md): any other place asks the entry or compares
    :class:`CatalogKind` members, never a kind's name as a string (``kind == "rest"``). The embedded
    demo's ``--lakehouse local|s3|rest`` is a choice of its own command line, not a catalog kind."""
    package = Path(__file__).resolve().parents[2] / "airflow_provider_pglogical"
    names = {kind.value for kind in CatalogKind}
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative == "lakehouse/catalog_kinds.py" or relative.startswith("embedded/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                texts = {side.value.lower() for side in sides if isinstance(side, ast.Constant) and isinstance(side.value, str)}
                texts |= {element.value.lower() for side in sides if isinstance(side, (ast.Tuple, ast.List, ast.Set))
                          for element in side.elts if isinstance(element, ast.Constant) and isinstance(element.value, str)}
                if texts & names:
                    found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], f"compare CatalogKind members or read CATALOGS[kind] instead: {found}"
