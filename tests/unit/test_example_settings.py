"""The example DAGs' lakehouse comes from the environment (dags/pglogical_settings.py), as the demo's
``--lakehouse s3`` sets it: the catalog, its connection, the storage connection, the warehouse."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig

DAGS = Path(__file__).resolve().parents[2] / "dags"
S3_LAKEHOUSE = {
    "PGLOGICAL_CATALOG_TYPE": "jdbc",
    "PGLOGICAL_CATALOG_CONN_ID": "pglogical_catalog",
    "PGLOGICAL_STORAGE_CONN_ID": "pglogical_lake_s3",
    "PGLOGICAL_WAREHOUSE": "s3a://demo-lake/warehouse",
    "PGLOGICAL_NAMESPACE": "shop",
}
VARIABLES = [*S3_LAKEHOUSE, "PGLOGICAL_CATALOG_URI"]


def load_settings(monkeypatch, environ: dict[str, str]):
    """A fresh import of the settings module under ``environ`` (and an AIRFLOW_HOME of its own)."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "pglogical_settings", raising=False)
    monkeypatch.syspath_prepend(str(DAGS))
    spec = importlib.util.spec_from_file_location("pglogical_settings", DAGS / "pglogical_settings.py")
    settings = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(settings)
    monkeypatch.setitem(sys.modules, "pglogical_settings", settings)
    return settings


def test_without_catalog_variables_the_dags_keep_the_embedded_hadoop_catalog(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    settings = load_settings(monkeypatch, {})
    assert settings.iceberg_config() == IcebergConfig(
        catalog_type="hadoop", warehouse=(tmp_path / "pglogical" / "warehouse").resolve().as_uri(), namespace="shop")


def test_the_catalog_storage_and_warehouse_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    settings = load_settings(monkeypatch, S3_LAKEHOUSE)
    expected = IcebergConfig(catalog_type="jdbc", catalog_conn_id="pglogical_catalog",
                             storage_conn_id="pglogical_lake_s3", warehouse="s3a://demo-lake/warehouse",
                             namespace="shop")
    assert settings.iceberg_config() == expected
    # a mapping of the caller's own (the demo's run) wins over the process's environment
    rest = {"PGLOGICAL_CATALOG_TYPE": "rest", "PGLOGICAL_CATALOG_URI": "https://catalog.example/api",
            "PGLOGICAL_WAREHOUSE": "s3a://other/wh"}
    assert settings.iceberg_config(rest) == IcebergConfig(
        catalog_type="rest", catalog_uri="https://catalog.example/api", warehouse="s3a://other/wh", namespace="shop")


@pytest.mark.parametrize("dag_file, tasks", [("pglogical_lakehouse_sync.py", ["apply", "maintenance"]),
                                             ("pglogical_lakehouse_stream.py", ["apply_window"]),
                                             ("pglogical_lakehouse_housekeeping.py", ["maintenance"]),
                                             ("pglogical_backfill.py", ["apply"]),
                                             ("pglogical_lakehouse_events.py", ["apply"])])
def test_every_example_dag_that_reaches_iceberg_uses_the_configured_lakehouse(monkeypatch, tmp_path, dag_file, tasks):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    settings = load_settings(monkeypatch, S3_LAKEHOUSE)
    bag = DagBag(dag_folder=str(DAGS / dag_file))
    assert bag.import_errors == {}
    dag = next(dag for dag in bag.dags.values() if dag.has_task(tasks[0]))  # the events file has two DAGs
    for task_id in tasks:
        assert dag.get_task(task_id).iceberg == settings.iceberg_config(), task_id
