"""The apply and verify jobs hand their results back through a file under staging, not stdout.

``spark-submit`` is replaced on PATH by a wrapper that throws the driver's stdout and stderr away
(as YARN and Kubernetes cluster deploy modes do): the operators still get the steps applied,
emit one asset event per changed Iceberg table, and verify still compares. Real PostgreSQL,
real Spark (local), real Iceberg.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
from airflow.sdk import AssetAlias, ObjectStoragePath
from airflow.sdk.execution_time.context import OutletEventAccessors

# the exception the operator raises, wherever this Airflow keeps it (airflow.sdk.exceptions from 3.1)
from airflow_provider_pglogical.operators.iceberg_apply import AirflowSkipException, IcebergApplyOperator
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.publication import PgCreatePublicationOperator
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.operators.verify import PgVerifyOperator

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE orders(id int PRIMARY KEY, status text NOT NULL, total numeric(10,2));
CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL);
INSERT INTO orders SELECT g, 'new', g * 1.5 FROM generate_series(1, 40) g;
INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 7) g;
"""


@pytest.fixture
def silent_spark_submit(tmp_path, monkeypatch):
    """``spark-submit`` on PATH that runs the real one with its stdout and stderr discarded."""
    real = shutil.which("spark-submit")
    assert real, "spark-submit must be on PATH (pyspark)"
    bin_dir = tmp_path / "silent-bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "spark-submit"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@" >/dev/null 2>&1\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return wrapper


@pytest.fixture
def usual_umask():
    """The usual default umask, under which files would be 0644 and directories 0755."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _apply(staging: str, iceberg: IcebergConfig, task_id: str, **kwargs):
    operator = IcebergApplyOperator(task_id=task_id, staging_root=staging, pipeline="shop", iceberg=iceberg,
                                    conf={"spark.ui.enabled": "false"}, env_vars={"SPARK_LOCAL_IP": "127.0.0.1"},
                                    **kwargs)
    events = OutletEventAccessors()
    result = operator.execute({"outlet_events": events})
    alias_events = events[AssetAlias("pglogical_apply_shop")].asset_alias_events
    return result, {event.dest_asset_key.uri: event.extra for event in alias_events}, operator


def test_apply_and_verify_results_arrive_with_the_driver_output_thrown_away(
    publisher, publisher_hook, silent_spark_submit, tmp_path, monkeypatch, usual_umask
):
    publisher.execute(SOURCE)
    staging = f"file://{tmp_path}/staging"
    iceberg = IcebergConfig(warehouse=f"file://{tmp_path}/warehouse", namespace="shop")
    common = {"postgres_conn_id": publisher.conn_id, "staging_root": staging, "pipeline": "shop"}
    PgCreatePublicationOperator(task_id="pub", publication="shop", tables=["public.orders", "public.customers"],
                                postgres_conn_id=publisher.conn_id).execute({})
    PgInitialSyncOperator(task_id="sync", slot="shop", publications=["shop"], **common).execute({})

    first, first_assets, operator = _apply(staging, iceberg, "apply1")
    assert first["tables"] == ["public.customers", "public.orders"] and first["steps"] == 2 and first["rows"] == 47
    assert sorted(first_assets) == ["iceberg://lake/shop/public__customers", "iceberg://lake/shop/public__orders"]
    assert first_assets["iceberg://lake/shop/public__orders"]["rows"] == 40
    assert first_assets["iceberg://lake/shop/public__orders"]["source_table"] == "public.orders"
    # the operator adds no JVM tuning of its own: that is the deployment's Spark conf
    assert "spark.driver.extraJavaOptions" not in operator.conf

    publisher.execute("UPDATE orders SET status = 'paid' WHERE id <= 3; DELETE FROM orders WHERE id = 40")
    pulled = PgSlotPullOperator(task_id="pull", slot="shop", publications=["shop"], **common).execute({})
    second, second_assets, operator = _apply(staging, iceberg, "apply2")
    # the job says where its time went, phase by phase, within its own time
    assert set(operator._job_phases) == {"listing", "lease", "state_read", "planning", "steps", "state_commits",
                                         "compaction", "retention"}
    assert sum(operator._job_phases.values()) <= operator._job_seconds + 0.01
    # only the table the batch changed gets an asset event, positioned at the batch's end
    assert second["tables"] == ["public.orders"] and second["rows"] == 4
    assert list(second_assets) == ["iceberg://lake/shop/public__orders"]
    assert second_assets["iceberg://lake/shop/public__orders"]["lsn"] == pulled["end_lsn"]
    assert pulled["batch"].endswith(second_assets["iceberg://lake/shop/public__orders"]["batch"])
    # the result files are read and removed; nothing else is left in _results
    assert list(ObjectStoragePath(f"{staging}/shop/_results").iterdir()) == []
    # staged rows and the pipeline's files, written by the tasks and by the job, are private to
    # this OS user, whatever the umask (the usual_umask fixture: 022)
    written = list((tmp_path / "staging").rglob("*"))
    assert {oct(_mode(path)) for path in written if path.is_file()} == {"0o600"}
    assert {oct(_mode(path)) for path in [tmp_path / "staging", *written] if path.is_dir()} == {"0o700"}

    # An idle tick (an empty pull commits no batch) starts no Spark: a master that does not exist
    # proves the apply never submitted anything.
    assert PgSlotPullOperator(task_id="pull", slot="shop", publications=["shop"], **common).execute({})["batch"] is None
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1:9"}))
    with pytest.raises(AirflowSkipException, match="nothing to apply: every committed batch of pipeline shop"):
        _apply(staging, iceberg, "idle")
    # A batch committed since the last apply is never skipped.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    publisher.execute("UPDATE orders SET status = 'sent' WHERE id = 5")
    PgSlotPullOperator(task_id="pull", slot="shop", publications=["shop"], **common).execute({})
    third, _, operator = _apply(staging, iceberg, "apply3")
    assert third["tables"] == ["public.orders"] and third["rows"] == 1

    # An Iceberg table dropped while the pipeline is idle (a Hadoop catalog's DROP TABLE removes its
    # directory): the idle tick finds its metadata file gone, without a JVM, and runs the job,
    # which rebuilds it from staging, instead of skipping until the next batch
    shutil.rmtree(tmp_path / "warehouse" / "shop" / "public__customers")
    rebuilt, _, _ = _apply(staging, iceberg, "rebuild")
    assert rebuilt["tables"] == ["public.customers"] and rebuilt["rows"] == 7

    verified = PgVerifyOperator(task_id="verify", publications=["shop"], iceberg=iceberg,
                                **common).execute({})
    assert verified["equal"] is True and verified["tables"] == {"public.orders": 39, "public.customers": 7}
