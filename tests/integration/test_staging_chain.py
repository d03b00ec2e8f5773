"""Issue 33, class 2 (invariant 12): the apply proves the chain of change batches complete, and
every file it reads equal to what was staged, before it writes anything.

Real publisher, real pulls with empty windows between them, the apply job in-process over them
(one Spark session), real Iceberg. A middle batch deleted, only its manifest deleted, the newest
batch deleted, a Parquet file truncated, and a byte of one altered (same size) each fail the apply
naming the batch, the LSN range and the backfill, and change nothing: the lakehouse's rows and
positions and every staged byte stay as they were. Restored, the apply is exact; after retention
removed the applied batches, the chain is still proven and the next apply is exact.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import reading_session

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE t (id int PRIMARY KEY, v text);
CREATE TABLE idle (id int PRIMARY KEY, v text);
CREATE TABLE noise (id serial PRIMARY KEY);
INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 30) g;
INSERT INTO idle VALUES (1, 'never changes');
"""


@pytest.fixture
def spark(tmp_path):
    session = reading_session(tmp_path / "warehouse", "test-staging-chain")
    apply_changes.tune_session(session)
    yield session
    session.stop()


class Pipeline:
    def __init__(self, publisher, hook, root: Path, spark):
        self.publisher, self.hook, self.root, self.spark = publisher, hook, root, spark
        self.storage = ObjectStoragePath(root.as_uri())

    def pull(self, sql: str | None) -> str | None:
        """Run ``sql`` (None: only WAL outside the publication, an empty window), then one pull."""
        self.publisher.execute(sql or "INSERT INTO noise DEFAULT VALUES")
        batch = run_pull(self.hook, slot="s1", publications=["pub"], root=self.storage, pipeline="p")["batch"]
        assert (batch is None) == (sql is None)
        return batch and batch.rsplit("/", 1)[1]

    def apply(self, retention_hours: float | None = None) -> dict:
        return apply_changes.run(self.spark, ApplyOptions(self.root.as_uri(), "p", "lake", "chain", retention_hours=retention_hours))

    def lakehouse(self) -> tuple:
        rows = {table: sorted(tuple(r) for r in self.spark.table(f"lake.chain.public__{table}").collect())
                for table in ("t", "idle")}
        state = sorted(tuple(r) for r in self.spark.sql(
            "SELECT source_table, position, applied_snapshots, last_batch FROM lake.chain._pglogical_state").collect())
        return rows, state

    def equal(self) -> bool:
        return self.lakehouse()[0] == {table: sorted(self.publisher.query(f"SELECT id, v FROM {table}"))
                                       for table in ("t", "idle")}

    def staged_bytes(self) -> dict[str, str]:
        return {str(path.relative_to(self.root)): hashlib.sha256(path.read_bytes()).hexdigest()
                for path in sorted(self.root.rglob("*")) if path.is_file()}

    def refused(self, *expected: str, tables: tuple[str, ...] = ("public.idle", "public.t")) -> str:
        """The apply fails with every ``expected`` text and the backfill of ``tables`` (a hole: every
        table whose position is before it), and changes nothing."""
        lakehouse, staged = self.lakehouse(), self.staged_bytes()
        with pytest.raises(ApplyError) as error:
            self.apply()
        message = str(error.value)
        for text in expected:
            assert text in message, message
        assert f"PgBackfillOperator(tables={list(tables)!r})" in message and "Nothing was applied" in message, message
        assert self.lakehouse() == lakehouse and self.staged_bytes() == staged
        return message


def test_the_apply_proves_the_chain_and_the_files_before_it_writes(publisher, publisher_hook, tmp_path, spark):
    publisher.execute(SOURCE)
    publisher_hook.create_publication("pub", [PublishedTable("t"), PublishedTable("idle")])
    pipeline = Pipeline(publisher, publisher_hook, tmp_path / "staging", spark)
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=pipeline.storage, pipeline="p")
    first = pipeline.pull("UPDATE t SET v = 'one' WHERE id <= 5")
    assert pipeline.apply()["steps"] and pipeline.equal()

    # empty windows before and between the next batches: the slot moves, no batch is written
    pipeline.pull(None)
    middle = pipeline.pull("DELETE FROM t WHERE id = 7; UPDATE t SET v = 'two' WHERE id = 8")
    pipeline.pull(None)
    newest = pipeline.pull("INSERT INTO t VALUES (100, 'three')")
    manifests = {name: read_manifest(pipeline.storage, "p", name) for name in (first, middle, newest)}
    # each records where the one before it ended, though its own start is later (an empty window)
    assert manifests[middle].previous_end == manifests[first].end_lsn != manifests[middle].start_lsn
    assert manifests[newest].previous_end == manifests[middle].end_lsn != manifests[newest].start_lsn
    files = manifests[middle].tables["public.t"].files
    assert all(f.size and len(f.sha256) == 64 for f in files)
    directory = pipeline.root / "p" / middle
    lsns = f"LSN {manifests[first].end_lsn} to {manifests[middle].end_lsn}"

    # the middle batch deleted: its DELETE and UPDATE would be lost
    aside = tmp_path / "aside"
    shutil.move(directory, aside)
    pipeline.refused(f"no committed change batch covers {lsns}", f"after batch {first}, before batch {newest}")
    shutil.move(aside, directory)

    # only its manifest deleted: the directory is named
    (directory / "_manifest.json").rename(tmp_path / "manifest")
    pipeline.refused(f"no committed change batch covers {lsns}", f"batch directory {middle} has no _manifest.json")
    (tmp_path / "manifest").rename(directory / "_manifest.json")

    # the newest batch deleted: the pull's record knows how far it staged
    shutil.move(pipeline.root / "p" / newest, aside)
    pipeline.refused(f"covers LSN {manifests[middle].end_lsn} to {manifests[newest].end_lsn}",
                     f"the last pull recorded change batches up to LSN {manifests[newest].end_lsn}")
    shutil.move(aside, pipeline.root / "p" / newest)

    # a Parquet file truncated, then one byte of it altered (same size)
    part = directory / files[0].path
    original = part.read_bytes()
    part.write_bytes(original[: len(original) // 2])
    range_text = f"batch {middle} (changes, LSN {manifests[middle].start_lsn} to {manifests[middle].end_lsn})"
    pipeline.refused(range_text, f"is {len(original) // 2:,} bytes, its manifest says {len(original):,}",
                     tables=("public.t",))
    altered = bytearray(original)
    altered[len(altered) // 2] ^= 0x01
    part.write_bytes(bytes(altered))
    pipeline.refused(range_text, "has other bytes than were staged", tables=("public.t",))
    part.write_bytes(original)

    # everything as staged: the apply is exact
    assert [s["batch"] for s in pipeline.apply()["steps"]] == [middle, newest] and pipeline.equal()

    # retention removes what was applied (the idle table still stands at the snapshot); the
    # chain it removed is recorded, so the next apply still proves the chain from there
    assert pipeline.apply(retention_hours=0)["retention"]["removed"] == 3
    assert [name for name, *_ in committed_batches(pipeline.storage, "p")] == [newest]
    record = json.loads((pipeline.root / "p" / "_retention.json").read_text())
    assert len(record["removed_chain"]) == 1
    pipeline.pull(None)
    after = pipeline.pull("UPDATE t SET v = 'four' WHERE id = 1; UPDATE idle SET v = 'changed once'")
    assert [s["batch"] for s in pipeline.apply(retention_hours=0)["steps"]] == [after, after]
    assert pipeline.equal()
