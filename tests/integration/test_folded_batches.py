"""Issue 51: when the apply is behind, a table's consecutive change batches fold into one step.

Real publisher, real pulls (one batch each), real spark-submit of the apply job with
``fold_rows``, real Iceberg read back in this process. Three batches pending for a keyed table
with an unchanged TOAST column (a key updated in every batch, a delete then a reinsert across
batches, a key change leaving the TOAST value unchanged) and for a keyless table (copies added,
removed and re-added across batches) apply as ONE change step per table, equal to the source.
Then the apply is killed between the folded steps' data commits and their state commit, another
batch arrives, and the re-run (which would fold one batch more) continues exactly: the keyless
table from where its folded commit landed (``state_table.landed_position``), the keyed table by
applying the larger fold again.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.spark.launch import APPLY_JOB
from airflow_provider_pglogical.staging.contract import APPLY_RESULT_PREFIX
from tests.integration.sync_helpers import pull, synced
from tests.support.spark_jobs import apply_args, job_result, reading_session, run_job, submit_command

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE items (id int PRIMARY KEY, qty int, doc text);
ALTER TABLE items ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE bag (n int, s text);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO items SELECT g, g, repeat(md5(g::text), 200) FROM generate_series(1, 10) g;
INSERT INTO bag VALUES (1, 'a'), (2, 'b'), (2, 'b'), (3, 'c'), (3, 'c');
"""
BATCHES = [
    # 1: an update leaving the TOAST value unchanged, a delete, an insert; copies added and removed
    "UPDATE items SET qty = qty + 1 WHERE id = 1; DELETE FROM items WHERE id = 2;"
    "INSERT INTO items VALUES (100, 100, 'short');"
    "INSERT INTO bag VALUES (1, 'a'), (1, 'a'); DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 2)",
    # 2: the same key again, the deleted key back, a key change with the TOAST value unchanged;
    # a copy removed, the removed value back, one copy updated
    "UPDATE items SET qty = 50 WHERE id = 1; INSERT INTO items VALUES (2, 2, repeat('x', 3000));"
    "UPDATE items SET id = 200 WHERE id = 3;"
    "DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 1); INSERT INTO bag VALUES (2, 'b');"
    "UPDATE bag SET s = 'd' WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 3)",
    # 3: the TOAST value changed at last, the inserted key gone; every copy of a value gone, a NULL row
    "UPDATE items SET doc = repeat('y', 3000) WHERE id = 1; DELETE FROM items WHERE id = 100;"
    "DELETE FROM bag WHERE n = 3 AND s = 'c'; INSERT INTO bag VALUES (9, NULL)",
]
LATER = [
    "UPDATE items SET qty = qty * 2 WHERE id IN (1, 200); INSERT INTO bag VALUES (1, 'a'), (7, 'z');"
    "DELETE FROM bag WHERE ctid = (SELECT min(ctid) FROM bag WHERE n = 2)",
    "UPDATE items SET qty = 7 WHERE id = 200; DELETE FROM bag WHERE n = 7; INSERT INTO bag VALUES (3, 'c')",
]
LAST = "UPDATE items SET qty = 8, id = 201 WHERE id = 200; INSERT INTO bag VALUES (7, 'z'), (2, 'b')"


def digest(value):
    return hashlib.md5(value.encode()).hexdigest() if isinstance(value, str) else value


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="module")
def spark(warehouse):
    session = reading_session(warehouse, "test-folded-batches")
    yield session
    session.stop()


def apply(root: Path, warehouse: Path, env: dict | None = None, namespace: str = "fold") -> tuple[int, str]:
    command = submit_command(APPLY_JOB, apply_args(root.as_uri(), "p", namespace=namespace, fold_rows=100_000),
                             IcebergConfig(warehouse=warehouse.as_uri(), namespace=namespace), driver_memory="1g")
    return run_job(command, env=env)


def source_rows(publisher) -> tuple[set, Counter]:
    return ({(i, q, digest(d)) for i, q, d in publisher.query("SELECT id, qty, doc FROM items")},
            Counter(publisher.query("SELECT n, s FROM bag")))


def lake_rows(spark, namespace: str) -> tuple[set, Counter]:
    items = spark.table(f"lake.{namespace}.public__items").select("id", "qty", "doc").collect()
    bag = spark.table(f"lake.{namespace}.public__bag").select("n", "s", "_pglogical_occurrence").collect()
    copies: dict[tuple, list[int]] = {}
    for n, s, occurrence in bag:
        copies.setdefault((n, s), []).append(occurrence)
    assert all(sorted(o) == list(range(1, len(o) + 1)) for o in copies.values()), copies  # numbered 1..n
    return {(r.id, r.qty, digest(r.doc)) for r in items}, Counter({k: len(v) for k, v in copies.items()})


def test_pending_batches_fold_into_one_step_per_table_exactly_and_survive_a_kill(
        publisher, publisher_hook, tmp_path, warehouse, spark):
    root = tmp_path / "staging"
    storage = synced(publisher, publisher_hook, root, SOURCE, ["items", "bag"])
    names = []
    for statements in BATCHES:
        publisher.execute(statements)
        names.append(pull(publisher_hook, storage))
    assert len(set(names)) == 3

    def source() -> tuple[set, Counter]:
        return source_rows(publisher)

    def lake() -> tuple[set, Counter]:
        return lake_rows(spark, "fold")

    code, output = apply(root, warehouse)
    assert code == 0, output[-5000:]
    steps = job_result(output, APPLY_RESULT_PREFIX)["steps"]
    # the snapshot, then ONE change step per table over the three batches (named by the last)
    changes = sorted((s["table"], s["batch"], tuple(s["folded"])) for s in steps if s["kind"] == "changes")
    assert changes == [("public.bag", names[-1], tuple(names)), ("public.items", names[-1], tuple(names))]
    assert len(steps) == 4
    assert lake() == source()
    items, bag = source()
    assert (1, 50, digest("y" * 3000)) in items and (200, 3, digest(hashlib.md5(b"3").hexdigest() * 200)) in items
    assert bag[(2, "b")] == 2 and bag[(1, "a")] == 2 and (3, "c") not in bag and bag[(9, None)] == 1

    # two more batches; the apply dies after the folded steps' data commits, before the state commit
    later = []
    for statements in LATER:
        publisher.execute(statements)
        later.append(pull(publisher_hook, storage))
    code, output = apply(root, warehouse, env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "1"})
    assert code != 0 and "crash point reached after the data commit of step 1" in output, output[-3000:]
    assert lake() == source()  # both folds landed (the round's steps ran side by side)
    # one batch more: a re-run would fold three batches where the landed step folded two
    publisher.execute(LAST)
    final = pull(publisher_hook, storage)
    code, output = apply(root, warehouse)
    assert code == 0, output[-5000:]
    steps = {s["table"]: s["folded"] for s in job_result(output, APPLY_RESULT_PREFIX)["steps"]}
    assert steps == {"public.bag": [final], "public.items": [*later, final]}
    assert "public.bag: its batch %s landed without its state commit" % later[-1] in output
    assert lake() == source()
    (position,) = spark.sql("SELECT position FROM lake.fold._pglogical_state WHERE pipeline = 'p' "
                            "AND source_table = 'public.bag'").collect()
    assert position.position == final[17:33], (position, final)


def test_housekeeping_keeps_a_killed_folds_landed_commit_so_its_rerun_stays_exact(
        publisher, publisher_hook, tmp_path, warehouse, spark):
    """The apply dies between the folded steps' data commits and their state commit; then the
    maintenance job (spark-submitted for that one table, as ``IcebergMaintenanceOperator(tables=…)``
    does) runs at its most eager (every file compacted, which commits on top of the landed commit;
    snapshots expired at once, keeping one). The re-run still finds the keyless table's
    landed commit (``pipeline_commits.py``: expiry never removes the newest stamped snapshot nor any
    after it); without that its copies were counted twice."""
    from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping
    from airflow_provider_pglogical.spark.jobs.maintenance import RESULT_PREFIX
    from airflow_provider_pglogical.spark.launch import MAINTENANCE_JOB
    from airflow_provider_pglogical.staging.contract import SNAPSHOT_BATCH

    root = tmp_path / "staging"
    storage = synced(publisher, publisher_hook, root, SOURCE, ["items", "bag"])
    for statements in BATCHES:
        publisher.execute(statements)
        pull(publisher_hook, storage)
    assert apply(root, warehouse, namespace="foldhk")[0] == 0
    later = []
    for statements in LATER:
        publisher.execute(statements)
        later.append(pull(publisher_hook, storage))
    code, output = apply(root, warehouse, env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "1"}, namespace="foldhk")
    assert code != 0 and "crash point reached after the data commit" in output, output[-3000:]

    eager = Housekeeping(min_input_files=1, older_than_hours=0, retain_last=1, remove_orphan_files=False)
    code, output = run_job(submit_command(
        MAINTENANCE_JOB, ["--namespace", "foldhk", "--table", "public__bag", *eager.args()],
        IcebergConfig(warehouse=warehouse.as_uri(), namespace="foldhk"), driver_memory="1g"))
    assert code == 0, output[-3000:]
    done = job_result(output, RESULT_PREFIX)
    assert done["tables"]["public__bag"]["rewrite_data_files"]["rewritten_data_files_count"] > 0, done
    spark.sql("REFRESH TABLE lake.foldhk.public__bag")
    history = spark.sql("SELECT snapshot_id, summary FROM lake.foldhk.public__bag.snapshots "
                        "ORDER BY committed_at").collect()
    assert SNAPSHOT_BATCH not in history[-1].summary  # housekeeping committed on top of the landed commit
    assert [r.summary.get(SNAPSHOT_BATCH) for r in history].count(later[-1]) == 1, history  # and kept it

    publisher.execute(LAST)
    final = pull(publisher_hook, storage)
    code, output = apply(root, warehouse, namespace="foldhk")
    assert code == 0, output[-5000:]
    assert lake_rows(spark, "foldhk") == source_rows(publisher)
    assert "public.bag: its batch %s landed without its state commit" % later[-1] in output
    (position,) = spark.sql("SELECT position FROM lake.foldhk._pglogical_state WHERE pipeline = 'p' "
                            "AND source_table = 'public.bag'").collect()
    assert position.position == final[17:33], (position, final)
