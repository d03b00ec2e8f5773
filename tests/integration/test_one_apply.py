"""Issue 33, class 6 / invariant 14: one apply per pipeline, and no blind commit.

Two apply tasks of one pipeline at once (an Airflow retry beside a zombie, two DAG runs) once left
a keyless table with 351 rows where the source had 180: both read the same state and committed
the same change. Now an apply holds a lease on the pipeline (a property of the state table) from
before its first write to its end, and every commit the driver writes validates against the
snapshot its step read. Real PostgreSQL, real spark-submits, real Iceberg; the lakehouse is read
by Spark in this process and compared with the source read by psycopg2.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX
from airflow_provider_pglogical.staging.contract import APPLY_LEASE_HELD, APPLY_LEASE_PROPERTY_PREFIX
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import synced
from tests.support.spark_jobs import apply_args, job_result, reading_session, start_job, submit_command

pytestmark = pytest.mark.spark

SOURCE = """
CREATE TABLE orders (id int PRIMARY KEY, status text, qty int);
CREATE TABLE bag (n int, s text);
ALTER TABLE bag REPLICA IDENTITY FULL;
INSERT INTO orders SELECT g, 'new', g FROM generate_series(1, 60) g;
INSERT INTO bag SELECT g % 7, CASE WHEN g % 3 = 0 THEN NULL ELSE 's' || (g % 5) END FROM generate_series(1, 180) g;
"""
ONE_COPY = "ctid = (SELECT ctid FROM bag WHERE {} LIMIT 1)"
ROUNDS = [
    "UPDATE orders SET status = 'paid', qty = qty + 1 WHERE id % 4 = 0; DELETE FROM orders WHERE id % 9 = 0;"
    "INSERT INTO orders SELECT g, 'late', g FROM generate_series(100, 120) g;"
    "INSERT INTO bag SELECT n, s FROM bag WHERE n = 1;"
    f"DELETE FROM bag WHERE {ONE_COPY.format('n = 2 AND s IS NULL')};"
    f"UPDATE bag SET s = 'moved' WHERE {ONE_COPY.format('n = 3')}",
    "UPDATE orders SET id = id + 1000 WHERE id % 10 = 1; UPDATE orders SET qty = -qty WHERE status = 'late';"
    "INSERT INTO bag SELECT n, s FROM bag WHERE n IN (4, 5);"
    "DELETE FROM bag WHERE n = 6 AND s IS NULL;"
    f"UPDATE bag SET n = 40 WHERE {ONE_COPY.format('n = 0')}",
]
#: the job's exit code when the lease is held (``apply_changes.EXIT_LEASE_HELD``)
LEASE_HELD_EXIT = 75
#: seconds of the streaming test's windows
WINDOW = 30


class Lake:
    """A pipeline's staging and Iceberg namespace, applied by spark-submit or in this process."""

    def __init__(self, publisher, publisher_hook, tmp_path: Path, warehouse: Path, namespace: str, spark) -> None:
        self.publisher, self.hook, self.spark = publisher, publisher_hook, spark
        self.root, self.warehouse, self.namespace = tmp_path / "staging", warehouse, namespace
        self.storage = synced(publisher, publisher_hook, self.root, SOURCE, ["public.orders", "public.bag"])

    def pull_all(self) -> None:
        while True:
            if run_pull(self.hook, slot="s1", publications=["p"], root=self.storage, pipeline="p")["batch"] is None:
                return

    def command(self, **options) -> list[str]:
        return submit_command(APPLY_JOB, apply_args(self.root.as_uri(), "p", namespace=self.namespace, **options),
                              IcebergConfig(warehouse=self.warehouse.as_uri(), namespace=self.namespace),
                              driver_memory="1g")

    def run_in_process(self, **kwargs) -> dict:
        from airflow_provider_pglogical.spark.jobs import apply_changes

        return apply_changes.run(self.spark, ApplyOptions(self.root.as_uri(), "p", "lake", self.namespace, **kwargs))

    def table(self, name: str) -> str:
        return f"lake.{self.namespace}.{name}"

    def source(self) -> dict[str, Counter]:
        return {"orders": Counter(self.publisher.query("SELECT id, status, qty FROM orders")),
                "bag": Counter(self.publisher.query("SELECT n, s FROM bag"))}

    def lake(self) -> dict[str, Counter]:
        return {"orders": Counter(tuple(r) for r in self.spark.table(self.table("public__orders"))
                                  .select("id", "status", "qty").collect()),
                "bag": Counter(tuple(r) for r in self.spark.table(self.table("public__bag")).select("n", "s").collect())}

    def snapshots(self) -> dict[str, int | None]:
        """The current snapshot of each table: what an apply that wrote nothing leaves as it was."""
        found = {}
        for name in ("public__orders", "public__bag", "_pglogical_state"):
            rows = self.spark.sql(f"SELECT snapshot_id FROM {self.table(name)}.snapshots "
                                  "ORDER BY committed_at DESC LIMIT 1").collect()
            found[name] = rows[0].snapshot_id if rows else None
        return found

    def set_lease(self, holder: str, expires_in: float, process: dict | None = None,
                  window_until: float | None = None) -> None:
        """Leave a lease as another apply would: alive, or (``expires_in`` < 0) one a killed apply left;
        ``process``: the holder's driver process (``lease.this_process()``); ``window_until``: a
        keep-running window's earliest end."""
        now = time.time()
        lease = json.dumps({"id": f"other-{holder}", "holder": holder, "taken_at": now - 30,
                            "expires_at": now + expires_in, "process": process,
                            **({"window_until": window_until} if window_until else {})})
        self.spark.sql(f"ALTER TABLE {self.table('_pglogical_state')} SET TBLPROPERTIES "
                       f"('{APPLY_LEASE_PROPERTY_PREFIX}p' = '{lease}')")

    def lease(self) -> str | None:
        rows = self.spark.sql(f"SHOW TBLPROPERTIES {self.table('_pglogical_state')}").collect()
        return next((r.value for r in rows if r.key == f"{APPLY_LEASE_PROPERTY_PREFIX}p"), None)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="module")
def spark(warehouse):
    """An in-process Spark session reading (and, for in-process applies, writing) the warehouse."""
    from airflow_provider_pglogical.spark.jobs import apply_changes

    session = reading_session(warehouse, "test-one-apply")
    apply_changes.tune_session(session)
    yield session
    session.stop()


def _finish(process) -> tuple[int, str]:
    output, _ = process.communicate(timeout=600)
    return process.returncode, output


def test_two_applies_at_once_every_round_end_equal_to_the_source(publisher, publisher_hook, tmp_path, warehouse,
                                                                 spark):
    lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "twice", spark)
    outcomes = []
    for round_, changes in enumerate([None, *ROUNDS]):
        if changes:
            publisher.execute(changes)
            lake.pull_all()
        # two applies of the pipeline at the same moment: one applies small batches as row deltas
        # the driver commits, the other MERGEs every batch
        processes = [start_job(lake.command()), start_job(lake.command(row_deltas=False))]
        with ThreadPoolExecutor(max_workers=2) as pool:
            ended = list(pool.map(_finish, processes))
        succeeded = 0
        for code, output in ended:
            result = job_result(output, RESULT_PREFIX)
            if code == 0:
                assert "error" not in result, output[-5000:]
                succeeded += 1
                outcomes.append("applied")
            else:  # the only failure allowed: the other apply held the lease, and this one wrote nothing
                assert code == LEASE_HELD_EXIT and result["error"]["kind"] == APPLY_LEASE_HELD, output[-5000:]
                assert "another apply is running" in result["error"]["message"]
                assert result["steps"] == []
                outcomes.append("lease held")
        assert succeeded >= 1, [output[-3000:] for _, output in ended]
        assert lake.lake() == lake.source(), f"round {round_}: outcomes {outcomes}"
    print(f"two applies at once, per round: {outcomes}")
    assert lake.lease() is None  # every apply that took it released it


def test_a_held_lease_stops_an_apply_before_it_writes_and_a_killed_holders_lease_expires(
        publisher, publisher_hook, tmp_path, warehouse, spark, monkeypatch):
    from airflow_provider_pglogical.exceptions import ConcurrentApplyError
    from airflow_provider_pglogical.operators._errors import PermanentError
    from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
    from airflow_provider_pglogical.spark.apply.lease import ApplyLeaseHeld

    lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "held", spark)
    lake.run_in_process()
    publisher.execute(ROUNDS[0])
    lake.pull_all()
    before = lake.snapshots(), lake.lake(), sorted(p.relative_to(lake.root) for p in lake.root.rglob("*"))

    # another apply is running (a zombie beside its retry): this one stops before writing anything
    lake.set_lease("task sync.apply, run manual_1, try 1", expires_in=600)
    with pytest.raises(ApplyLeaseHeld) as held:
        lake.run_in_process()
    message = str(held.value)
    assert "another apply is running (task sync.apply, run manual_1, try 1" in message
    assert "Nothing was applied" in message and "max_active_tis_per_dag=1" in message
    assert (lake.snapshots(), lake.lake(), sorted(p.relative_to(lake.root) for p in lake.root.rglob("*"))) == before
    # the operator raises it as a retryable error (no AirflowFailException), from the job's result
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    operator = IcebergApplyOperator(task_id="apply", staging_root=lake.root.as_uri(), pipeline="p",
                                    iceberg=IcebergConfig(warehouse=warehouse.as_uri(), namespace="held"),
                                    conf={"spark.ui.enabled": "false"}, env_vars={"SPARK_LOCAL_IP": "127.0.0.1"})
    with pytest.raises(ConcurrentApplyError) as raised:
        operator.execute({})
    assert not isinstance(raised.value, PermanentError) and not raised.value.permanent
    assert "another apply is running" in str(raised.value) and raised.value.lease["holder"].startswith("task sync")
    assert lake.snapshots() == before[0] and lake.lake() == before[1]
    # the holder is a keep-running window that runs on (the streaming DAG's, beside a backfill DAG's
    # apply): it applies every batch committed before its end, so the apply ends as skipped, no error
    from airflow_provider_pglogical.operators.iceberg_apply import AirflowSkipException
    from airflow_provider_pglogical.ui.history import read_history

    recorded = read_history(lake.storage, "p", "apply")
    lake.set_lease("task stream.apply_window, run manual_2, try 1", expires_in=600, window_until=time.time() + 600)
    with pytest.raises(AirflowSkipException, match=r"the apply window of task stream.apply_window, run manual_2, "
                                                   r"try 1 holds the lease and runs until .* nothing is applied here"):
        operator.execute({})
    assert lake.snapshots() == before[0] and lake.lake() == before[1]
    assert read_history(lake.storage, "p", "apply") == recorded  # a skip is no error for the pipeline view
    # a window about to end (within the clocks' margin) promises nothing: retried as before
    lake.set_lease("task stream.apply_window, run manual_2, try 1", expires_in=600, window_until=time.time() + 5)
    with pytest.raises(ConcurrentApplyError):
        operator.execute({})

    # a live lease whose driver ran on this machine and has ended (a killed task, retried here) is
    # taken over at once, without waiting for it to expire
    from airflow_provider_pglogical.spark.apply.lease import _start_time, this_process

    killed = subprocess.Popen(["sleep", "600"])
    process = {**this_process(), "pid": killed.pid, "start": _start_time(killed.pid)}
    lake.set_lease("task sync.apply, run manual_1, try 1", expires_in=600, process=process)
    with pytest.raises(ApplyLeaseHeld):  # while that process runs, it holds the lease
        lake.run_in_process()
    killed.kill()
    killed.wait()
    assert lake.run_in_process()["steps"] and lake.lake() == lake.source()
    assert lake.lease() is None

    # a killed apply's lease on another machine blocks only until it expires: then the next apply takes it over
    publisher.execute(ROUNDS[1])
    lake.pull_all()
    lake.set_lease("task sync.apply, run manual_1, try 1", expires_in=-1)
    steps = lake.run_in_process()["steps"]
    assert steps and lake.lake() == lake.source()
    assert lake.lease() is None  # released at the end


def test_a_pull_window_and_an_apply_window_side_by_side_apply_each_commit_in_rounds_and_end_equal(
        publisher, publisher_hook, tmp_path, warehouse, spark):
    """Streaming (docs/streaming.md): a pull window (the operator, in a thread) and an apply window
    (the job's ``--keep-running`` loop in this process's session) run at once while the source
    changes; each change is applied by a round of the running window, a second apply finds the
    window's lease, and the lakehouse ends equal to the source."""
    from airflow_provider_pglogical.capture import source_projection
    from airflow_provider_pglogical.verification.witness import verify_tables
    from airflow_provider_pglogical.lsn import Lsn
    from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
    from airflow_provider_pglogical.spark.apply.lease import ApplyLeaseHeld
    from airflow_provider_pglogical.spark.jobs import verify_tables as verify_job
    from airflow_provider_pglogical.embedded.postgres import wait_until
    from airflow_provider_pglogical.lakehouse.staging_roots import storage_path
    from airflow_provider_pglogical.ui.history import read_history

    lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "window", spark)
    # both windows outlast the changes below, each waiting for its round: a loaded machine's rounds take seconds
    pull = PgSlotPullOperator(task_id="pull", slot="s1", publications=["p"], staging_root=lake.root.as_uri(),
                              pipeline="p", postgres_conn_id=publisher.conn_id, keep_running=WINDOW, poll_interval=0.2)

    def applied_past(lsn: Lsn) -> bool:
        return any(entry.get("end_lsn") and Lsn.parse(entry["end_lsn"]) >= lsn
                   for entry in read_history(lake.storage, "p", "apply"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        applying = pool.submit(lake.run_in_process, keep_running=WINDOW, poll_interval=0.2)
        # the window counts from the end of its first round (the initial snapshot): start pulling then
        wait_until(lambda: read_history(lake.storage, "p", "apply") or applying.done(), timeout=300, interval=0.2,
                   message="the apply window's first round")
        pulling = pool.submit(pull.execute, {})
        for changes in ROUNDS:
            publisher.execute(changes)
            lsn = Lsn.parse(publisher.query("SELECT pg_current_wal_lsn()::text")[0][0])
            wait_until(lambda: applied_past(lsn) or applying.done(), timeout=120, interval=0.2,
                       message="a round of the apply window to cover the change")
            assert not applying.done(), applying.result()
        with pytest.raises(ApplyLeaseHeld, match="another apply is running"):  # the window holds the lease
            lake.run_in_process()
        lease = json.loads(lake.lease())  # saying when its window ends at the earliest: what it applies
        assert lease["window_until"] >= lease["taken_at"] + WINDOW
        pulled, applied = pulling.result(timeout=120), applying.result(timeout=120)

    assert lake.lake() == lake.source()
    tables = source_projection.source_tables(publisher_hook.published_tables(["p"]), "lake", "window")
    verified = verify_tables(publisher_hook.connect_kwargs(), tables, lake.storage, "p",
                             lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text())))
    assert verified["equal"], verified["summary"]
    # more than one pull staged a batch, more than one round applied one; each round in the history
    assert pulled["batches"] >= len(ROUNDS) and pulled["pulls"] > pulled["batches"]
    window = applied["window"]
    assert window["rounds"] >= 1 + len(ROUNDS) and window["polls"] > window["rounds"]
    rounds = [entry for entry in read_history(lake.storage, "p", "apply") if "round" in entry]
    assert [entry["round"] for entry in rounds] == list(range(1, window["rounds"] + 1))
    assert all(entry["freshness_seconds"] is not None for entry in rounds[1:] if entry["rows"])
    assert lake.lease() is None  # released at the window's end


def test_an_initial_loads_window_started_before_the_sync_applies_the_snapshot_and_ends(
        publisher, publisher_hook, tmp_path, warehouse, spark):
    """``IcebergApplyOperator(until_loaded=True)``'s job, started beside the initial sync instead of
    after it: its session and lease are ready before the snapshot is committed, it applies the
    snapshot in the round after the commit and ends there, equal to the source. One that waits in
    vain fails at the end of its window, naming the sync, with nothing written but its state table."""
    from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
    from airflow_provider_pglogical.embedded.postgres import wait_until
    from airflow_provider_pglogical.management.publications import PublishedTable
    from airflow_provider_pglogical.spark.common.errors import ApplyError
    from airflow_provider_pglogical.spark.jobs import apply_changes
    from airflow_provider_pglogical.ui.history import read_history

    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable("public.orders"), PublishedTable("public.bag")])
    root, namespace = tmp_path / "staging", "loadbeside"
    storage = ObjectStoragePath(root.as_uri())
    lake = object.__new__(Lake)  # this pipeline's snapshot comes from the sync below, not from Lake()
    lake.publisher, lake.spark, lake.root, lake.namespace = publisher, spark, root, namespace

    def window(seconds: float) -> dict:
        return apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", namespace, keep_running=seconds,
                                 poll_interval=0.2, until_loaded=True))

    started = time.monotonic()
    with pytest.raises(ApplyError, match=r"no snapshot batch was committed in the 1 s .*initial sync started "
                                         r"beside it failed or is still copying"):
        window(1)
    print(f"a window waiting in vain: {time.monotonic() - started:.1f} s")
    assert [r.tableName for r in spark.sql(f"SHOW TABLES IN lake.{namespace}").collect()] == ["_pglogical_state"]
    assert lake.lease() is None  # released by the failed window
    recorded = len(read_history(storage, "p", "apply"))
    with ThreadPoolExecutor(max_workers=1) as pool:
        applying = pool.submit(window, 120)
        # its first round (nothing committed yet: no table) is in the apply history, after the failed window's
        wait_until(lambda: len(read_history(storage, "p", "apply")) > recorded or applying.done(), timeout=120,
                   interval=0.1, message="the window's first round")
        assert not applying.done(), applying.result()
        # waiting for the snapshot, the lease held; an initial load's window ends early: no end promised
        assert lake.lease() is not None and "window_until" not in json.loads(lake.lease())
        synced_at = time.monotonic()
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
        print(f"the sync beside the window: {time.monotonic() - synced_at:.1f} s")
        summary = applying.result(timeout=180)
    print(f"the window: {summary['window']}")
    assert sorted((s["table"], s["kind"]) for s in summary["steps"]) == [
        ("public.bag", "snapshot"), ("public.orders", "snapshot")]
    assert summary["window"]["rounds"] == 2 and summary["window"]["seconds"] < 120  # ended, not timed out
    # while it waited, it warmed its JVM up on throwaway tables (spark/jobs/warm_up.py), none in the lakehouse
    assert summary["window"]["warm_up_seconds"] > 0
    assert sorted(r.tableName for r in spark.sql(f"SHOW TABLES IN lake.{namespace}").collect()) == [
        "_pglogical_state", "public__bag", "public__orders"]
    assert lake.lake() == lake.source() and lake.lease() is None


def test_a_waiting_windows_warm_up_leaves_nothing_behind_and_a_failed_one_only_warns(spark, tmp_path, monkeypatch,
                                                                                     caplog):
    """The warm-up adopts a file and replaces a partition on tables of its own in a temporary
    directory, which it removes; when it cannot run, the window only loses its speed."""
    import tempfile

    from airflow_provider_pglogical.spark.jobs.warm_up import warm_up

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert warm_up(spark) > 0
    assert list(tmp_path.iterdir()) == []
    assert warm_up(object()) is None  # no session: nothing to warm
    assert "could not warm the driver up for the next snapshot (it runs cold)" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_the_warm_up_runs_on_tables_of_the_lakehouses_format_version(spark, tmp_path, monkeypatch):
    """IcebergConfig(format_version=3): the warm-up's tables are v3, so it runs the code a v3
    round runs (row lineage's first row ids in every commit); v2 by default."""
    import json
    import shutil
    import tempfile

    from airflow_provider_pglogical.spark.jobs.warm_up import warm_up

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)  # keep its tables to look at them

    def versions() -> set[int]:
        return {json.loads(path.read_text())["format-version"] for path in tmp_path.rglob("*.metadata.json")}

    assert warm_up(spark, 3) > 0
    assert versions() == {3}
    for directory in list(tmp_path.iterdir()):
        monkeypatch.undo()  # the real rmtree, to clear the v3 run's tables
        shutil.rmtree(directory)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)
    assert warm_up(spark) > 0
    assert versions() == {2}


def test_driver_commits_refuse_when_another_commit_changed_the_table_since_the_step_read_it(spark):
    import pyarrow as pa

    from airflow_provider_pglogical.spark.row_delta.driver_commits import ConcurrentCommit, DriverCommits
    from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
    from airflow_provider_pglogical.spark.apply.plan import TableState

    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.valid")
    spark.sql("CREATE TABLE lake.valid.t (id bigint NOT NULL, v string) USING iceberg TBLPROPERTIES "
              "('format-version'='2', 'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
              "'write.delete.mode'='merge-on-read')")
    spark.sql("INSERT INTO lake.valid.t VALUES (1, 'a'), (2, 'b')")
    lakehouse = Lakehouse(spark, "lake", "valid", "merge-on-read", None)
    writer = DriverCommits(spark, lakehouse)

    def row_delta(table, read_at):
        schema = table.schema()
        key = writer.arrow_field(schema, "id", pa.int64())
        data = pa.Table.from_arrays([pa.array([2], pa.int64()), pa.array(["b2"])],
                                    schema=pa.schema([key, writer.arrow_field(schema, "v", pa.string())]))
        # the rows it replaces (every copy of id 2), by data file and position, as the step read them
        deletes = [(r["_file"], r["_pos"]) for r in spark.sql(
            f"SELECT _file, _pos FROM lake.valid.t VERSION AS OF {read_at} WHERE id = 2").collect()]
        return writer.row_delta(table, data, deletes, read_at=read_at)

    def rows():
        return sorted(tuple(r) for r in spark.table("lake.valid.t").collect())

    table = writer.load("t")
    read_at = table.currentSnapshot().snapshotId()  # what the step read
    spark.sql("INSERT INTO lake.valid.t VALUES (2, 'b')")  # another writer, after the read: 2 is there twice
    with pytest.raises(ConcurrentCommit) as refused:
        row_delta(table, read_at)
    assert "table lake.valid.t" in str(refused.value) and f"at snapshot {read_at}" in str(refused.value)
    assert "Nothing of this step was committed" in str(refused.value)
    assert rows() == [(1, "a"), (2, "b"), (2, "b")]  # nothing committed
    # read again, the same change commits
    table = writer.load("t")
    row_delta(table, table.currentSnapshot().snapshotId())
    assert rows() == [(1, "a"), (2, "b2")]

    # the state commit refuses when the pipeline's state changed since this run read it; another
    # pipeline's state (another partition) is no conflict
    mine, other = (Lakehouse(spark, "lake", "valid", "merge-on-read", None) for _ in range(2))
    mine.state.read_state("p")  # creates the state table
    mine.state.write_state("p", {"public.t": TableState("t", 1, set(), "b0")})
    for pipeline in ("p", "q"):
        mine.state.read_state(pipeline)
        other.state.read_state(pipeline)
    other.state.write_state("p", {"public.t": TableState("t", 7, set(), "b1")})
    with pytest.raises(ConcurrentCommit, match="_pglogical_state"):
        mine.state.write_state("p", {"public.t": TableState("t", 5, set(), "b1")})
    mine.state.write_state("q", {"public.t": TableState("t", 9, set(), "b1")})  # read before p changed: no conflict
    assert mine.state.read_state("p")["public.t"].position == 7
    mine.state.write_state("p", {"public.t": TableState("t", 8, set(), "b2")})  # read again: commits
    assert {p: other.state.read_state(p)["public.t"].position for p in ("p", "q")} == {"p": 8, "q": 9}


def test_spark_overwrites_of_the_state_and_of_a_numbering_cannot_lose_a_concurrent_commit(spark, monkeypatch):
    from pyspark.sql import DataFrame

    from airflow_provider_pglogical.spark.row_delta.driver_commits import ConcurrentCommit
    from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
    from airflow_provider_pglogical.spark.apply.plan import TableState

    # The state's Spark write (no pyarrow) remembers its own snapshot, not the table's newest: another
    # apply's state commit landing just after it still conflicts with this run's next write.
    mine, other = (Lakehouse(spark, "lake", "spark_writes", "merge-on-read", None) for _ in range(2))
    mine.state.read_state("p")
    mine.state.write_state("p", {"public.t": TableState("t", 1, set(), "b0")}, by_driver=False)
    loaded, armed = mine.iceberg_table, [True]

    def load_after_another_commit(target: str):
        if armed and target == "_pglogical_state":
            armed.clear()
            other.state.read_state("p")
            other.state.write_state("p", {"public.t": TableState("t", 7, set(), "b9")})
        return loaded(target)

    monkeypatch.setattr(mine, "iceberg_table", load_after_another_commit)
    mine.state.write_state("p", {"public.t": TableState("t", 2, set(), "b1")}, by_driver=False)
    assert not armed
    with pytest.raises(ConcurrentCommit, match="_pglogical_state.*Nothing of this step was committed"):
        mine.state.write_state("p", {"public.t": TableState("t", 3, set(), "b2")}, by_driver=False)
    assert other.state.read_state("p")["public.t"].position == 7

    # Numbering a keyless table's copies overwrites it from what it read: a row committed meanwhile
    # refuses the overwrite instead of vanishing.
    spark.sql("CREATE TABLE lake.spark_writes.k (v string) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql("INSERT INTO lake.spark_writes.k VALUES ('a'), ('a'), ('b')")
    checkpoint = DataFrame.localCheckpoint

    def read_then_another_commit(frame, *args, **kwargs):
        read = checkpoint(frame, *args, **kwargs)
        spark.sql("INSERT INTO lake.spark_writes.k VALUES ('c', NULL, NULL)")
        return read

    lakehouse = Lakehouse(spark, "lake", "spark_writes", "merge-on-read", None)
    monkeypatch.setattr(DataFrame, "localCheckpoint", read_then_another_commit)
    with pytest.raises(ConcurrentCommit, match="spark_writes`.`k`.*Nothing of this step was committed"):
        lakehouse._number_copies("k", {"v": "string"})
    monkeypatch.setattr(DataFrame, "localCheckpoint", checkpoint)
    assert sorted(r.v for r in spark.table("lake.spark_writes.k").collect()) == ["a", "a", "b", "c"]
    lakehouse._number_copies("k", {"v": "string", "_pglogical_occurrence": "int", "_pglogical_batch": "string"})
    assert sorted(tuple(r) for r in spark.table("lake.spark_writes.k").select("v", "_pglogical_occurrence").collect()) \
        == [("a", 1), ("a", 2), ("b", 1), ("c", 1)]


def test_a_round_records_the_steps_that_committed_when_another_step_of_it_failed(
        publisher, publisher_hook, tmp_path, warehouse, spark, monkeypatch):
    """A round's steps run side by side; one may meet a commit of housekeeping and commit nothing
    (``ConcurrentCommit``) while another commits. The state commit now records the step that
    committed before the round's failure is raised: else the keyless table's landed commit was
    applied again by the next round whenever housekeeping had expired the snapshot that said it
    landed (seen in CI: 4 rows of ``bag`` counted twice)."""
    from airflow_provider_pglogical.spark.jobs import apply_changes
    from airflow_provider_pglogical.spark.row_delta.driver_commits import ConcurrentCommit

    lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "oneofround", spark)
    lake.run_in_process()
    publisher.execute(ROUNDS[0])
    lake.pull_all()
    step, met = apply_changes._apply_step, []

    def orders_meets_housekeeping(keyed, multisets, lakehouse, source, state, *args, **kwargs):
        if source == "public.orders" and not met:  # the contract: nothing of the step was committed
            met.append(source)
            raise ConcurrentCommit("table public__orders: another commit changed it after this step read it")
        return step(keyed, multisets, lakehouse, source, state, *args, **kwargs)

    monkeypatch.setattr(apply_changes, "_apply_step", orders_meets_housekeeping)
    before = {row.source_table: row.position for row in
              spark.table(lake.table("_pglogical_state")).select("source_table", "position").collect()}
    with pytest.raises(ConcurrentCommit, match="public__orders"):
        lake.run_in_process()
    after = {row.source_table: row.position for row in
             spark.table(lake.table("_pglogical_state")).select("source_table", "position").collect()}
    assert after["public.orders"] == before["public.orders"]  # its step committed nothing
    assert after["public.bag"] > before["public.bag"]  # recorded beside the failure
    assert lake.run_in_process()["steps"] and lake.lake() == lake.source()


def test_a_state_commit_that_met_housekeeping_alone_is_made_again(publisher, publisher_hook, tmp_path, warehouse,
                                                                  spark):
    """Housekeeping rewrites the state table's files and expires the snapshot a run read its state
    at, between the run's read and its state commit: Iceberg refuses that commit (its base is gone),
    but the pipeline's rows are still what the run read, so the commit is made again on the table
    as it is. Real Iceberg procedures, as the maintenance job calls them."""
    from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse

    lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "statemet", spark)
    lake.run_in_process()
    lakehouse = Lakehouse(spark, "lake", "statemet", "merge-on-read", None)
    states = lakehouse.state.read_state("p")
    state = lake.table("_pglogical_state")
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{state}', options => map('rewrite-all', 'true'))")
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)
    spark.sql(f"CALL lake.system.expire_snapshots(table => '{state}', older_than => TIMESTAMP "
              f"'{now:%Y-%m-%d %H:%M:%S}', retain_last => 1)")
    states["public.orders"].position += 1  # what a round's step would have moved
    lakehouse.state.write_state("p", states)
    assert lakehouse.state.read_state("p")["public.orders"].position == states["public.orders"].position
