"""IcebergConfig and IcebergApplyOperator without running Spark (maintenance: test_housekeeping.py)."""

from __future__ import annotations

import json

from datetime import timedelta
from pathlib import Path

import pytest

from airflow_provider_pglogical.lakehouse.lakehouse_access import jars_for_master, local_class_path
from airflow_provider_pglogical.operators import iceberg_apply
from airflow_provider_pglogical.lakehouse.iceberg_config import (
    ICEBERG_EXTENSIONS,
    IcebergConfig,
    IcebergJarNotFound,
    iceberg_runtime_jar,
)
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, IcebergApplyOperator
from airflow_provider_pglogical.operators.iceberg_maintenance import IcebergMaintenanceOperator
from airflow_provider_pglogical.spark.jobs import apply_changes, maintenance
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions


def test_runtime_jar_is_the_one_spark_resolved_from_its_maven_coordinates():
    import pyspark

    jar = Path(iceberg_runtime_jar())
    line = ".".join(pyspark.__version__.split(".")[:2])
    scala = {"3.5": "2.12"}.get(line, "2.13")
    assert jar.name == f"org.apache.iceberg_iceberg-spark-runtime-{line}_{scala}-1.10.1.jar" and jar.is_file()
    assert jar.parent.parent.name == "ivy"  # Spark's Ivy retrieved it into <ivy>/jars


def test_missing_jar_names_the_setup_step_and_the_coordinates(monkeypatch, tmp_path):
    monkeypatch.setenv("PGLOGICAL_JARS_DIR", str(tmp_path))
    with pytest.raises(IcebergJarNotFound, match=r"bash scripts/setup.sh.*IcebergConfig\(packages=\['org.apache.iceberg:"
                                                 r"iceberg-spark-runtime-"):
        iceberg_runtime_jar()


def test_default_config_is_the_embedded_hadoop_catalog(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    conf = IcebergConfig().spark_conf()
    assert conf == {
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.catalog.lake": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.lake.type": "hadoop",
        "spark.sql.catalog.lake.warehouse": (tmp_path / "lakehouse").as_uri(),
        "spark.jars": iceberg_runtime_jar(),
    }


def test_cluster_config_uses_packages_and_a_catalog_impl():
    config = IcebergConfig(catalog="prod", catalog_impl="org.apache.iceberg.aws.glue.GlueCatalog",
                           warehouse="s3://bucket/wh", namespace="sales",
                           packages=["org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1"],
                           extra_conf={"spark.sql.catalog.prod.io-impl": "org.apache.iceberg.aws.s3.S3FileIO"},
                           write_mode="copy-on-write", bucket_count=16)
    conf = config.spark_conf()
    assert conf["spark.sql.catalog.prod.catalog-impl"] == "org.apache.iceberg.aws.glue.GlueCatalog"
    assert "spark.sql.catalog.prod.type" not in conf and "spark.jars" not in conf
    assert conf["spark.jars.packages"] == "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1"
    assert conf["spark.sql.catalog.prod.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    with pytest.raises(ValueError, match="write_mode"):
        IcebergConfig(write_mode="sometimes")


def test_apply_operator_fills_the_job_and_its_arguments():
    op = IcebergApplyOperator(task_id="apply", staging_root="file:///data/staging/{{ ds }}", pipeline="orders",
                              iceberg=IcebergConfig(warehouse="file:///wh/{{ ds }}", namespace="sales_{{ params.env }}"),
                              table_map={"public.orders": "orders_{{ params.env }}"},
                              conf={"spark.sql.shuffle.partitions": "8"})
    assert Path(op.application) == APPLY_JOB and APPLY_JOB.is_file()
    assert {"staging_root", "pipeline", "application_args", "conf", "iceberg", "table_map"} <= set(op.template_fields)
    # nothing is resolved when the DAG is parsed: the conf is the user's until the task runs
    assert op.conf == {"spark.sql.shuffle.partitions": "8"}
    op.render_template_fields({"ds": "2024-01-01", "params": {"env": "prod"}})
    assert op.staging_root == "file:///data/staging/2024-01-01"
    assert (op.iceberg.warehouse, op.iceberg.namespace) == ("file:///wh/2024-01-01", "sales_prod")
    # one JSON argument: the options, as the job reads them back
    assert op.job_args() == ["--options", op.apply_options().to_json()]
    assert apply_changes.parse_args(op.job_args()) == op.apply_options() == ApplyOptions(
        "file:///data/staging/2024-01-01", "orders", "lake", "sales_prod", {"public.orders": "orders_prod"})
    assert op.apply_options("task d.apply, run r, try 1").lease_holder == "task d.apply, run r, try 1"
    with pytest.raises(SystemExit):  # an option the job does not know is refused, not ignored
        apply_changes.parse_args(["--options", json.dumps({"staging_root": "/s", "pipeline": "p", "colour": 1})])


def test_apply_operator_builds_a_spark_submit_command(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local[2]"}')
    op = IcebergApplyOperator(task_id="apply", staging_root="/s", pipeline="p", iceberg=IcebergConfig(warehouse="/wh"))
    op.conf = jars_for_master({**op.iceberg.spark_conf(), **op.conf}, op._conn_id)  # as execute does
    command = op._get_hook()._build_spark_submit_command(op.application)
    assert command[:3] == ["spark-submit", "--master", "local[2]"]
    # a local master's jars go on the driver's class path: spark.jars would copy them at each start
    assert f"spark.driver.extraClassPath={iceberg_runtime_jar()}" in command
    assert not [arg for arg in command if arg.startswith("spark.jars=")]
    assert "--driver-memory" in command and command[command.index("--driver-memory") + 1] == "2g"
    assert command[-len(op.application_args) - 1:] == [str(APPLY_JOB), *op.application_args]


@pytest.mark.parametrize("host", ["spark://master:7077", "yarn"])
def test_a_cluster_master_keeps_spark_jars(monkeypatch, host):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CLUSTER", json.dumps({"conn_type": "spark", "host": host}))
    conf = IcebergConfig(warehouse="/wh").spark_conf()
    assert jars_for_master(conf, "spark_cluster") == conf  # its executors need the files


def test_local_jars_join_the_given_class_path_and_remote_ones_stay_in_spark_jars():
    conf = {"spark.jars": "/a.jar,file:///b.jar,s3a://bucket/c.jar,https://host/d.jar",
            "spark.driver.extraClassPath": "/mine.jar", "spark.app.name": "x"}
    assert local_class_path(conf) == {"spark.jars": "s3a://bucket/c.jar,https://host/d.jar",
                                      "spark.driver.extraClassPath": "/mine.jar:/a.jar:/b.jar", "spark.app.name": "x"}
    assert local_class_path({"spark.jars": "s3a://bucket/c.jar"}) == {"spark.jars": "s3a://bucket/c.jar"}


def test_apply_operator_declares_its_asset_alias():
    op = IcebergApplyOperator(task_id="apply", staging_root="/s", pipeline="shop")
    assert [alias.name for alias in op.outlets] == ["pglogical_apply_shop"]
    assert IcebergApplyOperator(task_id="a2", staging_root="/s", pipeline="shop", asset_alias=None).outlets == []
    from airflow.sdk import Asset

    mine = Asset("s3://bucket/report")
    both = IcebergApplyOperator(task_id="a3", staging_root="/s", pipeline="shop", outlets=mine).outlets
    assert both[0] == mine and both[1].name == "pglogical_apply_shop"
    assert iceberg_apply.iceberg_table_asset("lake", "shop", "public__orders").uri == "iceberg://lake/shop/public__orders"


def test_apply_concurrency_reaches_the_job_and_is_checked():
    op = IcebergApplyOperator(task_id="apply", staging_root="/s", pipeline="p", concurrency=2)
    assert apply_changes.parse_args(op.job_args()).concurrency == 2
    default = IcebergApplyOperator(task_id="a2", staging_root="/s", pipeline="p")
    assert apply_changes.parse_args(default.job_args()).concurrency == 4
    with pytest.raises(ValueError, match=r"concurrency must be a whole number, 1 or more \(got 0\)"):
        IcebergApplyOperator(task_id="a3", staging_root="/s", pipeline="p", concurrency=0)


def test_an_initial_loads_apply_waits_at_most_keep_running_for_the_snapshot():
    op = IcebergApplyOperator(task_id="load", staging_root="/s", pipeline="p", keep_running=timedelta(hours=1),
                              until_loaded=True)
    args = apply_changes.parse_args(op.job_args())
    assert (args.keep_running, args.until_loaded) == (3600.0, True)
    assert not apply_changes.parse_args(IcebergApplyOperator(task_id="a2", staging_root="/s", pipeline="p")
                                        .job_args()).until_loaded
    with pytest.raises(ValueError, match=r"'load2': until_loaded waits for the initial snapshot, but keep_running "
                                         r"is unset: give keep_running"):
        IcebergApplyOperator(task_id="load2", staging_root="/s", pipeline="p", until_loaded=True)
    with pytest.raises(apply_changes.ApplyError, match="until_loaded waits for the initial snapshot"):
        apply_changes.run(None, ApplyOptions("/s", "p", until_loaded=True))


def test_maintenance_concurrency_reaches_the_job_and_is_checked():
    op = IcebergMaintenanceOperator(task_id="m", concurrency=2)
    assert op.job_args()[-2:] == ["--concurrency", "2"]
    assert maintenance.parse_args(op.job_args()).concurrency == 2
    default = IcebergMaintenanceOperator(task_id="m2")
    assert "--concurrency" not in default.job_args() and maintenance.parse_args(default.job_args()).concurrency == 4
    with pytest.raises(ValueError, match=r"concurrency must be a whole number, 1 or more \(got 0\)"):
        IcebergMaintenanceOperator(task_id="m3", concurrency=0)


def test_small_shuffles_for_the_apply_and_the_maintenance():
    assert apply_changes.small_shuffles(2) == {"spark.sql.shuffle.partitions": "4"}
    assert apply_changes.small_shuffles(8) == {"spark.sql.shuffle.partitions": "16"}
    assert apply_changes.session_defaults(8)["spark.sql.shuffle.partitions"] == "16"


def test_row_deltas_are_on_by_default_and_can_be_switched_off():
    default = apply_changes.parse_args(IcebergApplyOperator(task_id="a", staging_root="/s", pipeline="p").job_args())
    assert default.row_deltas
    off = IcebergApplyOperator(task_id="b", staging_root="/s", pipeline="p", row_deltas=False)
    assert not apply_changes.parse_args(off.job_args()).row_deltas


def test_staging_retention_reaches_the_job_and_is_checked():
    default = apply_changes.parse_args(IcebergApplyOperator(task_id="a", staging_root="/s", pipeline="p").job_args())
    assert default.retention_hours == 168 and not default.archive
    op = IcebergApplyOperator(task_id="b", staging_root="/s", pipeline="p", staging_retention=timedelta(hours=36),
                              archive_staging=True)
    parsed = apply_changes.parse_args(op.job_args())
    assert parsed.retention_hours == 36 and parsed.archive
    kept = IcebergApplyOperator(task_id="c", staging_root="/s", pipeline="p", staging_retention=None)
    assert apply_changes.parse_args(kept.job_args()).retention_hours is None
    with pytest.raises(ValueError, match="staging_retention must not be negative"):
        IcebergApplyOperator(task_id="d", staging_root="/s", pipeline="p", staging_retention=timedelta(hours=-1))


def test_delete_compaction_reaches_the_job_and_is_checked():
    default = apply_changes.parse_args(IcebergApplyOperator(task_id="a", staging_root="/s", pipeline="p").job_args())
    assert default.compact_deletes_at == 32
    for value in (0, 100):
        op = IcebergApplyOperator(task_id="b", staging_root="/s", pipeline="p", compact_deletes_at=value)
        assert apply_changes.parse_args(op.job_args()).compact_deletes_at == value
    for wrong in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"compact_deletes_at must be a whole number of delete files, 0 or more"):
            IcebergApplyOperator(task_id="c", staging_root="/s", pipeline="p", compact_deletes_at=wrong)


@pytest.mark.parametrize("table_map, message", [
    ({"x.y.z": "t"}, r"table_map: table name 'x.y.z' is 3 dot-separated names, not 2: a name that holds a dot "
                     r"must be written in double quotes, e.g. '\"x.y\".z'"),
    ({"public.a": "t", "public.b": "T"}, r"table_map maps source tables public.a and public.b onto one Iceberg "
                                         r"table 'T': give each source its own target"),
    ({"public.a": "a", '"public".a': "b"}, r"table_map names source table public.a twice"),
])
def test_an_ambiguous_or_colliding_table_map_fails_before_spark(tmp_path, table_map, message):
    from airflow_provider_pglogical.operators._errors import PermanentError

    op = IcebergApplyOperator(task_id="apply", staging_root=tmp_path.as_uri(), pipeline="p", table_map=table_map)
    with pytest.raises(PermanentError, match=message):
        op.execute({})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("lease, expected", [
    ({"holder": "task stream.apply_window", "window_until": 1_000_100.0}, True),   # runs 100 s more
    ({"holder": "task stream.apply_window", "window_until": 1_000_020.0}, False),  # within the clocks' margin
    ({"holder": "task stream.apply_window", "window_until": 999_000.0}, False),    # its window has ended
    ({"holder": "task sync.apply"}, False),  # a single apply (or an initial load's window): no promise
    ({"holder": "x", "window_until": "soon"}, False),
    (None, False),
])
def test_an_apply_that_meets_a_running_windows_lease_leaves_its_batches_to_it(lease, expected):
    reason = iceberg_apply.window_applies(lease, "orders", now=1_000_000.0)
    assert (reason is not None) is expected
    if expected:
        assert reason.startswith("pipeline 'orders': the apply window of task stream.apply_window holds the lease")
        assert "runs until 1970-01-12 13:48:20 UTC at least" in reason and "nothing is applied here" in reason


def test_the_format_version_reaches_the_job_and_only_2_or_3_is_taken():
    from airflow_provider_pglogical.exceptions import InvalidInputError

    op = IcebergApplyOperator(task_id="apply", staging_root="/s", pipeline="p",
                              iceberg=IcebergConfig(format_version=3, upgrade_format_version=True))
    args = apply_changes.parse_args(op.job_args())
    assert (args.format_version, args.upgrade_format_version) == (3, True)
    default = apply_changes.parse_args(IcebergApplyOperator(task_id="a2", staging_root="/s", pipeline="p").job_args())
    assert (default.format_version, default.upgrade_format_version) == (2, False)
    with pytest.raises(InvalidInputError, match=r"IcebergConfig\(format_version=4\): .* use 2 \(the default"):
        IcebergConfig(format_version=4)
    assert ApplyOptions("/s", "p", format_version=1).problems() == [
        "format_version must be 2 (the default, read by every engine) or 3, not 1"]
