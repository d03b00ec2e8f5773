"""Airflow conventions: nothing resolved at parse time, permanent errors are not retried, the
arguments a DAG author varies are templated, the deferrable default comes from Airflow's config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.exceptions import (
    ConcurrentRunError,
    InvalidInputError,
    PipelineStateError,
    PublicationError,
    PublisherCheckError,
    SlotError,
)
from airflow_provider_pglogical.operators._errors import PermanentError, fail_permanent_errors
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.iceberg_maintenance import IcebergMaintenanceOperator
from airflow_provider_pglogical.operators.publication import PgCheckPublisherOperator, PgCreatePublicationOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.subscription import PgCreateSubscriptionOperator
from airflow_provider_pglogical.operators.verify import PgVerifyOperator
from airflow_provider_pglogical.verification.witness import LakehouseDiffers
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.sensors.pglogical import PgSlotLagSensor, PgSubscriptionReadySensor

DAGS = Path(__file__).resolve().parents[2] / "dags"


def _python(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **(env or {})}, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)


def test_example_dags_import_without_the_jars(tmp_path):
    # The jar folder is an empty one in a fresh interpreter: as if set-up had not resolved the jars.
    code = f"""
import json, sys
sys.path.insert(0, {str(DAGS)!r})
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergJarNotFound, iceberg_runtime_jar
try:
    iceberg_runtime_jar()
    missing = False
except IcebergJarNotFound:
    missing = True
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder={str(DAGS)!r})
print(json.dumps({{"missing": missing, "errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                  "dags": sorted(bag.dag_ids)}}))
"""
    proc = _python(code, {"PGLOGICAL_JARS_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["missing"] is True  # the jar really was unavailable
    assert out["errors"] == {}
    assert "pglogical_lakehouse_sync" in out["dags"] and "pglogical_backfill" in out["dags"]


@pytest.mark.parametrize("setting, expected", [("True", True), ("False", False)])
def test_sensors_take_the_deferrable_default_from_airflow_config(setting, expected):
    code = """
from airflow_provider_pglogical.sensors.pglogical import PgSlotLagSensor, PgSubscriptionReadySensor
print(PgSlotLagSensor(task_id="lag", slot="s").deferrable, PgSubscriptionReadySensor(task_id="r", subscription="s").deferrable)
"""
    proc = _python(code, {"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": setting})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].split() == [str(expected), str(expected)]
    assert PgSlotLagSensor(task_id="lag", slot="s", deferrable=True).deferrable is True


@pytest.mark.parametrize("error, permanent", [
    (InvalidInputError("bad name"), True),
    (PipelineStateError("no snapshot yet"), True),
    (PublicationError("publication 'p' does not exist"), True),
    (PublisherCheckError(["wal_level is replica"]), True),
    (LakehouseDiffers("differs"), True),
    (SlotError("slot 's' was invalidated", permanent=True), True),
    (SlotError("slot 's' is in use"), False),
    (ConcurrentRunError("another pull holds the lock"), False),
])
def test_permanent_errors_fail_without_retry_and_keep_their_message(error, permanent):
    assert error.permanent is permanent
    with pytest.raises(Exception) as caught:
        with fail_permanent_errors():
            raise error
    if permanent:
        assert isinstance(caught.value, AirflowFailException) and isinstance(caught.value, PermanentError)
        assert isinstance(caught.value, type(error))  # `except SlotError:` still catches it
        assert str(caught.value) == str(error) and caught.value.__cause__ is error
        assert getattr(caught.value, "problems", None) == getattr(error, "problems", None)
    else:
        assert caught.value is error and not isinstance(caught.value, AirflowFailException)


def test_bad_input_fails_the_task_without_retry():
    op = PgSlotPullOperator(task_id="pull", slot="s", publications=["p"], staging_root="relative/path",
                            pipeline="p", postgres_conn_id="pg_nowhere")
    with pytest.raises(AirflowFailException, match="staging path 'relative/path' is not an absolute URI"):
        op.execute({})


def test_dag_authors_can_template_connections_tables_and_the_lakehouse():
    context = {"ds": "2024-01-01", "params": {"env": "prod", "table": "public.orders", "region": "EU"}}
    publication = PgCreatePublicationOperator(
        task_id="pub", publication="p_{{ params.env }}", postgres_conn_id="pg_{{ params.env }}",
        tables=["{{ params.table }}", {"name": "public.items", "where": "region = '{{ params.region }}'"},
                PublishedTable("public.kept")])
    publication.render_template_fields(context)
    assert publication.postgres_conn_id == "pg_prod"
    assert publication.tables[:2] == ["public.orders", {"name": "public.items", "where": "region = 'EU'"}]
    assert publication.tables[2] == PublishedTable("public.kept")

    apply = IcebergApplyOperator(task_id="apply", staging_root="file:///s", pipeline="p",
                                 iceberg=IcebergConfig(catalog="{{ params.env }}", warehouse="s3a://wh/{{ params.env }}",
                                                       namespace="ns_{{ params.env }}"),
                                 table_map={"public.orders": "orders_{{ params.env }}"})
    apply.render_template_fields(context)
    assert (apply.iceberg.catalog, apply.iceberg.warehouse, apply.iceberg.namespace) == ("prod", "s3a://wh/prod", "ns_prod")
    assert apply.table_map == {"public.orders": "orders_prod"}

    verify = PgVerifyOperator(task_id="verify", publications=["p"], staging_root="file:///s", pipeline="p",
                              postgres_conn_id="pg_{{ params.env }}", iceberg=IcebergConfig(namespace="{{ params.env }}"),
                              table_map={"public.orders": "{{ params.env }}"})
    verify.render_template_fields(context)
    assert (verify.postgres_conn_id, verify.iceberg.namespace, verify.table_map) == ("pg_prod", "prod",
                                                                                    {"public.orders": "prod"})
    for op in (PgSlotPullOperator(task_id="a", slot="s", publications=["p"], staging_root="file:///s", pipeline="p",
                                  postgres_conn_id="pg_{{ params.env }}"),
               PgCheckPublisherOperator(task_id="b", publications=["p"], postgres_conn_id="pg_{{ params.env }}"),
               PgCreateSubscriptionOperator(task_id="c", subscription="s", publications=["p"],
                                            publisher_conn_id="pg_{{ params.env }}", postgres_conn_id="pg_{{ params.env }}"),
               PgSlotLagSensor(task_id="d", slot="s", postgres_conn_id="pg_{{ params.env }}"),
               PgSubscriptionReadySensor(task_id="e", subscription="s", postgres_conn_id="pg_{{ params.env }}")):
        op.render_template_fields(context)
        assert op.postgres_conn_id == "pg_prod", op.task_id


def test_spark_operators_resolve_the_lakehouse_only_when_they_run():
    maintain = IcebergMaintenanceOperator(task_id="m", iceberg=IcebergConfig(jars=None, warehouse="file:///wh"),
                                          conf={"spark.ui.enabled": "false"})
    apply = IcebergApplyOperator(task_id="a", staging_root="file:///s", pipeline="p", conf={"spark.ui.enabled": "false"})
    assert maintain.conf == apply.conf == {"spark.ui.enabled": "false"}
