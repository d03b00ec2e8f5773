"""Issue 16: staging retention removes only batches the lakehouse has applied, survives kills, and
a plan that would need a removed batch fails naming the backfill that rebuilds the table.

Real publisher, real pulls, real spark-submit of the apply job, real Iceberg; the lakehouse is
read back in this process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.backfill import run_backfill
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB
from airflow_provider_pglogical.staging import layout
from tests.support.spark_jobs import apply_args, reading_session, run_job, submit_command

pytestmark = pytest.mark.spark

DDL = "CREATE TABLE t(id int PRIMARY KEY, v text); CREATE TABLE u(id int PRIMARY KEY, v text);"


class Pipeline:
    def __init__(self, publisher, hook, root: Path, warehouse: Path, spark):
        self.publisher, self.hook, self.root, self.warehouse, self.spark = publisher, hook, root, warehouse, spark
        self.storage = ObjectStoragePath(root.as_uri())

    def pull(self) -> dict:
        return run_pull(self.hook, slot="s1", publications=["pub"], root=self.storage, pipeline="p")

    def apply(self, env: dict | None = None, **options) -> tuple[int, str]:
        command = submit_command(APPLY_JOB, apply_args(self.root.as_uri(), "p", namespace="ret", **options),
                                 IcebergConfig(warehouse=self.warehouse.as_uri(), namespace="ret"), driver_memory="1g")
        return run_job(command, env=env)

    def applied(self, **options) -> dict:
        """An apply nobody kills, run in the test's own session (the killed ones are spark-submits:
        their process is what dies)."""
        from airflow_provider_pglogical.spark.jobs import apply_changes

        job_args = apply_changes.parse_args(apply_args(self.root.as_uri(), "p", namespace="ret", **options))
        return json.loads(json.dumps(apply_changes.run(self.spark, job_args)))

    def batches(self) -> list[tuple[str, int, int]]:
        return [(kind, int(start), int(end)) for _name, start, end, kind in layout.committed_batches(self.storage, "p")]

    def record(self) -> dict:
        return json.loads((self.root / "p" / "_retention.json").read_text())

    def equal(self) -> bool:
        for table in ("t", "u"):
            lake = sorted(tuple(r) for r in self.spark.table(f"lake.ret.public__{table}").select("id", "v").collect())
            if lake != sorted(self.publisher.query(f"SELECT id, v FROM {table}")):
                return False
        return True

    def position(self, table: str) -> str:
        rows = self.spark.sql(f"SELECT position FROM lake.ret._pglogical_state WHERE source_table = 'public.{table}'")
        return rows.collect()[0].position


@pytest.fixture
def spark(tmp_path):
    session = reading_session(tmp_path / "warehouse", "test-staging-retention")
    yield session
    session.stop()


def test_retention_removes_applied_batches_only_and_survives_kills(publisher, publisher_hook, tmp_path, spark):
    publisher.execute(DDL + "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g;"
                            "INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 20) g")
    publisher_hook.create_publication("pub", [PublishedTable("t"), PublishedTable("u")])
    pipeline = Pipeline(publisher, publisher_hook, tmp_path / "staging", tmp_path / "warehouse", spark)
    initial = run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=pipeline.storage, pipeline="p")
    for n in range(3):
        publisher.execute(f"UPDATE t SET v = 'round {n}' WHERE id <= {10 * (n + 1)}; DELETE FROM t WHERE id = {40 + n};"
                          f"INSERT INTO u VALUES ({100 + n}, 'new')")
        pipeline.pull()
    assert pipeline.applied(retention_hours=None)["steps"] and pipeline.equal()
    assert [kind for kind, _s, _e in pipeline.batches()] == ["snapshot", "changes", "changes", "changes"]
    publisher.execute("UPDATE u SET v = 'pending' WHERE id = 1")
    pipeline.pull()
    newest = pipeline.batches()[-1]

    # the fifth batch is applied, then retention decides to remove the four older ones and is
    # killed after removing one: the record names what it was removing
    code, output = pipeline.apply(retention_hours=0, env={"PGLOGICAL_RETENTION_CRASH_AFTER": "1"})
    assert code != 0 and "crash point reached after removing 1 batch" in output, output[-3000:]
    assert len(pipeline.record()["removing"]) == 4 and len(pipeline.batches()) == 4
    assert pipeline.equal()

    # the next run finishes the removal; the newest change batch stays (a dead pull looks for it)
    result = pipeline.applied(retention_hours=0)
    assert result["steps"] == [] and pipeline.batches() == [newest] and pipeline.equal()
    record = pipeline.record()
    assert record["removing"] == [] and record["removed_batches"] == 4
    assert set(record["removed_through"]) == {"public.t", "public.u"}

    # an apply that dies before its state commit leaves its batch pending: retention never runs
    publisher.execute("UPDATE t SET v = 'six' WHERE id = 1")
    pipeline.pull()
    code, output = pipeline.apply(retention_hours=0, env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "1"})
    assert code != 0 and len(pipeline.batches()) == 2
    # killed after recording its decision, before removing anything: the re-run removes the fifth
    code, output = pipeline.apply(retention_hours=0, env={"PGLOGICAL_RETENTION_CRASH_AFTER": "0"})
    assert code != 0 and "crash point reached after removing 0 batch" in output, output[-3000:]
    assert len(pipeline.batches()) == 2 and pipeline.record()["removing"] == [newest_name(pipeline, newest)]
    result = pipeline.applied(retention_hours=0, archive=True)
    assert result["steps"] == [] and len(pipeline.batches()) == 1 and pipeline.equal()
    assert (pipeline.root / "p" / "_archive").is_dir()  # the archive holds what the last run moved

    # a re-run of the initial sync still finds its work done, though its batch was removed
    again = run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=pipeline.storage, pipeline="p")
    assert again["lsn"] == initial["lsn"] and again["tables"] == initial["tables"]

    # a dropped Iceberg table cannot be rebuilt from what is left: refused, nothing changes …
    spark.sql("DROP TABLE lake.ret.public__t")
    position_u, staged = pipeline.position("u"), pipeline.batches()
    publisher.execute("UPDATE u SET v = 'after drop' WHERE id = 2; UPDATE t SET v = 'after drop' WHERE id = 2")
    pipeline.pull()
    staged = pipeline.batches()
    code, output = pipeline.apply(retention_hours=0)
    assert code != 0, output[-3000:]
    assert "table public.t: the lakehouse needs its changes from LSN 0/0" in output
    assert "PgBackfillOperator(tables=['public.t'])" in output and "Nothing was applied" in output
    assert pipeline.batches() == staged and pipeline.position("u") == position_u
    # … until the backfill it names
    run_backfill(publisher_hook, tables=["public.t"], publications=["pub"], root=pipeline.storage, pipeline="p")
    pipeline.applied(retention_hours=0)
    assert pipeline.equal()


def newest_name(pipeline: Pipeline, batch: tuple[str, int, int]) -> str:
    kind, start, end = batch
    return next(name for name, s, e, k in layout.committed_batches(pipeline.storage, "p")
                if (k, int(s), int(e)) == (kind, start, end))
