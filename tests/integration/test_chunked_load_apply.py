"""A chunked load lands in Iceberg through the unchanged apply job: the empty start, the chunks as
ranged snapshots at their low watermarks, a table loaded whole as a snapshot at its temporary
slot's LSN, and the changes pulled after, equal the source."""

from __future__ import annotations

from collections import Counter

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX
from tests.integration.test_chunked_load import SOURCE, Writer, _drain
from tests.integration.test_chunked_load_whole import LEDGER, LedgerWriter, killed_and_resumed
from tests.support.spark_jobs import apply_args, job_result, reading_session, run_job, submit_command

pytestmark = pytest.mark.spark


def test_a_chunked_load_under_concurrent_writes_applies_to_the_source(publisher, publisher_hook, tmp_path):
    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("notes")])
    root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    writer = Writer(publisher, 99)
    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p", chunk_rows=400,
                     hooks=ChunkHooks(low=lambda e: writer.burst(3), read=lambda e: writer.burst(3)))
    writer.burst(10)
    _drain(publisher_hook, storage)
    steps = _apply(root, warehouse, "chunked")
    assert sum(1 for s in steps if s["kind"] == "snapshot" and s["table"] == "public.items") >= 5
    spark = reading_session(warehouse, "test-chunked-load-apply")
    try:
        items = sorted(tuple(r) for r in spark.table("lake.chunked.public__items").select("id", "grp", "label").collect())
        notes = sorted(tuple(r) for r in spark.table("lake.chunked.public__notes").select("code", "body").collect())
        snapshots = {r.snapshot_id: r for r in spark.sql(
            "SELECT snapshot_id, parent_id, summary FROM lake.chunked.public__items.snapshots").collect()}
    finally:
        spark.stop()
    parents = {r.parent_id for r in snapshots.values()}
    (current,) = [r for r in snapshots.values() if r.snapshot_id not in parents]
    chain = [current]
    while chain[-1].parent_id is not None:
        chain.append(snapshots[chain[-1].parent_id])
    labels = [r.summary.get("pglogical.lsn") for r in reversed(chain)]
    assert items == sorted(publisher.query("SELECT id, grp, label FROM items"))
    assert notes == sorted(publisher.query("SELECT code, body FROM notes"))
    # no commit of the load claims a consistent cut (pglogical.lsn) before its last chunk is applied:
    # the empty start and the chunks before the last hold the source at no single position
    cuts = [index for index, label in enumerate(labels) if label]
    assert cuts and cuts == list(range(cuts[0], len(labels))) and cuts[0] >= 5, labels


def _apply(root, warehouse, namespace: str) -> list[dict]:
    """spark-submit the apply job of pipeline ``p`` into ``namespace``, as the operator does; its steps."""
    command = submit_command(APPLY_JOB, apply_args(root.as_uri(), "p", namespace=namespace),
                             IcebergConfig(warehouse=warehouse.as_uri(), namespace=namespace), driver_memory="1g")
    code, output = run_job(command, timeout=600)
    assert code == 0, output[-5000:]
    return job_result(output, RESULT_PREFIX)["steps"]


def test_a_keyless_table_killed_in_its_whole_copy_applies_equal_to_the_source(publisher, publisher_hook, tmp_path):
    """Keyed tables in chunks, a keyless one with duplicate rows (and a uuid-keyed one) whole, under
    concurrent writes to all of them, killed inside the keyless table's copy and resumed with the same
    slot (test_chunked_load_whole.py asserts the load itself), then applied by the unchanged apply job:
    read back by Spark from Iceberg, each table equals the source, the keyless one as a multiset."""
    root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    killed_and_resumed(publisher, publisher_hook, storage)
    Writer(publisher, 21).burst(20)
    LedgerWriter(publisher, 22).burst(20)
    _drain(publisher_hook, storage)
    steps = _apply(root, warehouse, "whole")
    ledger_snapshots = [s for s in steps if s["kind"] == "snapshot" and s["table"] == "public.ledger"]
    assert len(ledger_snapshots) == 1  # the whole copy; the empty start before it is superseded
    spark = reading_session(warehouse, "test-chunked-load-whole-apply")
    try:
        def rows(table: str, columns: list[str]) -> list[tuple]:
            return [tuple(r) for r in spark.table(f"lake.whole.public__{table}").select(*columns).collect()]

        items, notes = sorted(rows("items", ["id", "grp", "label"])), sorted(rows("notes", ["code", "body"]))
        tokens, ledger = sorted(rows("tokens", ["id", "v"])), Counter(rows("ledger", LEDGER))
    finally:
        spark.stop()
    assert items == sorted(publisher.query("SELECT id, grp, label FROM items"))
    assert notes == sorted(publisher.query("SELECT code, body FROM notes"))
    assert tokens == sorted((str(i), v) for i, v in publisher.query("SELECT id, v FROM tokens"))
    source = Counter(publisher.query("SELECT account, amount, memo FROM ledger"))
    assert ledger == source and max(source.values()) > 1  # duplicates, each copy kept
