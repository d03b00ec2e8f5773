"""Which snapshot of a table holds the source exactly at one LSN (``consistent_cut.snapshot_at``), from
its snapshots' summaries and its row of the state table: the cases a live run cannot stage cheaply."""

from __future__ import annotations

from airflow_provider_pglogical.lakehouse.consistent_cut import commit_of, snapshot_at
from airflow_provider_pglogical.spark.apply.plan import Batch, Step, TableState, plan_table
from airflow_provider_pglogical.staging.contract import (
    SNAPSHOT_BATCH,
    SNAPSHOT_FROM_LSN,
    SNAPSHOT_LSN,
    SNAPSHOT_PIPELINE,
    format_batch_name,
    hex16,
)
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest


def applied(snapshot_id: int, start: int, end: int, *, cut: bool = True, operation: str = "overwrite"):
    """The snapshot a change step of batch ``[start, end)`` committed."""
    step = Step("changes", Batch(format_batch_name(start, end, "changes"), start, end, "changes"), start, cut=cut)
    return commit_of(snapshot_id, operation, step.commit_properties("p"))


def batch(start: int, end: int) -> str:
    return format_batch_name(start, end, "changes")


def test_a_commit_holds_every_lsn_up_to_where_the_next_begins():
    history = [applied(1, 0, 10), applied(2, 10, 20), applied(3, 30, 40)]  # the table not in [20, 30)
    assert [snapshot_at(history, lsn, batch(30, 40), 50) for lsn in (10, 20, 25, 30, 40, 50)] == [1, 2, 2, 2, 3, 3]
    assert snapshot_at(history, 35, batch(30, 40), 50) is None  # inside the table's own batch
    assert snapshot_at(history, 51, batch(30, 40), 50) is None  # past what the state records
    assert snapshot_at(history, 5, batch(30, 40), 50) is None  # before its first commit


def test_a_commit_the_state_does_not_record_is_not_a_cut():
    """A killed apply committed batch [20, 30) but not its state: the table is at 20 for readers."""
    history = [applied(1, 0, 10), applied(2, 10, 20), applied(3, 20, 30)]
    assert snapshot_at(history, 30, batch(10, 20), 20) is None
    assert snapshot_at(history, 20, batch(10, 20), 20) == 2
    # applied again by the next run (a second commit of the batch), then recorded
    again = [*history, applied(4, 20, 30)]
    assert snapshot_at(again, 30, batch(20, 30), 30) == 4
    assert snapshot_at(again, 20, batch(20, 30), 30) == 2


def test_a_compaction_holds_its_parents_rows_and_a_foreign_commit_ends_the_cuts_before_it():
    replace = commit_of(3, "replace", {"added-data-files": "1"})
    history = [applied(1, 0, 10), applied(2, 10, 20), replace]
    assert snapshot_at(history, 20, batch(10, 20), 30) == 3
    assert snapshot_at(history, 10, batch(10, 20), 30) == 1
    foreign = commit_of(4, "append", {})
    assert snapshot_at([*history, foreign], 20, batch(10, 20), 30) is None
    assert snapshot_at([replace, applied(5, 10, 20)], 20, batch(10, 20), 20) == 5  # an expired parent


def test_a_ranged_backfill_is_no_cut_until_the_table_is_back_where_it_was():
    snapshot = Batch(format_batch_name(15, 15, "snapshot"), 15, 15, "snapshot",
                     BatchManifest.from_dict({"tables": {"t": {"details": {"key_range": {"column": "id", "start": 1,
                                                                                          "end": 9}}}}}))
    changes = [Batch(batch(s, e), s, e, "changes", BatchManifest.from_dict({"tables": {"t": {}}})) for s, e in ((10, 20), (20, 30), (30, 40))]
    steps, _ = plan_table("t", [changes[0], snapshot, changes[1], changes[2]], TableState("t", 30, set(), batch(20, 30)))
    assert [(step.batch.name, step.cut) for step in steps] == [
        (snapshot.name, False), (changes[0].name, False), (changes[1].name, True), (changes[2].name, True)]
    properties = steps[0].commit_properties("p")
    assert SNAPSHOT_LSN not in properties and properties[SNAPSHOT_FROM_LSN] == hex16(15)
    assert properties[SNAPSHOT_PIPELINE] == "p" and properties[SNAPSHOT_BATCH] == snapshot.name
    assert steps[3].commit_properties("p")[SNAPSHOT_LSN] == hex16(40)
    assert steps[1].commit_properties("p")[SNAPSHOT_FROM_LSN] == hex16(15)  # its rows from the snapshot on
