"""Which batches staging retention removes, and which plans it refuses (pure functions)."""

from __future__ import annotations

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.spark.apply.plan import Batch, Step, TableState, plan_table
from airflow_provider_pglogical.spark.apply.retention import missing_history, removable
from airflow_provider_pglogical.staging.layout import BatchManifest, batch_name

A, B = "public.a", "public.b"
HOUR = 3_600_000


def batch(kind: str, start: int, end: int | None = None, tables=(A,), age_hours: float = 10, details=None) -> Batch:
    end = start if end is None else end
    manifest = {"details": details or {}, "tables": {t: {"key": ["id"], "details": {}} for t in tables}}
    return Batch(batch_name(Lsn(start), Lsn(end), kind), start, end, kind, BatchManifest.from_dict(manifest),
                 committed_ms=100 * HOUR - int(age_hours * HOUR))


def names(batches):
    return [(b.kind, b.start) for b in batches]


def test_only_old_batches_every_table_has_applied_are_removed():
    snap = batch("snapshot", 100, tables=(A, B))
    c1, c2, c3 = batch("changes", 100, 200, tables=(A, B)), batch("changes", 200, 300), batch("changes", 300, 400)
    states = {A: TableState("a", position=400, snapshots={snap.name}), B: TableState("b", position=150,
                                                                                        snapshots={snap.name})}
    # c1 holds B, which is behind it; c3 is the newest change batch (a dead pull looks for it)
    assert names(removable([snap, c1, c2, c3], states, 100 * HOUR, 2 * HOUR)) == [("snapshot", 100), ("changes", 200)]
    # younger than the retention: kept
    young = batch("changes", 200, 300, age_hours=1)
    assert names(removable([snap, c1, young, c3], states, 100 * HOUR, 2 * HOUR)) == [("snapshot", 100)]


def test_unapplied_snapshots_and_unknown_tables_are_kept():
    snap, backfill = batch("snapshot", 100), batch("snapshot", 250)
    c1, c2 = batch("changes", 100, 200), batch("changes", 200, 300)
    states = {A: TableState("a", position=300, snapshots={snap.name})}
    assert names(removable([snap, c1, c2, backfill], states, 100 * HOUR, 0)) == [("snapshot", 100), ("changes", 100)]
    # a table the state table does not know (its Iceberg table was dropped and it is rebuilding)
    assert removable([snap, c1, c2], {}, 100 * HOUR, 0) == []
    # a batch holding no table at all (only changes of tables no longer published) goes
    empty = batch("changes", 50, 100, tables=())
    assert names(removable([empty, c2], {}, 100 * HOUR, 0)) == [("changes", 50)]


def test_plans_needing_removed_changes_are_refused_with_the_backfill():
    record = {"removed_through": {A: 300}}
    state = TableState("a", position=300, snapshots=set())
    later = [batch("changes", 300, 400)]
    steps, _ = plan_table(A, later, state)
    assert missing_history({A: steps}, record) == []
    # the Iceberg table was dropped: its state starts over at 0 with nothing staged before 300
    steps, _ = plan_table(A, later, TableState("a"))
    (problem,) = missing_history({A: steps}, record)
    assert "table public.a" in problem and "PgBackfillOperator(tables=['public.a'])" in problem
    # a full backfill after what was removed rebuilds it
    full = batch("snapshot", 350)
    steps, _ = plan_table(A, sorted([*later, full], key=lambda b: b.name), TableState("a"))
    assert steps[0].kind == "snapshot" and missing_history({A: steps}, record) == []
    # a late backfill older than what was removed would replay removed changes: refused
    old = batch("snapshot", 250)
    steps, _ = plan_table(A, sorted([*later, old], key=lambda b: b.name), TableState("a", position=400))
    assert missing_history({A: steps}, record)
    assert missing_history({B: [Step("changes", later[0], 0)]}, record) == []  # B never had a batch removed
