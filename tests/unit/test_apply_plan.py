"""Pure pieces of the apply job: batch names, positions, which steps a table needs, SQL text."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.layout import batch_name
from airflow_provider_pglogical.spark.jobs.apply_changes import parse_args
from airflow_provider_pglogical.spark.common.identifiers import quote
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.plan import (
    Batch,
    TableState,
    batches_that_matter,
    caught_up,
    plan_table,
    range_predicate,
)
from airflow_provider_pglogical.staging.contract import default_target_name, hex16, parse_batch_name
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest, KeyRange, SnapshotScope

T = "public.orders"


def batch(kind: str, start: int, end: int | None = None, tables=(T,), details=None, table_details=None) -> Batch:
    end = start if end is None else end
    name = batch_name(Lsn(start), Lsn(end), kind)
    manifest = {"details": details or {}, "tables": {t: {"key": ["id"], "details": table_details or {}} for t in tables}}
    return Batch(name, start, end, kind, BatchManifest.from_dict(manifest))


def steps_of(batches, state):
    steps, superseded = plan_table(T, sorted(batches, key=lambda b: b.name), state)
    return [(s.kind, s.batch.start, s.position) for s in steps], superseded


def test_batch_names_parse_like_staging_writes_them():
    name = batch_name(Lsn.parse("1/A0"), Lsn.parse("1/FF"), "changes")
    assert parse_batch_name(name) == (0x1000000A0, 0x1000000FF, "changes")
    assert Batch.parse(name) == Batch(name, 0x1000000A0, 0x1000000FF, "changes")
    assert parse_batch_name("garbage") is None and Batch.parse("_results") is None
    assert parse_batch_name(name.lower()) is None


def test_positions_are_written_as_lsn_hex16():
    assert hex16(0x1000000A0) == Lsn(0x1000000A0).hex16 == "00000001000000A0"


def test_initial_snapshot_then_changes():
    batches = [batch("snapshot", 100), batch("changes", 100, 200), batch("changes", 200, 300)]
    assert steps_of(batches, TableState("t")) == (
        [("snapshot", 100, 100), ("changes", 100, 100), ("changes", 200, 200)], [])


def test_applied_batches_are_skipped_and_a_partial_one_resumes_at_the_position():
    batches = [batch("snapshot", 100), batch("changes", 100, 200), batch("changes", 200, 300)]
    state = TableState("t", position=200, snapshots={batches[0].name})
    assert steps_of(batches, state) == ([("changes", 200, 200)], [])
    assert steps_of(batches, TableState("t", position=300, snapshots={batches[0].name})) == ([], [])


def test_late_full_backfill_replays_the_changes_from_its_position():
    batches = [batch("snapshot", 100), batch("changes", 100, 200), batch("changes", 200, 300),
               batch("snapshot", 150), batch("changes", 300, 400)]
    state = TableState("t", position=300, snapshots={batches[0].name})
    # the backfill at 150 replaces the table; [100, 200) is applied again from 150, then the rest
    assert steps_of(batches, state) == (
        [("snapshot", 150, 150), ("changes", 100, 150), ("changes", 200, 200), ("changes", 300, 300)], [])


def test_latest_pending_full_snapshot_supersedes_earlier_batches():
    first, second = batch("snapshot", 100), batch("snapshot", 250)
    batches = [first, batch("changes", 100, 200), batch("changes", 200, 300), second]
    assert steps_of(batches, TableState("t")) == ([("snapshot", 250, 250), ("changes", 200, 250)], [first.name])


def test_ranged_backfill_does_not_supersede_and_replays_from_its_position():
    ranged = batch("snapshot", 150, details={"key_range": {"column": "id", "start": 1, "end": 9}})
    batches = [batch("snapshot", 100), batch("changes", 100, 200), ranged]
    state = TableState("t", position=200, snapshots={batches[0].name})
    assert steps_of(batches, state) == ([("snapshot", 150, 150), ("changes", 100, 150)], [])


def test_ranged_backfill_of_a_keyless_table_folds_its_window_instead_of_replaying():
    ranged = batch("snapshot", 150, details={"key_range": {"column": "id", "start": 1, "end": 9}})
    changes = [batch("changes", 100, 200), batch("changes", 200, 300), batch("changes", 300, 400)]
    batches = [batch("snapshot", 100), *changes, ranged]
    for b in batches:
        b.manifest.tables[T].replica_identity = "f"
    # the rest of the table is at 300: the range takes [150, 300) from the two batches it overlaps,
    # then everything goes on from 300 for the whole table; nothing is applied twice
    state = TableState("t", position=300, snapshots={batches[0].name})
    steps, _ = plan_table(T, sorted(batches, key=lambda b: b.name), state)
    assert [(s.kind, s.batch.start, s.position, s.through) for s in steps] == [
        ("snapshot", 150, 150, 300), ("changes", 300, 300, None)]
    assert [b.start for b in steps[0].window] == [100, 200]
    # a table behind the backfill: the batches before it first, then the range from 150 to 200
    state = TableState("t", position=100, snapshots={batches[0].name})
    steps, _ = plan_table(T, sorted(batches, key=lambda b: b.name), state)
    assert [(s.kind, s.batch.start, s.position, s.through) for s in steps] == [
        ("changes", 100, 100, None), ("snapshot", 150, 150, 200), ("changes", 200, 200, None),
        ("changes", 300, 300, None)]
    assert [b.start for b in steps[1].window] == [100]


def test_batches_without_the_table_do_not_count():
    batches = [batch("changes", 100, 200, tables=("public.other",)), batch("changes", 200, 300)]
    assert steps_of(batches, TableState("t")) == ([("changes", 200, 0)], [])


def test_a_loaded_table_no_batch_holds_moves_to_the_newest_change_batchs_end():
    # orders changes in every batch; quiet never does after its snapshot; new has no state yet
    batches = [batch("snapshot", 100, tables=(T, "public.quiet")), batch("changes", 100, 200),
               batch("changes", 200, 300), batch("snapshot", 250, tables=("public.new",))]
    states = {T: TableState("o", 300, {batches[0].name}), "public.quiet": TableState("q", 100, {batches[0].name}),
              "public.empty": TableState("e")}
    plans = {source: plan_table(source, batches, states.get(source, TableState("x")))[0]
             for source in (T, "public.quiet", "public.new", "public.empty")}
    assert plans[T] == [] and plans["public.quiet"] == [] and plans["public.empty"] == []
    # not a table with steps (new), nor one never loaded (empty), nor one already there (orders)
    assert caught_up(plans, states, batches) == {"public.quiet": 300}
    # before, the quiet table's position kept every later change batch's manifest wanted; after,
    # only those past the pending snapshot of the new table
    loaded = {source: state for source, state in states.items() if source != "public.empty"}
    assert [b.start for b in batches_that_matter(batches, loaded) if b.kind == "changes"] == [100, 200]
    loaded["public.quiet"].position = 300
    assert [b.start for b in batches_that_matter(batches, loaded) if b.kind == "changes"] == [200]
    assert caught_up({T: []}, states, [batches[0]]) == {}  # no change batch: nothing to move to


def test_range_predicates():
    assert range_predicate(SnapshotScope(KeyRange("id", 3, 5)), "b", T) == "`id` >= 3 AND `id` < 5"
    assert range_predicate(SnapshotScope(KeyRange("k", "a'b", None)), "b", T) == "`k` >= 'a\\'b'"
    assert range_predicate(SnapshotScope(KeyRange("a.b", None, 2.5)), "b", T) == "`a.b` < 2.5"
    assert range_predicate(SnapshotScope(), "b", T) is None
    with pytest.raises(ApplyError, match="batch b, table public.orders: .* needs the range .* as details.key_range"):
        range_predicate(SnapshotScope(extra_where='"id" < 5'), "b", T)
    with pytest.raises(ApplyError, match="key_range start: .* is not a number or a string"):
        range_predicate(SnapshotScope(KeyRange("id", [1], None)), "b", T)


def test_snapshot_details_merge_batch_and_table_ignoring_nulls():
    manifest = BatchManifest.from_dict({"details": {"key_range": None, "backfill": True},
                                        "tables": {T: {"details": {"row_filter": None, "extra_where": "id < 3"}}}})
    assert manifest.scope(T) == {"backfill": True, "extra_where": "id < 3"}
    assert manifest.snapshot_scope(T) == SnapshotScope(None, "id < 3")
    ranged = BatchManifest.from_dict({"details": {"key_range": {"column": "id", "start": 1, "end": None}},
                                      "tables": {T: {"details": {"key_range": None}}}})
    assert ranged.snapshot_scope(T) == SnapshotScope(KeyRange("id", 1, None)) and ranged.snapshot_scope(T).ranged


def test_names_and_quoting():
    assert default_target_name("public.order_items") == "public__order_items"
    # any other name is made readable the same way, with its key's hash: no two sources share one
    assert default_target_name("public.Order Items") == "public__order_items_fcf91ba5"
    assert default_target_name("Sales.orders-2024").startswith("sales__orders_2024_")
    assert quote("we`ird") == "`we``ird`"
    assert quote("a.b") == "`a.b`"


def test_command_line():
    args = parse_args(["--options", ApplyOptions("s3a://b/s", "p", namespace="ns", table_map={"public.t": "t"},
                                                 bucket_count=16).to_json()])
    assert (args.catalog, args.write_mode, args.bucket_count, args.table_map) == ("lake", "merge-on-read", 16,
                                                                                  {"public.t": "t"})
    with pytest.raises(SystemExit):
        parse_args(["--options", ApplyOptions("x", "p", namespace="n", write_mode="eventually").to_json()])


def test_chain_depth_counts_key_changes_that_follow_each_other():
    from airflow_provider_pglogical.spark.apply.reduction import chain_depth

    def move(lsn, seq, old, new):
        return {"__lsn": lsn, "__seq": seq, "old": (old,), "new": (new,)}

    assert chain_depth(None) == chain_depth([]) == 0
    assert chain_depth([move(10, 0, 1, 2), move(10, 1, 5, 6)]) == 1  # two rows moved once each
    # 1 -> 2 -> 3 -> 4, collected out of order: three links
    assert chain_depth([move(30, 0, 3, 4), move(10, 0, 1, 2), move(20, 5, 2, 3)]) == 3
    assert chain_depth([move(10, 0, 2, 3), move(20, 0, 1, 2)]) == 1  # 1 -> 2 after 2 had left: no chain


def test_only_a_table_large_next_to_its_batch_gets_its_scan_pruned():
    from airflow_provider_pglogical.spark.paths.merge import (
        PRUNED_BYTES_PER_BATCH_ROW,
        PRUNED_MERGE_BYTES,
        PRUNED_MERGE_ROWS,
        prunes,
    )

    mb = 1_000_000
    # bench_apply.py's two sizes of narrow rows
    assert not prunes(500_000, 100_000, int(4.9 * mb)) and prunes(5_000_000, 100_000, 44 * mb)
    assert not prunes(1_000, 100, 2 * mb), "a small table: the two extra Spark jobs cost more than its shuffle"
    assert prunes(PRUNED_MERGE_ROWS + 1_000, 100) and not prunes(PRUNED_MERGE_ROWS + 999, 100)
    # few rows holding large values (bench_mixed_tick.py's 20,000 rows of 8 kB): pruned by their bytes
    assert prunes(20_000, 400, 92 * mb)
    least = PRUNED_MERGE_BYTES + PRUNED_BYTES_PER_BATCH_ROW * 400
    assert prunes(20_000, 400, least) and not prunes(20_000, 400, least - 1)


def folding_batch(start: int, end: int, rows: int = 10, columns=("id", "qty"), details=None) -> Batch:
    table = {"key": ["id"], "columns": [{"name": c} for c in columns], "replica_identity": "d", "rows": rows,
             "files": [{"path": f"part-{start}.parquet"}], "details": details or {"truncated": False}}
    return Batch(batch_name(Lsn(start), Lsn(end), "changes"), start, end, "changes",
                 BatchManifest.from_dict({"tables": {T: table}}))


def test_consecutive_change_batches_fold_into_one_step_up_to_the_row_limit_and_not_across_a_schema_change():
    from airflow_provider_pglogical.spark.apply.plan import files_read, fold_changes

    batches = [folding_batch(10, 20), folding_batch(20, 30), folding_batch(30, 40, details={"truncated": True}),
               folding_batch(40, 50, columns=("id", "qty", "note")), folding_batch(50, 60, columns=("id", "qty", "note"))]
    steps, _ = plan_table(T, batches, TableState("orders", 15))
    folded = fold_changes(T, steps, 1000)
    # a schema change (a column added) starts a new fold; the TRUNCATE folds (the reduction keeps the last one)
    assert [[b.start for b in s.folded or [s.batch]] for s in folded] == [[10, 20, 30], [40, 50]]
    first = folded[0]
    assert (first.position, first.end(), first.batch.name) == (15, 40, batches[2].name)
    table = first.batch.manifest.tables[T]
    assert table.rows == 30 and table.truncated is True
    # each file is read from the directory of the batch that staged it; every staged batch is checked
    assert [f.extra["folded_from"] for f in table.files] == [b.name for b in batches[:3]]
    assert sorted(files_read({T: folded})) == sorted(b.name for b in batches)
    assert [len(s.folded or [s.batch]) for s in fold_changes(T, steps, 25)] == [2, 1, 2]  # at most 25 rows a step
    assert fold_changes(T, steps, 0) == steps  # 0: one step per batch


def test_fold_rows_is_checked_and_folds_only_in_a_window_by_default():
    assert ApplyOptions("file:///s", "p").folding() == 0
    assert ApplyOptions("file:///s", "p", keep_running=60).folding() > 0
    assert ApplyOptions("file:///s", "p", keep_running=60, fold_rows=0).folding() == 0
    assert ApplyOptions("file:///s", "p", fold_rows=-1).problems() == [
        "fold_rows must be 0 (one step per batch) or a number of staged rows, not -1"]


def test_a_chunked_load_is_no_cut_until_its_last_chunk_and_the_changes_after_it_are_applied():
    def chunk(start: int, end_key):
        return batch("snapshot", start, details={"key_range": {"column": "id", "start": 1, "end": end_key},
                                                 "chunked_load": {"slot": "s"}})
    empty = batch("snapshot", 100, details={"chunked_load": {"slot": "s", "empty_start": True}})
    batches = [empty, batch("changes", 100, 400), chunk(150, 50), chunk(200, 90), chunk(250, None)]
    steps, _ = plan_table(T, sorted(batches, key=lambda b: b.name), TableState("t"))
    assert [(s.kind, s.batch.start, s.position, s.cut) for s in steps] == [
        ("snapshot", 100, 100, False),  # the empty start
        ("changes", 100, 100, False),
        ("snapshot", 150, 150, False), ("changes", 100, 150, False),
        ("snapshot", 200, 200, False), ("changes", 100, 200, False),
        # the last chunk: the other ranges are at 400 already, so only its replay to 400 is a cut
        ("snapshot", 250, 250, False), ("changes", 100, 250, True),
    ]


@pytest.mark.parametrize("keyless", [False, True])
def test_a_table_a_chunked_load_copied_whole_is_replaced_at_its_snapshot_then_its_changes_from_there(keyless):
    """A keyless table (or a key that cannot bound a range) is one whole snapshot at its temporary
    slot's LSN (capture/chunked/whole.py): it supersedes the load's empty start and the changes
    before it, and is a cut at once, as a backfill is; a multiset takes no window (no range)."""
    def of(b: Batch) -> Batch:
        for table in b.manifest.tables.values():
            table.key, table.keyless, table.replica_identity = ([], True, "f") if keyless else (["id"], False, "d")
        return b
    empty = of(batch("snapshot", 100, details={"chunked_load": {"slot": "s", "empty_start": True}}))
    whole = of(batch("snapshot", 180, details={"chunked_load": {"slot": "s", "table": T, "chunk": 0, "whole": "w"},
                                                "key_range": None}))
    changes = [of(batch("changes", 100, 400)), of(batch("changes", 400, 500))]
    steps, superseded = plan_table(T, sorted([empty, whole, *changes], key=lambda b: b.name), TableState("t"))
    assert [(s.kind, s.batch.start, s.position, s.cut, s.window) for s in steps] == [
        ("snapshot", 180, 180, True, None), ("changes", 100, 180, True, None), ("changes", 400, 400, True, None)]
    assert superseded == [empty.name]
