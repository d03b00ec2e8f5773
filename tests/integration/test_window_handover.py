"""Issue 51: no stall at a window boundary. The streaming DAG starts the next run's windows before
the previous ones end (``max_active_runs=2`` and a lead): two pull windows pull side by side, and
the next apply window waits for the lease and takes it over the moment the previous one releases
it. A writer commits all along; every commit arrives exactly once (a keyless table would show a
second copy) and the lakehouse ends equal to the source, checked by the independent witness too.
Real PostgreSQL, real Iceberg; both apply windows are the job's loop in this process's session.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.test_one_apply import Lake

pytestmark = pytest.mark.spark

#: the first window's length after its first round; the second's (less its wait for the lease),
#: which outlasts the second pull window (its last listing comes after that window's last pull)
FIRST, SECOND, SECOND_PULL = 15, 75, 60
#: the writer stops at the second window's first round, or this long after the second windows started
#: (before the second pull window ends: a later commit would be pulled by no window)
WRITING = 50
#: what a handover may add to the next window's first round: the release, a read of the lease,
#: the take and its read back (state-table metadata commits of ~0.1 s each on an idle machine)
HANDOVER_SLACK = 5.0


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    return tmp_path_factory.mktemp("warehouse")


@pytest.fixture(scope="module")
def spark(warehouse):
    from airflow_provider_pglogical.spark.jobs import apply_changes
    from tests.support.spark_jobs import reading_session

    session = reading_session(warehouse, "test-window-handover")
    apply_changes.tune_session(session)
    yield session
    session.stop()


class Writer(threading.Thread):
    """One transaction every 0.2 s: a row into the keyless table, an update of a keyed row."""

    def __init__(self, publisher) -> None:
        super().__init__(daemon=True)
        self.conn, self.done, self.commits = publisher.connect(autocommit=True), threading.Event(), 0

    def run(self) -> None:
        with self.conn.cursor() as cur:
            while not self.done.wait(0.2):
                self.commits += 1
                cur.execute("BEGIN")
                cur.execute("INSERT INTO bag VALUES (%s, 'w')", (self.commits % 7,))
                cur.execute("UPDATE orders SET qty = qty + 1 WHERE id = %s", (self.commits % 50 + 1,))
                cur.execute("COMMIT")
        self.conn.close()


def at(entry: dict) -> float:
    return dt.datetime.fromisoformat(entry["at"]).timestamp()


def test_two_overlapping_windows_hand_the_lease_over_and_every_commit_arrives_once(
        publisher, publisher_hook, tmp_path, warehouse, spark):
    from airflow_provider_pglogical.capture import source_projection
    from airflow_provider_pglogical.embedded.postgres import wait_until
    from airflow_provider_pglogical.verification.witness import verify_tables
    from airflow_provider_pglogical.operators.pull import PgSlotPullOperator
    from airflow_provider_pglogical.spark.jobs import verify_tables as verify_job
    from airflow_provider_pglogical.lakehouse.staging_roots import storage_path
    from airflow_provider_pglogical.ui.history import read_history

    lake = Lake(publisher, publisher_hook, tmp_path, warehouse, "handover", spark)

    def pull_window(seconds: float) -> PgSlotPullOperator:
        return PgSlotPullOperator(task_id="pull_window", slot="s1", publications=["p"], pipeline="p",
                                  staging_root=lake.root.as_uri(), postgres_conn_id=publisher.conn_id,
                                  keep_running=seconds, poll_interval=0.5)

    def rounds() -> list[dict]:
        return [entry for entry in read_history(lake.storage, "p", "apply") if "round" in entry]

    writer = Writer(publisher)
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(lake.run_in_process, keep_running=FIRST, poll_interval=0.25)
        wait_until(lambda: rounds() or first.done(), timeout=300, interval=0.2, message="the first window's first round")
        first_pull = pool.submit(pull_window(FIRST + 5).execute, {})
        writer.start()
        assert not first.done(), first.result()
        # the next run's windows start while the first ones run: its apply waits for the lease
        second = pool.submit(lake.run_in_process, keep_running=SECOND, poll_interval=0.25)
        second_pull = pool.submit(pull_window(SECOND_PULL).execute, {})
        started = time.monotonic()
        lease = json.loads(wait_until(lake.lease, timeout=10, interval=0.2, message="the first window's lease"))
        assert lease["window_until"] > lease["taken_at"]  # promised after its first round
        # the writer goes on across the boundary, into the second window's first round
        wait_until(lambda: [r["round"] for r in rounds()].count(1) == 2 or time.monotonic() > started + WRITING,
                   timeout=120, interval=0.2, message="the second window's first round")
        crossed = [r["round"] for r in rounds()].count(1) == 2  # writing until the handover (not cut short)
        writer.done.set()
        ended = first.result(timeout=300)
        writer.join()
        pulled = [first_pull.result(timeout=120), second_pull.result(timeout=120)]  # before the second apply ends
        taken = second.result(timeout=300)

    assert lake.lake() == lake.source()  # the keyless table: every row once, none twice
    tables = source_projection.source_tables(publisher_hook.published_tables(["p"]), "lake", "handover")
    verified = verify_tables(publisher_hook.connect_kwargs(), tables, lake.storage, "p",
                             lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text())))
    assert verified["equal"], verified["summary"]
    assert lake.lease() is None

    # both pull windows staged batches: they pulled side by side, each pull under the slot's lock
    assert all(summary["batches"] >= 1 for summary in pulled), pulled
    assert sum(summary["changes"] for summary in pulled) == 2 * writer.commits
    # the second window waited for the handover, and counts that wait as part of its window
    assert taken["window"]["handover_seconds"] > 1.0, taken["window"]
    assert ended["window"]["handover_seconds"] == 0.0
    # the gap between the first window's last round and the second's first is that round and the handover
    history = rounds()
    boundary = [i for i, entry in enumerate(history) if entry["round"] == 1][1]
    last, next_first = history[boundary - 1], history[boundary]
    gap = at(next_first) - at(last)
    print(f"handover: waited {taken['window']['handover_seconds']:.1f} s; gap between rounds {gap:.2f} s, of "
          f"which the second window's first round {next_first['seconds']:.2f} s; commits {writer.commits}")
    assert last["round"] == ended["window"]["rounds"]
    assert next_first["rows"] > 0 or not crossed  # commits made during the first window's last round
    assert 0 < gap <= next_first["seconds"] + HANDOVER_SLACK, (last, next_first)
