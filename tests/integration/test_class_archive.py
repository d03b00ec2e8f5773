"""The driver's class archive with a real spark-submit: the first apply leaves a marker, the
second writes the archive when its JVM exits, the third maps it (``-Xshare:on`` makes a JVM that
cannot map it fail to start, so the run succeeding proves it did). In cluster deploy mode the
driver runs elsewhere and nothing is added."""

from __future__ import annotations

import json

import pytest

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators._class_archive import driver_class_archive
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator

pytestmark = pytest.mark.spark


def apply_operator(tmp_path, archives, java_options: str | None = None) -> IcebergApplyOperator:
    conf = {"spark.ui.enabled": "false"}
    if java_options:
        conf["spark.driver.extraJavaOptions"] = java_options
    return IcebergApplyOperator(task_id="apply", staging_root=(tmp_path / "staging").as_uri(), pipeline="empty",
                                iceberg=IcebergConfig(warehouse=(tmp_path / "wh").as_uri(), namespace="archive"),
                                conf=conf, skip_when_idle=False, class_archive_dir=str(archives),
                                quick_jit_max_rows=None,  # the archive's options alone (the JIT: test_job_results)
                                env_vars={"SPARK_LOCAL_IP": "127.0.0.1"})


def test_second_apply_writes_the_archive_and_the_next_maps_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    (tmp_path / "staging").mkdir()
    archives = tmp_path / "archives"

    first = apply_operator(tmp_path, archives)
    first.execute({})
    assert [p.suffix for p in archives.iterdir()] == [".seen"]
    assert "spark.driver.extraJavaOptions" not in first.conf

    second = apply_operator(tmp_path, archives)
    second.execute({})
    written = list(archives.glob("*.jsa"))
    assert len(written) == 1 and written[0].stat().st_size > 10_000_000, "the JVM wrote no class archive"
    assert not list(archives.glob("*.tmp")), "the dump was not moved into place"
    assert "-XX:ArchiveClassesAtExit=" in second.conf["spark.driver.extraJavaOptions"]

    third = apply_operator(tmp_path, archives, java_options="-Xshare:on")
    third.execute({})  # with -Xshare:on a JVM that cannot map the archive does not start
    assert third.conf["spark.driver.extraJavaOptions"] == f"-Xshare:on -XX:SharedArchiveFile={written[0]}"


def test_cluster_deploy_mode_adds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1:7077", "extra": {"deploy-mode": "cluster"}}))
    operator = apply_operator(tmp_path, tmp_path / "archives")
    with driver_class_archive(operator, str(tmp_path / "archives")) as run:
        assert run is None
    assert operator.conf == {"spark.ui.enabled": "false"} and not (tmp_path / "archives").exists()


def test_an_unwritable_archive_directory_costs_nothing_but_the_archive(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the archive directory would be")
    operator = apply_operator(tmp_path, blocker / "archives")
    with driver_class_archive(operator, str(blocker / "archives")) as run:
        assert run is None
    assert operator.conf == {"spark.ui.enabled": "false"}
