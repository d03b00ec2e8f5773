"""Issue 14 / invariant 9: a keyless table (REPLICA IDENTITY FULL, no key) is a multiset.

PostgreSQL's own subscriber keeps every copy of identical rows: an INSERT adds one row even when
identical ones exist, a DELETE or an UPDATE touches exactly one matching row, NULLs compare equal.
The lakehouse must hold the same multiset. Real publisher, real native subscriber (the oracle),
real pulls and initial sync/backfill, real spark-submit of the apply job, real Iceberg; the
lakehouse is read back in this process and compared as a Counter of row tuples.

The rows change by ``ctid`` so that exactly one of several identical rows is deleted or updated,
as an application without a key would.
"""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.capture.backfill import KeyRange, run_backfill
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from tests.support.spark_jobs import apply_args, job_result, reading_session, run_job, submit_command

pytestmark = pytest.mark.spark

# a column named with a dot: every Spark identifier of the job must be quoted
DDL = 'CREATE TABLE bag(n int, "a.b" text, amount numeric(10,2)); ALTER TABLE bag REPLICA IDENTITY FULL;'
COLUMNS = '"n", "a.b", "amount"'
LAKE_COLUMNS = ["n", "a.b", "amount"]


def random_workload(seed: int, changes: int, per_transaction: int = 20) -> str:
    """Transactions of INSERTs, DELETEs and UPDATEs of one copy, over a few row values (many copies)."""
    rng = random.Random(seed)
    values = [f"({n}, {ab}, {amount})" for n in (11, 12, 13) for ab in ("'p'", "NULL") for amount in ("NULL", "1.00")]
    statements = []
    for index in range(changes):
        if index % per_transaction == 0:
            statements.append("COMMIT; BEGIN" if index else "BEGIN")
        kind, value = rng.choices(["insert", "delete", "update"], [45, 30, 25])[0], rng.choice(values)
        match = one(f'(n, "a.b", amount) IS NOT DISTINCT FROM {value}')
        if kind == "insert":
            statements.append(f"INSERT INTO bag VALUES {value}")
        elif kind == "delete":
            statements.append(f"DELETE FROM bag WHERE {match}")
        else:
            statements.append(f'UPDATE bag SET (n, "a.b", amount) = {rng.choice(values)} WHERE {match}')
    return "; ".join(statements) + "; COMMIT"


def one(where: str) -> str:
    """The ctid of one row matching ``where`` (one of several identical ones)."""
    return f"ctid = (SELECT ctid FROM bag WHERE {where} LIMIT 1)"


class Pipeline:
    def __init__(self, publisher, publisher_hook, root: Path, warehouse: Path, namespace: str, spark):
        self.publisher, self.hook, self.spark = publisher, publisher_hook, spark
        self.root, self.warehouse, self.namespace = root, warehouse, namespace
        self.write_mode = "merge-on-read"
        self.storage = ObjectStoragePath(self.root.as_uri())

    def pull(self, max_changes: int = 200_000) -> dict:
        # append_only: one test publishes inserts and truncates only (a table without replica identity)
        return run_pull(self.hook, slot="bag_slot", publications=["pub"], root=self.storage, pipeline="p",
                        max_changes=max_changes, append_only=True)

    def apply(self, env: dict | None = None) -> tuple[int, str]:
        command = submit_command(APPLY_JOB, apply_args(self.root.as_uri(), "p", namespace=self.namespace,
                                                       write_mode=self.write_mode),
                                 IcebergConfig(warehouse=self.warehouse.as_uri(), namespace=self.namespace),
                                 driver_memory="1g")
        return run_job(command, env=env)

    def applied(self) -> list[tuple[str, str]]:
        code, output = self.apply()
        assert code == 0, output[-5000:]
        self.last_steps = job_result(output, RESULT_PREFIX)["steps"]
        return [(s["kind"], s["batch"]) for s in self.last_steps]

    def source(self) -> Counter:
        return Counter(self.publisher.query(f"SELECT {COLUMNS} FROM bag"))

    def lake_rows(self) -> list[tuple]:
        """(values..., occurrence) of every lakehouse row."""
        frame = self.spark.table(f"lake.{self.namespace}.public__bag")
        return [tuple(r) for r in frame.select(*[f"`{c}`" for c in LAKE_COLUMNS], "_pglogical_occurrence").collect()]

    def lake(self) -> Counter:
        rows = self.lake_rows()
        # identical rows are numbered 1..n: (values, occurrence) is a key
        numbers: dict[tuple, list[int]] = {}
        for row in rows:
            numbers.setdefault(row[:-1], []).append(row[-1])
        for values, occurrences in numbers.items():
            assert sorted(occurrences) == list(range(1, len(occurrences) + 1)), (values, occurrences)
        return Counter(row[:-1] for row in rows)

    def position(self) -> str:
        (row,) = self.spark.sql(f"SELECT position FROM lake.{self.namespace}._pglogical_state WHERE pipeline = 'p'").collect()
        return row.position


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="module")
def spark(warehouse):
    """An in-process Spark session that reads the Iceberg warehouse of this module's tests."""
    session = reading_session(warehouse, "test-keyless-multiset")
    yield session
    session.stop()


@pytest.fixture
def pipeline(publisher, publisher_hook, tmp_path, warehouse, spark, request):
    """This test's staging root and Iceberg namespace (named after the test) in the module's warehouse."""
    return Pipeline(publisher, publisher_hook, tmp_path / "staging", warehouse, request.node.name[5:25], spark)


def test_duplicates_nulls_updates_deletes_and_a_killed_apply(pipeline, publisher, subscriber, publisher_hook,
                                                             subscriber_hook):
    publisher.execute(DDL)
    subscriber.execute(DDL)
    # the snapshot holds duplicates, NULLs and duplicate all-NULL rows
    publisher.execute(
        "INSERT INTO bag VALUES (1, 'x', 1.50), (1, 'x', 1.50), (1, 'x', 1.50), (2, NULL, NULL), (2, NULL, NULL),"
        " (NULL, NULL, NULL), (NULL, NULL, NULL), (3, 'y', 3.00), (4, 'z', 4.00), (4, 'z', 4.00)"
    )
    publisher_hook.create_publication("pub", [PublishedTable("bag")])
    run_initial_sync(publisher_hook, slot="bag_slot", publications=["pub"], root=pipeline.storage, pipeline="p")
    subscriber_hook.create_subscription("native", ["pub"], publisher_conn_id=publisher.conn_id)

    # batch 1, one transaction: identical rows inserted, one of three deleted, one of two updated,
    # a NULL row deleted and updated, a row inserted and deleted again, a value removed entirely
    publisher.execute(
        "BEGIN;"
        "INSERT INTO bag VALUES (1, 'x', 1.50), (5, 'w', NULL), (5, 'w', NULL), (5, 'w', NULL);"
        f"DELETE FROM bag WHERE {one('n = 1')};"
        f"DELETE FROM bag WHERE {one('n = 1')};"
        f"UPDATE bag SET amount = 2.00 WHERE {one('n = 2')};"
        f"DELETE FROM bag WHERE {one('n IS NULL')};"
        f"UPDATE bag SET n = 6 WHERE {one('n IS NULL')};"
        "DELETE FROM bag WHERE n = 3;"
        f"DELETE FROM bag WHERE {one('n = 5')};"
        "UPDATE bag SET \"a.b\" = 'zz' WHERE n = 4;"  # both copies: 2 old rows, 2 new identical
        "COMMIT;"
    )
    first = pipeline.pull()
    # batch 2, across batches: the updated row back to its twin, the removed value again, more copies
    publisher.execute(
        "BEGIN;"
        f"UPDATE bag SET amount = NULL WHERE {one('n = 2 AND amount = 2.00')};"
        "INSERT INTO bag VALUES (3, 'y', 3.00), (3, 'y', 3.00), (6, NULL, NULL);"
        f"DELETE FROM bag WHERE {one('n = 5')};"
        "COMMIT;"
        "INSERT INTO bag VALUES (1, 'x', 1.50);"
    )
    second = pipeline.pull()
    # then ~2,000 random changes of single copies (the workload that lost 66 of 154 rows), in batches
    publisher.execute(random_workload(seed=14, changes=2000))
    more = 0
    while pipeline.pull(max_changes=1000)["batch"]:
        more += 1
    assert more >= 2
    expected = pipeline.source()
    assert sum(expected.values()) > 2 * len(expected)  # many copies per row value
    assert expected[(1, "x", Decimal("1.50"))] == 3 and expected[(3, "y", Decimal("3.00"))] == 2
    assert expected[(2, None, None)] == 2 and expected[(None, None, None)] == 0 and expected[(6, None, None)] == 2
    assert expected[(4, "zz", Decimal("4.00"))] == 2 and expected[(4, "z", Decimal("4.00"))] == 0

    # killed between the data commit of batch 1 (step 2) and its state commit …
    code, output = pipeline.apply(env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "2"})
    assert code != 0, output[-3000:]
    assert "crash point reached after the data commit of step 2" in output
    # the keyless snapshot cannot be adopted as staged: it is rewritten, numbered, and the log says why
    assert "the snapshot is rewritten, not adopted: a keyless table numbers its identical rows" in output
    snapshot_lsn = pipeline.position()
    after_crash = pipeline.lake()
    assert after_crash[(5, "w", None)] == 2 and after_crash[(1, "x", Decimal("1.50"))] == 2  # batch 1 is in
    # … so the re-run applies batch 1 again, then batch 2: nothing doubled, nothing lost
    steps = pipeline.applied()
    batch_names = [first["batch"].rsplit("/", 1)[1], second["batch"].rsplit("/", 1)[1]]
    assert steps[:2] == [("changes", batch_names[0]), ("changes", batch_names[1])]
    assert [kind for kind, _ in steps] == ["changes"] * (2 + more)
    # small batches of a numbered table: Iceberg row deltas the driver committed, no MERGE
    # (test_change_facts_apply MERGEs the same kinds of change)
    assert all(step["row_delta"] for step in pipeline.last_steps), pipeline.last_steps
    assert pipeline.position() > snapshot_lsn
    assert pipeline.lake() == expected

    # PostgreSQL's own subscriber holds the same multiset
    wait_until(lambda: Counter(subscriber.query(f"SELECT {COLUMNS} FROM bag")) == expected, timeout=60,
               message="the native subscriber to hold the publisher's rows")


def test_truncate_and_a_backfill_of_a_keyless_table(pipeline, publisher, publisher_hook):
    pipeline.write_mode = "copy-on-write"  # the other test merges on read
    publisher.execute(DDL)
    publisher.execute("INSERT INTO bag SELECT g % 3, 'v', NULL FROM generate_series(1, 9) g")  # 3 copies each
    publisher_hook.create_publication("pub", [PublishedTable("bag")])
    run_initial_sync(publisher_hook, slot="bag_slot", publications=["pub"], root=pipeline.storage, pipeline="p")

    # TRUNCATE, then identical rows again and one of them deleted, in the same batch
    publisher.execute("INSERT INTO bag VALUES (7, 'before', NULL); TRUNCATE bag;"
                      "INSERT INTO bag VALUES (1, 'v', NULL), (1, 'v', NULL), (1, 'v', NULL), (NULL, NULL, 1);"
                      f"DELETE FROM bag WHERE {one('n = 1')}")
    pipeline.pull()
    assert [kind for kind, _ in pipeline.applied()] == ["snapshot", "changes"]
    assert pipeline.lake() == pipeline.source() == Counter({(1, "v", None): 2, (None, None, Decimal("1.00")): 1})

    # the table as an earlier version of the job wrote it, without copy numbers: numbered on the next apply
    table = f"lake.{pipeline.namespace}.public__bag"
    pipeline.spark.sql(f"ALTER TABLE {table} DROP COLUMN _pglogical_occurrence")
    pipeline.spark.sql(f"ALTER TABLE {table} DROP COLUMN _pglogical_batch")
    publisher.execute(f"DELETE FROM bag WHERE {one('n = 1')}; INSERT INTO bag VALUES (1, 'v', NULL), (1, 'v', NULL),"
                      " (NULL, NULL, 1)")
    pipeline.pull()
    assert [kind for kind, _ in pipeline.applied()] == ["changes"]
    assert pipeline.lake() == pipeline.source() == Counter({(1, "v", None): 3, (None, None, Decimal("1.00")): 2})

    # a ranged backfill of a keyless table replaces the copies in its range, changes after it follow
    pipeline.spark.sql(f"DELETE FROM {table} WHERE n = 1 AND _pglogical_occurrence = 3")  # wrong in the range
    run_backfill(publisher_hook, tables=["public.bag"], publications=["pub"], root=pipeline.storage, pipeline="p",
                 key_range=KeyRange("n", 0, 5))
    publisher.execute(f"INSERT INTO bag VALUES (1, 'v', NULL), (9, 'out', NULL); DELETE FROM bag WHERE {one('n = 1')}")
    pipeline.pull()
    # the batch starts before the backfill's position: it applies first, the range then takes its
    # changes from the backfill's position on
    assert [kind for kind, _ in pipeline.applied()] == ["changes", "snapshot"]
    assert pipeline.lake() == pipeline.source() == Counter({(1, "v", None): 3, (9, "out", None): 1,
                                                            (None, None, Decimal("1.00")): 2})
    publisher.execute("DELETE FROM bag WHERE n = 9")

    # a full backfill supersedes earlier batches: a change before the backfill's snapshot (in it already), the
    # backfill, changes after it
    publisher.execute(f"INSERT INTO bag VALUES (8, 'early', NULL); DELETE FROM bag WHERE {one('n IS NULL')}")
    backfill = run_backfill(publisher_hook, tables=["public.bag"], publications=["pub"], root=pipeline.storage,
                            pipeline="p")
    publisher.execute(f"INSERT INTO bag VALUES (1, 'v', NULL), (8, 'early', NULL); DELETE FROM bag WHERE {one('n = 1')}")
    pipeline.pull()
    # the lakehouse is wrong before the backfill: a copy too many of a row nobody changed
    pipeline.spark.sql(f"INSERT INTO {table} VALUES (NULL, NULL, 1.00, 3, 'manual')")
    steps = pipeline.applied()
    assert steps[0] == ("snapshot", backfill["batch"].rsplit("/", 1)[1])
    assert [kind for kind, _ in steps] == ["snapshot", "changes"]
    expected = pipeline.source()
    assert expected == Counter({(1, "v", None): 3, (8, "early", None): 2, (None, None, Decimal("1.00")): 1})
    assert pipeline.lake() == expected
    properties = {r.key: r.value for r in pipeline.spark.sql(f"SHOW TBLPROPERTIES {table}").collect()}
    assert properties["write.merge.mode"] == "copy-on-write"
    # old metadata files are deleted at commit: a table applied every few minutes keeps 100
    assert properties["write.metadata.delete-after-commit.enabled"] == "true"
    state = {r.key: r.value for r in pipeline.spark.sql(
        f"SHOW TBLPROPERTIES lake.{pipeline.namespace}._pglogical_state").collect()}
    assert state["write.metadata.delete-after-commit.enabled"] == "true"


def test_a_ranged_backfill_of_a_keyless_table_while_changes_flow(pipeline, publisher, subscriber, publisher_hook,
                                                                subscriber_hook):
    """An ops backfill of one key range while the incremental flow goes on: changes committed
    after the backfill's snapshot are pulled and applied before its batch commits, so the
    lakehouse is past the snapshot when the backfill arrives. The range gets the snapshot plus
    those changes; the rest of the table must not get them twice (a multiset has no key to make a
    replay harmless). Killed after the backfill's data commit, the re-run writes the same rows."""
    publisher.execute(DDL)
    subscriber.execute(DDL)
    publisher.execute("INSERT INTO bag SELECT g % 10, CASE WHEN g % 4 = 0 THEN NULL ELSE 'v' END, NULL "
                      "FROM generate_series(1, 60) g; INSERT INTO bag VALUES (NULL, 'n', NULL), (NULL, 'n', NULL)")
    publisher_hook.create_publication("pub", [PublishedTable("bag")])
    run_initial_sync(publisher_hook, slot="bag_slot", publications=["pub"], root=pipeline.storage, pipeline="p")
    subscriber_hook.create_subscription("native", ["pub"], publisher_conn_id=publisher.conn_id)
    assert [kind for kind, _ in pipeline.applied()] == ["snapshot"]
    table = f"lake.{pipeline.namespace}.public__bag"
    # the lakehouse goes wrong inside the range: a copy lost, a copy too many
    pipeline.spark.sql(f"DELETE FROM {table} WHERE n = 2 AND \"a.b\" = 'v' AND _pglogical_occurrence = 1")
    pipeline.spark.sql(f"INSERT INTO {table} VALUES (3, 'v', NULL, 99, 'manual')")

    flowed = []

    def meanwhile(message: str) -> None:
        """Called by the backfill once its snapshot is taken, before its batch commits."""
        if flowed:
            return
        publisher.execute(
            "BEGIN;"
            "INSERT INTO bag VALUES (1, 'v', NULL), (1, 'v', NULL), (7, 'v', NULL);"  # in and out of the range
            f"DELETE FROM bag WHERE {one('n = 4')};"
            f"DELETE FROM bag WHERE {one('n = 8')};"
            f"UPDATE bag SET n = 6 WHERE {one('n = 2')};"  # leaves the range
            f"UPDATE bag SET n = 0 WHERE {one('n = 9')};"  # enters it
            f"UPDATE bag SET n = 4 WHERE {one('n IS NULL')};"  # from no range to the range
            "COMMIT")
        pipeline.pull()
        flowed.append(pipeline.applied())

    backfill = run_backfill(publisher_hook, tables=["public.bag"], publications=["pub"], root=pipeline.storage,
                            pipeline="p", key_range=KeyRange("n", 0, 5), report=meanwhile)
    assert [kind for kind, _ in flowed[0]] == ["changes"]
    before = pipeline.position()
    publisher.execute(f"INSERT INTO bag VALUES (2, 'v', NULL), (5, 'v', NULL); DELETE FROM bag WHERE {one('n = 0')}")
    pipeline.pull()

    # killed after the backfill's data commit, before its state commit …
    code, output = pipeline.apply(env={"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "1"})
    assert code != 0 and "crash point reached after the data commit of step 1" in output, output[-3000:]
    assert pipeline.position() == before
    # … the re-run folds the range again from staging, then applies the last batch to the whole table
    steps = pipeline.applied()
    assert steps[0] == ("snapshot", backfill["batch"].rsplit("/", 1)[1])
    assert [kind for kind, _ in steps] == ["snapshot", "changes"]
    expected = pipeline.source()
    assert expected[(3, "v", None)] == 6 and expected[(1, "v", None)] == 8
    assert pipeline.lake() == expected
    wait_until(lambda: Counter(subscriber.query(f"SELECT {COLUMNS} FROM bag")) == expected, timeout=60,
               message="the native subscriber to hold the publisher's rows")


def test_a_table_without_any_replica_identity_keeps_identical_inserts(pipeline, publisher, subscriber,
                                                                       publisher_hook, subscriber_hook):
    """No primary key and the default replica identity: PostgreSQL publishes its INSERTs and
    TRUNCATEs only. Identical rows (NULLs included) are kept, as the native subscriber keeps them,
    not collapsed into one by a MERGE on every column; the columns stay nullable."""
    ddl = 'CREATE TABLE bag(n int, "a.b" text, amount numeric(10,2));'
    publisher.execute(ddl)
    subscriber.execute(ddl)
    publisher.execute("INSERT INTO bag VALUES (1, 'x', 1.50), (1, 'x', 1.50), (NULL, NULL, NULL), (NULL, NULL, NULL)")
    publisher_hook.create_publication("pub", [PublishedTable("bag")], publish=["insert", "truncate"])
    # the source can update and delete it, and the lakehouse would not follow: append-only, opted into
    run_initial_sync(publisher_hook, slot="bag_slot", publications=["pub"], root=pipeline.storage, pipeline="p",
                     append_only=True)
    subscriber_hook.create_subscription("native", ["pub"], publisher_conn_id=publisher.conn_id)
    publisher.execute("INSERT INTO bag VALUES (1, 'x', 1.50), (2, NULL, NULL), (2, NULL, NULL), (NULL, NULL, NULL)")
    pipeline.pull()
    assert [kind for kind, _ in pipeline.applied()] == ["snapshot", "changes"]
    assert pipeline.lake() == pipeline.source() == Counter(
        {(1, "x", Decimal("1.50")): 3, (None, None, None): 3, (2, None, None): 2})
    # TRUNCATE, then identical rows again, across two batches
    publisher.execute("TRUNCATE bag; INSERT INTO bag VALUES (7, 't', NULL), (7, 't', NULL)")
    pipeline.pull()
    publisher.execute("INSERT INTO bag VALUES (7, 't', NULL)")
    pipeline.pull()
    assert [kind for kind, _ in pipeline.applied()] == ["changes", "changes"]
    assert pipeline.lake() == pipeline.source() == Counter({(7, "t", None): 3})
    wait_until(lambda: Counter(subscriber.query(f"SELECT {COLUMNS} FROM bag")) == pipeline.source(), timeout=60,
               message="the native subscriber to hold the same rows")
