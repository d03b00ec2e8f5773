"""Issue 33, class 9: a staged Parquet file or an Iceberg metadata file damaged by hand is a clear
error naming the batch or table and the fix, raised before anything is written. Real publisher,
real pulls, the apply job in this process's Spark session, real Iceberg (a Hadoop catalog).
"""

from __future__ import annotations

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import reading_session

pytestmark = pytest.mark.spark


@pytest.fixture
def spark(tmp_path):
    session = reading_session(tmp_path / "warehouse", "test-damaged-files")
    yield session
    session.stop()


def lakehouse(spark) -> dict:
    """Every row of both tables and the pipeline's state, read by Spark."""
    tables = {t: sorted(tuple(r) for r in spark.table(f"lake.dmg.public__{t}").select("id", "v").collect())
              for t in ("t", "u")}
    state = sorted(tuple(r) for r in spark.table("lake.dmg._pglogical_state").select("source_table", "position")
                   .collect())
    return {**tables, "state": state}


def state_rows(spark) -> list[tuple]:
    return sorted(tuple(r) for r in spark.table("lake.dmg._pglogical_state")
                  .select("source_table", "position", "last_batch").collect())


def files(directory) -> dict:
    return {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()}


def test_a_truncated_staged_file_and_a_deleted_metadata_file_are_named_with_their_fix(
    publisher, publisher_hook, tmp_path, spark
):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); CREATE TABLE u(id int PRIMARY KEY, v text);"
                      "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 30) g;"
                      "INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 5) g")
    publisher_hook.create_publication("pub", [PublishedTable("t"), PublishedTable("u")])
    root = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")

    def apply(**kwargs) -> dict:
        return apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "dmg", retention_hours=None, **kwargs))

    apply()
    publisher.execute("UPDATE t SET v = 'changed' WHERE id <= 10; DELETE FROM t WHERE id = 30")
    batch = run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")["batch"]
    name = batch.rsplit("/", 1)[1]
    [part] = [p for p in (tmp_path / "staging" / "p" / name).iterdir() if p.suffix == ".parquet"]
    whole = part.read_bytes()
    part.write_bytes(whole[: len(whole) // 2])  # truncated by a full disk, a bad copy, a hand
    before, staged = lakehouse(spark), files(tmp_path / "staging")

    for row_deltas in (True, False):  # the driver's own read (pyarrow), and Spark's (a MERGE)
        with pytest.raises(ApplyError) as raised:
            apply(row_deltas=row_deltas)
        # the chain check (size and SHA-256 against the manifest) catches it before Spark reads it; a
        # manifest without them (older batches) gets the reader's error, named the same way
        message = str(raised.value)
        assert message.startswith(f"batch {name}") and part.name in message, message
        assert "public.t" in message and "backfill" in message and "PgBackfillOperator" in message, message
        assert lakehouse(spark) == before
        after = files(tmp_path / "staging")
        assert {str(p): len(b) for p, b in after.items() if staged.get(p) != b} == {}

    part.write_bytes(whole)  # restored: the batch applies, exactly
    assert [s["table"] for s in apply()["steps"]] == ["public.t"]
    assert lakehouse(spark)["t"] == sorted(publisher.query("SELECT id, v FROM t"))

    # the current metadata file of an Iceberg table deleted by hand
    metadata = tmp_path / "warehouse" / "dmg" / "public__u" / "metadata"
    version = (metadata / "version-hint.text").read_text().strip()
    current = metadata / f"v{version}.metadata.json"
    kept = current.read_bytes()
    current.unlink()
    targets = {d: files(tmp_path / "warehouse" / "dmg" / d) for d in ("public__t", "public__u")}
    positions, staged = state_rows(spark), files(tmp_path / "staging")
    with pytest.raises(ApplyError) as raised:
        apply()
    message = str(raised.value)
    assert message.startswith("Iceberg table `lake`.`dmg`.`public__u` cannot be loaded: its current metadata file "
                              "is missing or damaged (")
    assert message.endswith("Nothing was applied. Fix: restore that file from a backup; or drop the table (DROP "
                            "TABLE `lake`.`dmg`.`public__u` PURGE; with a Hadoop catalog, remove the table's "
                            "directory) and the next apply rebuilds it from staging (a backfill, if staging "
                            "retention removed its history)")
    # the tables and the positions are as they were (the apply's lease commits to the state table)
    assert {d: files(tmp_path / "warehouse" / "dmg" / d) for d in ("public__t", "public__u")} == targets
    assert state_rows(spark) == positions and files(tmp_path / "staging") == staged
    current.write_bytes(kept)
    assert apply()["steps"] == []
