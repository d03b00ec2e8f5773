"""Invariant 12, the pure part: the chain of change batches each records where the one before it
ended, and the apply finds every hole between a table's position and the end of staging."""

from __future__ import annotations

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.spark.apply.plan import Batch, chain_holes, chain_intervals, merged, uncovered
from airflow_provider_pglogical.staging.contract import PREVIOUS_END, format_lsn, parse_lsn
from airflow_provider_pglogical.staging.layout import BatchManifest, batch_name

T, U = "public.t", "public.u"


def changes(start: int, end: int, previous: int | None, tables=(T,)) -> Batch:
    manifest = {"tables": {t: {} for t in tables}}
    if previous is not None:
        manifest[PREVIOUS_END] = str(Lsn(previous))
    return Batch(batch_name(Lsn(start), Lsn(end), "changes"), start, end, "changes", BatchManifest.from_dict(manifest))


def snapshot(at: int) -> Batch:
    return Batch(batch_name(Lsn(at), Lsn(at), "snapshot"), at, at, "snapshot", {"tables": {T: {}, U: {}}})


def test_lsn_text_round_trips():
    assert parse_lsn("16/B374D848") == 0x16B374D848 and format_lsn(0x16B374D848) == "16/B374D848"
    assert parse_lsn(str(Lsn(0x100))) == 0x100


def test_empty_windows_between_batches_are_no_hole():
    # the slot advanced over [0x300, 0x380) and [0x500, 0x520) without a batch: nothing was there
    batches = [snapshot(0x100), changes(0x100, 0x300, 0x100), changes(0x380, 0x500, 0x300),
               changes(0x520, 0x600, 0x500)]
    assert [(low, high) for _b, low, high in chain_intervals(batches)] == [(0x100, 0x300), (0x300, 0x500),
                                                                         (0x500, 0x600)]
    assert chain_holes("p", batches, {T: 0x100, U: 0x100}, [], 0x600, []) == []


def test_a_missing_middle_batch_is_a_hole_naming_its_neighbours_its_range_and_the_backfill():
    first, gone, last = changes(0x100, 0x300, 0x100), changes(0x380, 0x500, 0x300, (T, U)), changes(0x520, 0x600, 0x500)
    (problem,) = chain_holes("p", [snapshot(0x100), first, last], {T: 0x100, U: 0x300}, [], None, [gone])
    assert "no committed change batch covers LSN 0/300 to 0/500" in problem
    assert f"after batch {first.name}, before batch {last.name}" in problem
    assert f"batch directory {gone.name} has no _manifest.json" in problem
    assert "PgBackfillOperator(tables=['public.t', 'public.u'])" in problem
    # a table already past the hole is not affected; one whose position is past it is not named
    (problem,) = chain_holes("p", [first, last], {T: 0x100, U: 0x500}, [], None, [])
    assert "PgBackfillOperator(tables=['public.t'])" in problem
    assert chain_holes("p", [first, last], {T: 0x500, U: 0x600}, [], None, []) == []


def test_a_deleted_newest_batch_is_found_from_the_pulls_record():
    first = changes(0x100, 0x300, 0x100)
    (problem,) = chain_holes("p", [first], {T: 0x100}, [], 0x500, [])
    assert "covers LSN 0/300 to 0/500" in problem and "the last pull recorded change batches up to LSN 0/500" in problem
    # a pull writing its batch right now (no manifest yet, past every committed one) is normal
    assert chain_holes("p", [first], {T: 0x100}, [], 0x300, [changes(0x300, 0x400, None)]) == []


def test_what_retention_removed_still_counts_as_the_chain():
    kept = changes(0x520, 0x600, 0x500)
    assert chain_holes("p", [kept], {T: 0x100}, [[0x100, 0x500]], 0x600, []) == []
    assert chain_holes("p", [kept], {T: 0x100}, [[0x100, 0x300], [0x300, 0x500]], 0x600, []) == []
    (problem,) = chain_holes("p", [kept], {T: 0x100}, [[0x100, 0x300]], 0x600, [])
    assert "covers LSN 0/300 to 0/500" in problem


def test_batches_staged_before_the_chain_was_recorded_are_taken_on_trust():
    old = [changes(0x100, 0x300, None), changes(0x380, 0x500, None)]
    assert chain_holes("p", old, {T: 0}, [], None, []) == []
    # the first batch that records its predecessor starts the proof
    assert chain_holes("p", [*old, changes(0x520, 0x600, 0x500)], {T: 0}, [], None, []) == []
    assert chain_holes("p", [*old, changes(0x700, 0x800, 0x600)], {T: 0}, [], None, []) != []


def test_ranges_merge_and_holes_are_what_no_range_covers():
    assert merged([(5, 7), (1, 3), (3, 4), (6, 9)]) == [[1, 4], [5, 9]]
    assert uncovered([(1, 3), (5, 9)], 0, 12) == [(0, 1), (3, 5), (9, 12)]
    assert uncovered([(1, 3)], 1, 3) == [] and uncovered([], 4, 4) == []
