"""The lakehouse on object storage, without Spark: jars, catalog properties, refusals, credentials.

The end-to-end proof (an S3 server, a JDBC catalog, the apply, no secret on a command line or in
a log) is tests/integration/test_object_store_lakehouse.py.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from airflow.exceptions import AirflowFailException

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.iceberg_config import (
    OBJECT_STORE_SCHEMES,
    IcebergConfig,
    IcebergJarNotFound,
    iceberg_runtime_jar,
    postgresql_jdbc_jar,
    s3a_jars,
)
from airflow_provider_pglogical.lakehouse.lakehouse_access import (
    LakehouseAccess,
    escape_property,
    job_access,
    lakehouse_access,
    private_properties,
)
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.operators.iceberg_maintenance import IcebergMaintenanceOperator


def test_the_jars_of_s3_and_of_the_jdbc_catalog_are_found_where_setup_put_them():
    import pyspark

    hadoop = next((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")).name
    hadoop_version = hadoop.removeprefix("hadoop-client-api-").removesuffix(".jar")
    hadoop_aws, sdk, *_rest = (Path(jar) for jar in s3a_jars())
    # hadoop-aws of the very Hadoop PySpark ships, and the AWS SDK bundle it was built with
    assert hadoop_aws.name == f"org.apache.hadoop_hadoop-aws-{hadoop_version}.jar" and hadoop_aws.is_file()
    assert sdk.name in ("com.amazonaws_aws-java-sdk-bundle-1.12.262.jar", "software.amazon.awssdk_bundle-2.24.6.jar")
    assert sdk.is_file()
    assert Path(postgresql_jdbc_jar()).name == "org.postgresql_postgresql-42.7.14.jar"


def test_missing_s3_jars_name_the_setup_script(monkeypatch, tmp_path):
    monkeypatch.setenv("PGLOGICAL_JARS_DIR", str(tmp_path))
    with pytest.raises(IcebergJarNotFound, match=r"S3A file system's jars .*bash scripts/setup.sh.*"
                                                 r"org.apache.hadoop:hadoop-aws:3\.[34]\.\d"):
        s3a_jars()


def test_a_jdbc_catalog_on_s3_gets_its_jars_and_s3a_for_every_s3_scheme_and_no_credential():
    config = IcebergConfig(catalog_type="jdbc", catalog_uri="jdbc:postgresql://db:5432/iceberg",
                           warehouse="s3a://bucket/warehouse", namespace="shop")
    conf = config.spark_conf()
    assert conf["spark.jars"].split(",") == [iceberg_runtime_jar(), *s3a_jars(), postgresql_jdbc_jar()]
    assert conf["spark.sql.catalog.lake.type"] == "jdbc"
    assert conf["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db:5432/iceberg"
    assert conf["spark.hadoop.fs.s3.impl"] == conf["spark.hadoop.fs.s3n.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert not [key for key in conf if "key" in key or "password" in key or "user" in key]


@pytest.mark.parametrize("scheme", OBJECT_STORE_SCHEMES)
def test_a_hadoop_catalog_on_an_object_store_is_refused_naming_the_catalogs_to_use(scheme):
    config = IcebergConfig(warehouse=f"{scheme}://bucket/warehouse")
    with pytest.raises(InvalidInputError) as refused:
        config.spark_conf()
    message = str(refused.value)
    assert f"Hadoop catalog on the object store warehouse {scheme}://bucket/warehouse" in message
    assert "atomic rename" in message
    assert all(name in message for name in ("catalog_type='jdbc'", "catalog_type='rest'", "catalog_type='glue'"))
    # a transactional catalog there, or a Hadoop catalog on a file system, is fine
    IcebergConfig(catalog_type="rest", catalog_uri="http://rest:8181", warehouse=f"{scheme}://bucket/wh",
                  jars=[]).spark_conf()
    IcebergConfig(warehouse="file:///data/warehouse").check()
    IcebergConfig(warehouse="hdfs://namenode/warehouse").check()


def test_the_apply_refuses_a_hadoop_catalog_on_s3_before_anything_is_read_or_written(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    operator = IcebergApplyOperator(task_id="apply", staging_root=staging.as_uri(), pipeline="p",
                                    iceberg=IcebergConfig(warehouse="s3a://bucket/warehouse"))
    with pytest.raises(AirflowFailException, match="Hadoop catalog on the object store warehouse s3a://bucket/warehouse"):
        operator.execute({})
    assert list(staging.rglob("*")) == []  # no marker, no result file, no lock: nothing happened
    assert getattr(operator, "_hook", None) is None  # spark-submit was never prepared
    housekeeping = IcebergMaintenanceOperator(task_id="maintenance", iceberg=IcebergConfig(warehouse="s3://b/wh"))
    with pytest.raises(AirflowFailException, match="Hadoop catalog on the object store warehouse s3://b/wh"):
        housekeeping.execute({})
    assert getattr(housekeeping, "_hook", None) is None


def test_credentials_come_from_connections_and_only_the_private_properties_hold_them(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps({
        "conn_type": "aws", "login": "AKIAEXAMPLE", "password": "s3-secret",
        "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}}))
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_CATALOG", "postgres://iceberg:catalog-secret@db.internal:6432/catalog")
    config = IcebergConfig(catalog_type="jdbc", catalog_conn_id="lake_catalog", warehouse="s3a://bucket/wh",
                           storage_conn_id="lake_s3")
    access = lakehouse_access(config)
    assert access.public == {
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.sql.catalog.lake.uri": "jdbc:postgresql://db.internal:6432/catalog",
    }
    assert access.private == {
        "spark.hadoop.fs.s3a.access.key": "AKIAEXAMPLE",
        "spark.hadoop.fs.s3a.secret.key": "s3-secret",
        "spark.sql.catalog.lake.jdbc.user": "iceberg",
        "spark.sql.catalog.lake.jdbc.password": "catalog-secret",
    }
    assert "secret" not in json.dumps({**config.spark_conf(), **access.public})
    # what a spark-submit of ours gets: the catalog's conf, the lakehouse's and a staging root's
    # access, the secrets of both only in the private part
    staging = LakehouseAccess(public={"spark.hadoop.fs.s3a.bucket.stage.endpoint": "http://127.0.0.1:9001"},
                              private={"spark.hadoop.fs.s3a.bucket.stage.secret.key": "staging-secret"})
    job = job_access(config, staging)
    assert job.public == {**config.spark_conf(), **access.public, **staging.public}
    assert job.private == {**access.private, **staging.private}
    assert "secret" not in json.dumps(job.public)
    assert job_access(config).private == access.private


def test_a_key_without_its_secret_is_refused_naming_the_connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps({"conn_type": "aws", "login": "AKIAEXAMPLE"}))
    with pytest.raises(InvalidInputError, match="connection 'lake_s3' has an access key without its secret"):
        lakehouse_access(IcebergConfig(catalog_type="jdbc", warehouse="s3a://b/wh", storage_conn_id="lake_s3"))


def test_the_private_properties_file_is_the_users_defaults_then_the_secrets_readable_by_its_owner_only(tmp_path):
    defaults = tmp_path / "spark-defaults.conf"
    defaults.write_text("spark.eventLog.enabled true\n")
    with private_properties({"spark.hadoop.fs.s3a.secret.key": "a=b:c\\d #!ü"}, str(defaults)) as path:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert Path(path).read_text(encoding="latin-1") == (
            "spark.eventLog.enabled true\nspark.hadoop.fs.s3a.secret.key=a=b:c\\\\d #!\\u00fc\n")
    assert not os.path.exists(path)
    with private_properties({}, str(defaults)) as path:
        assert path == str(defaults)  # nothing private: the user's file as it is


def test_property_escaping_follows_java_properties():
    assert escape_property("a b=c:d", key=True) == "a\\ b\\=c\\:d"
    assert escape_property(" lead\ttab\nline") == "\\ lead\\ttab\\nline"
    assert escape_property("#x!") == "\\#x!"
    assert escape_property("😀") == "\\ud83d\\ude00"


def test_only_a_jdbc_catalog_reached_through_its_connection_is_asked_for_its_tables_by_the_idle_tick():
    from airflow_provider_pglogical.lakehouse.catalog_tables import catalog_metadata_locations, lists_tables_without_spark

    s3 = {"warehouse": "s3a://b/wh"}
    assert lists_tables_without_spark(IcebergConfig(catalog_type="jdbc", catalog_conn_id="cat", **s3))
    assert lists_tables_without_spark(IcebergConfig(catalog_type="JDBC", catalog_conn_id="cat"))
    for config in (IcebergConfig(), IcebergConfig(catalog_type="rest", catalog_uri="https://c", **s3),
                   IcebergConfig(catalog_type="jdbc", catalog_uri="jdbc:postgresql://h/db", **s3),
                   IcebergConfig(catalog_type="jdbc", catalog_conn_id="cat", catalog_uri="jdbc:postgresql://h/db"),
                   IcebergConfig(catalog_impl="org.apache.iceberg.aws.glue.GlueCatalog", catalog_conn_id="cat", **s3)):
        assert not lists_tables_without_spark(config), config
        assert catalog_metadata_locations(config, ["orders"]) is None  # not asked: the tick trusts the marker
