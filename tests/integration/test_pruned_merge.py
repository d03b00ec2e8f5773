"""A change batch MERGEd into a large table: Spark prunes the table's scan with a bloom filter of
the batch's keys (``merge.pruning_source``), and the table still ends exactly as the changes say.

The job runs in-process (``apply_changes.run``) in a local Spark session configured as the job's
own (``tune_session``); Spark's SQL status store shows the plans it executed.
"""

from __future__ import annotations


import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.spark.paths.merge import PRUNED_MERGE_ROWS
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.accounts_batches import expected_rows, stage
from tests.support.spark_jobs import applying_session

CHANGES = 2_000
ROWS = PRUNED_MERGE_ROWS + 10 * CHANGES  # the least a 2,000-change batch prunes (``merge.prunes``)


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = applying_session(tmp_path_factory.mktemp("pruned") / "warehouse", "test-pruned-merge")
    yield session
    session.stop()


def executed_plans(spark) -> list[str]:
    """The physical plans of every SQL execution so far (Spark's listener runs asynchronously)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    return [executions.apply(i).physicalPlanDescription() for i in range(executions.size())]


def test_a_batch_into_a_large_table_scans_only_the_rows_its_keys_may_hit(spark, tmp_path):
    root = tmp_path / "staging"
    stage(root, "big", ROWS, CHANGES)
    result = apply_changes.run(spark, ApplyOptions(root.as_uri(), "big", "lake", "pruned"))
    assert [(s["kind"], s["rows"]) for s in result["steps"]] == [("snapshot", ROWS), ("changes", CHANGES)]

    merges = [plan for plan in executed_plans(spark) if "WriteDelta" in plan and "public__accounts" in plan]
    assert len(merges) == 1, "one MERGE of the change batch"
    assert "might_contain" in merges[0] and "bloom_filter_agg" in merges[0], merges[0]

    size = Lakehouse(spark, "lake", "pruned", "merge-on-read", None).size("public__accounts")
    # the rows its data files hold (merge-on-read: the updated rows' old versions too) and their bytes
    assert size.rows == ROWS + int(CHANGES * 0.8) and 0 < size.bytes < 50 * ROWS

    lake = spark.table("lake.pruned.public__accounts")
    pq.write_table(expected_rows(ROWS, CHANGES), tmp_path / "expected.parquet")
    expected = spark.read.parquet(str(tmp_path / "expected.parquet")).select(*lake.columns)
    assert lake.count() == ROWS  # as many inserted as deleted
    assert lake.exceptAll(expected).count() == 0 and expected.exceptAll(lake).count() == 0
