"""Housekeeping beside another writer's commits: what it expires is what it reports (issue 35).

The maintenance job's session keeps each Iceberg table it loaded (Spark's catalog cache, on by
default); an apply in another process commits to the same tables meanwhile. Iceberg's
``expire_snapshots`` commits from the table's latest metadata but, started from a stale copy,
counted and cleaned only the snapshots that copy knew: the snapshots committed since were expired
silently and their files left on storage. Here the other writer is a second catalog of the same
session with its cache off, so the commits land exactly between two runs of the job's steps.
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping
from airflow_provider_pglogical.spark.jobs import maintenance
from tests.support.spark_jobs import applying_session

pytestmark = pytest.mark.spark


def manifest_lists(table_dir) -> set[str]:
    return {path.name for path in (table_dir / "metadata").glob("snap-*.avro")}


@pytest.fixture
def spark(tmp_path):
    """The job's session (Spark's catalog cache on, as in the maintenance job) over ``tmp_path``;
    stopped after the test, so no later test of this worker finds its catalogs."""
    session = applying_session(tmp_path / "warehouse", "test-housekeeping-beside-commits")
    yield session
    session.stop()


def test_expiry_after_another_writers_commits_reports_and_removes_every_snapshot_it_expired(spark, tmp_path):
    warehouse = tmp_path / "warehouse"
    # the other writer: the same warehouse through a catalog that never caches a table
    for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "hadoop",
                       ".warehouse": warehouse.as_uri(), ".cache-enabled": "false"}.items():
        spark.conf.set(f"spark.sql.catalog.writer{key}", value)
    spark.sql("CREATE TABLE lake.hk.t (id int) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql("INSERT INTO lake.hk.t VALUES (1)")
    table_dir = warehouse / "hk" / "t"
    first = manifest_lists(table_dir)

    # the job's first steps load the table into its catalog's cache (nothing to compact or expire yet)
    maintenance.run(spark, "lake", "hk", ["t"], Housekeeping(expire_snapshots=False, remove_orphan_files=False))
    # an apply commits twice meanwhile
    spark.sql("INSERT INTO writer.hk.t VALUES (2)")
    spark.sql("INSERT INTO writer.hk.t VALUES (3)")
    second_and_third = manifest_lists(table_dir) - first
    assert len(first) == 1 and len(second_and_third) == 2, (first, second_and_third)

    # the job's expiry keeps the newest snapshot only: the first and the second go, both reported
    expire_only = Housekeeping(compact_data_files=False, compact_delete_files=False, rewrite_manifests=False,
                               older_than_hours=0, retain_last=1, remove_orphan_files=False)
    done = maintenance.run(spark, "lake", "hk", ["t"], expire_only)
    report = done["tables"]["t"]["expire_snapshots"]
    left = manifest_lists(table_dir)
    assert len(left) == 1 and left < second_and_third, (first, second_and_third, left)
    assert report["deleted_manifest_lists_count"] == 2, report
    assert sorted(r.id for r in spark.table("writer.hk.t").collect()) == [1, 2, 3]
