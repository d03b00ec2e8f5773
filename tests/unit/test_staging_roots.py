"""A staging root on both sides, without Spark or a server: the s3:// → s3a:// mapping, its
connection, what Spark is given, and the roots refused before anything is written.

The end-to-end proof (capture and apply staging on an S3 server, retention there, no secret on a
command line or in a log) is tests/integration/test_object_store_lakehouse.py.
"""

from __future__ import annotations

import json

import pytest
from airflow.exceptions import AirflowFailException

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig, s3a_jars
from airflow_provider_pglogical.lakehouse.staging_roots import (
    check_staging_store,
    spark_uri,
    staging_access,
    staging_conn_id,
)
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgBackfillOperator, PgInitialSyncOperator


@pytest.fixture
def lake_s3(monkeypatch):
    """An aws connection ``lake_s3`` to an S3-compatible endpoint."""
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_S3", json.dumps({
        "conn_type": "aws", "login": "AKIAEXAMPLE", "password": "s3-secret",
        "extra": {"endpoint_url": "http://127.0.0.1:9000"}}))
    return "lake_s3"


@pytest.mark.parametrize("root, spark", [
    ("s3://lake_s3@bucket/staging", "s3a://bucket/staging"),
    ("s3a://lake_s3@bucket/staging/", "s3a://bucket/staging/"),
    ("s3n://bucket/a/b", "s3a://bucket/a/b"),
    ("S3://bucket.with.dots/x", "s3a://bucket.with.dots/x"),
    ("file:///data/staging", "file:///data/staging"),
    ("gs://bucket/staging", "gs://bucket/staging"),
    ("abfs://container@account.dfs.core.windows.net/staging", "abfs://container@account.dfs.core.windows.net/staging"),
])
def test_an_s3_root_reaches_spark_as_s3a_without_its_connection_and_other_roots_unchanged(root, spark):
    assert spark_uri(root) == spark


def test_the_connection_is_the_roots_user_part():
    assert staging_conn_id("s3://lake_s3@bucket/staging") == "lake_s3"
    assert staging_conn_id("s3://bucket/staging") is None
    assert staging_conn_id("file:///data/staging") is None


def test_the_apply_job_gets_the_s3a_root_and_the_result_location_on_it(lake_s3):
    operator = IcebergApplyOperator(task_id="apply", staging_root="s3://lake_s3@bucket/staging", pipeline="p")
    assert operator.apply_options().staging_root == "s3a://bucket/staging"


@pytest.mark.parametrize("root, fix", [
    ("gs://bucket/staging", "pip install apache-airflow-providers-google"),
    ("abfs://container@account.dfs.core.windows.net/staging", "pip install apache-airflow-providers-microsoft-azure"),
    ("nosuchfs://bucket/staging", "install the Airflow provider that registers a file system for nosuchfs://"),
])
def test_a_root_whose_file_system_is_not_installed_is_refused_naming_what_to_install(root, fix):
    with pytest.raises(InvalidInputError) as refused:
        check_staging_store(root)
    assert f"staging root {root}: no file system for" in str(refused.value) and fix in str(refused.value)


def test_an_s3_root_without_s3fs_names_the_extra(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "s3fs" else find_spec(name, *a))
    with pytest.raises(InvalidInputError, match=r"airflow-provider-pglogical\[s3\]"):
        check_staging_store("s3://lake_s3@bucket/staging")


def test_an_s3_root_needs_a_connection_that_exists(lake_s3):
    with pytest.raises(InvalidInputError, match=r"names no Airflow connection.*s3://<aws_conn_id>@bucket/staging"):
        check_staging_store("s3://bucket/staging")
    with pytest.raises(InvalidInputError, match="Airflow connection 'nowhere' is not defined"):
        check_staging_store("s3://nowhere@bucket/staging")
    assert check_staging_store("s3://lake_s3@bucket/staging") == "s3://lake_s3@bucket/staging"
    assert check_staging_store("file:///data/staging") == "file:///data/staging"


@pytest.mark.parametrize("make", [
    lambda root: PgInitialSyncOperator(task_id="sync", slot="s", publications=["p"], pipeline="p",
                                       staging_root=root, postgres_conn_id="not_defined_either"),
    lambda root: PgSlotPullOperator(task_id="pull", slot="s", publications=["p"], pipeline="p",
                                    staging_root=root, postgres_conn_id="not_defined_either"),
    lambda root: PgBackfillOperator(task_id="backfill", tables=["public.t"], publications=["p"], pipeline="p",
                                    staging_root=root, postgres_conn_id="not_defined_either"),
    lambda root: IcebergApplyOperator(task_id="apply", staging_root=root, pipeline="p"),
], ids=["initial-sync", "pull", "backfill", "apply"])
def test_every_operator_refuses_an_s3_root_without_connection_before_it_touches_anything(make, monkeypatch):
    operator = make("s3://bucket/staging")
    monkeypatch.setattr(type(operator), "run_spark_submit", lambda *a: pytest.fail("spark-submit started"),
                        raising=False)
    with pytest.raises(AirflowFailException, match=r"names no Airflow connection.*s3://<aws_conn_id>@bucket/staging"):
        operator.execute({})  # its publisher's connection is not defined either: it was never looked up


def test_spark_gets_s3a_jars_and_the_staging_connection_per_bucket_with_the_keys_private(lake_s3, monkeypatch):
    local = IcebergConfig(warehouse="file:///data/warehouse")
    conf = local.spark_conf()
    access = staging_access("s3://lake_s3@staging-bucket/p", local, conf)
    assert access.public == {
        "spark.jars": ",".join([conf["spark.jars"], *s3a_jars()]),
        "spark.hadoop.fs.s3a.bucket.staging-bucket.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.bucket.staging-bucket.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.bucket.staging-bucket.path.style.access": "true",
    }
    assert access.private == {"spark.hadoop.fs.s3a.bucket.staging-bucket.access.key": "AKIAEXAMPLE",
                              "spark.hadoop.fs.s3a.bucket.staging-bucket.secret.key": "s3-secret"}
    assert staging_access("file:///data/staging", local, conf).public == {}


def test_staging_on_the_warehouses_connection_adds_nothing_and_one_bucket_with_two_connections_is_refused(lake_s3,
                                                                                                          monkeypatch):
    lake = IcebergConfig(catalog_type="jdbc", catalog_uri="jdbc:postgresql://db/x", warehouse="s3a://lake/wh",
                         storage_conn_id="lake_s3")
    same = staging_access("s3://lake_s3@lake/staging", lake, lake.spark_conf())
    assert same.public == same.private == {}  # the warehouse's S3A properties and jars reach it already
    monkeypatch.setenv("AIRFLOW_CONN_OTHER_S3", json.dumps({"conn_type": "aws"}))
    with pytest.raises(InvalidInputError, match=r"share bucket 'lake' but name different connections .*'other_s3'"):
        staging_access("s3://other_s3@lake/staging", lake, lake.spark_conf())
    assert staging_access("s3://other_s3@another/staging", lake, lake.spark_conf()).private == {}  # no keys: its chain
