"""The pull's facts of each table's change rows spare the apply job a read of the batch, and the
lakehouse ends exactly as without them.

A real pull stages the batches (``change_facts``); the job runs in-process twice over the same
batches, once as staged and once with the facts removed from the manifests (a batch staged
before the facts were written), into two namespaces of one warehouse.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import pull, synced
from tests.support.spark_jobs import reading_session

SOURCE = """
CREATE TABLE orders (id int PRIMARY KEY, qty int, note text);
CREATE TABLE bag (a int, b text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE docs (id int PRIMARY KEY, qty int, doc text);
ALTER TABLE docs ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO orders SELECT g, g, 'n' || g FROM generate_series(1, 50) g;
INSERT INTO bag SELECT g % 3, 'b' FROM generate_series(1, 9) g;
INSERT INTO docs SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1, 10) g;
"""
# orders: every change kind and a key change; bag: identical rows; docs: a value left unchanged
FIRST = """
UPDATE orders SET qty = qty + 1 WHERE id <= 10; UPDATE orders SET id = id + 100 WHERE id IN (11, 12);
DELETE FROM orders WHERE id IN (13, 14); INSERT INTO orders VALUES (200, 1, 'new');
INSERT INTO bag VALUES (1, 'b'), (1, 'b'); DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE a = 2);
UPDATE docs SET qty = -qty WHERE id <= 3;
"""
SECOND = "TRUNCATE bag; INSERT INTO bag VALUES (7, 'x'), (7, 'x'); UPDATE orders SET note = 'late' WHERE id = 1"
COLUMNS = {"orders": "id, qty, note", "bag": "a, b", "docs": "id, qty, md5(doc)"}


def without_facts(root, copy) -> None:
    """``root`` copied to ``copy`` with every table's change facts removed from the manifests."""
    shutil.copytree(root, copy)
    for manifest in copy.glob(f"*/*/{contract.MANIFEST}"):
        data = json.loads(manifest.read_text())
        for table in data["tables"].values():
            table.get("details", {}).pop(contract.CHANGE_FACTS, None)
        manifest.write_text(json.dumps(data))


def lakehouse_rows(spark, namespace: str, table: str) -> Counter:
    from pyspark.sql import functions as F

    frame = spark.table(f"lake.{namespace}.public__{table}")
    picked = [F.md5("doc") if c == "md5(doc)" else F.col(c) for c in map(str.strip, COLUMNS[table].split(","))]
    return Counter(tuple(row) for row in frame.select(*picked).collect())


@pytest.mark.spark
def test_pulled_facts_spare_the_batch_read_and_change_nothing(publisher, publisher_hook, tmp_path):
    root = tmp_path / "staging"
    storage = synced(publisher, publisher_hook, root, SOURCE, COLUMNS)
    batches = []
    for statements in (FIRST, SECOND):
        publisher.execute(statements)
        batches.append(pull(publisher_hook, storage))
    manifests = [json.loads((root / "p" / b / contract.MANIFEST).read_text()) for b in batches]
    decided = {(b, source) for b, m in zip(batches, manifests) for source, table in m["tables"].items()
               if contract.facts_decide(table["details"], 0) is not None}
    first, second = batches
    # a kept TOAST value (docs) or a TRUNCATE (bag, second batch): the job still reads the batch once
    assert decided == {(first, "public.orders"), (first, "public.bag"), (second, "public.orders")}, decided
    without_facts(root, tmp_path / "staging-without")

    spark = reading_session(tmp_path / "warehouse", "test-change-facts")
    try:
        apply_changes.tune_session(spark)
        # every step MERGEd: the facts' effect on the MERGE path is what is measured (row deltas:
        # tests/integration/test_row_deltas.py)
        runs = {namespace: apply_changes.run(spark, ApplyOptions(staging.as_uri(), "p", "lake", namespace, row_deltas=False))
                for namespace, staging in (("facts", root), ("aggregated", tmp_path / "staging-without"))}
        jobs = {namespace: {(s["batch"], s["table"]): s["spark_jobs"] for s in result["steps"] if s["kind"] == "changes"}
                for namespace, result in runs.items()}
        assert jobs["facts"].keys() == jobs["aggregated"].keys() >= decided
        for step in decided:
            assert jobs["facts"][step] < jobs["aggregated"][step], (step, jobs)
        for table in COLUMNS:
            expected = Counter(tuple(row) for row in publisher.query(f"SELECT {COLUMNS[table]} FROM {table}"))
            assert lakehouse_rows(spark, "facts", table) == lakehouse_rows(spark, "aggregated", table) == expected, table
    finally:
        spark.stop()
