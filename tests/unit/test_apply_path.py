"""Which path a step takes to its Iceberg table: the pure choice of ``spark/paths/choice.py``,
every branch, with the reason the job logs."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.spark.apply.plan import Batch, Step
from airflow_provider_pglogical.spark.paths.choice import ApplyPath, TableFacts, choose_path
from airflow_provider_pglogical.spark.row_delta.row_deltas import ROW_DELTA_MAX_ROWS
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest

SOURCE = "public.orders"
KEYED = [{"name": "id", "type": "int4", "key": True}, {"name": "v", "type": "text"}]
KEYED_TYPES = {"id": "int", "v": "string"}
KEYLESS = [{"name": "n", "type": "int4"}, {"name": "v", "type": "text"}]
KEYLESS_TYPES = {"n": "int", "v": "string", **contract.MULTISET_COLUMNS}
SNAPSHOT = "0000000000000100-0000000000000100-snapshot"
CHANGES = "0000000000000100-0000000000000200-changes"


def step(kind: str = "changes", keyless: bool = False, files: bool = True, position: int = 100,
         batch_details: dict | None = None, **details) -> Step:
    """A step of ``SOURCE`` whose manifest says what the pull saw (``details``: over the facts)."""
    facts = {"rows": 10, "first_commit_lsn": 150, "unchanged": False, "old_keys": False}
    table = {"columns": KEYLESS if keyless else KEYED, "key": ["n", "v"] if keyless else ["id"],
             "files": [{"path": "part-0.parquet", "rows": 10}] if files else [], "rows": 10,
             "details": {contract.CHANGE_FACTS: facts} if kind == "changes" else {}}
    for name, value in details.items():
        (facts if name in facts else table["details"])[name] = value
    batch = Batch.parse(SNAPSHOT if kind == "snapshot" else CHANGES)
    batch.manifest = BatchManifest.from_dict({"tables": {SOURCE: table}, "details": batch_details or {}})
    return Step(kind, batch, position)


def facts(keyless: bool = False, **overrides) -> TableFacts:
    return TableFacts(SOURCE, dict(KEYLESS_TYPES if keyless else KEYED_TYPES), **overrides)


def chosen(a_step: Step, table: TableFacts) -> tuple[ApplyPath, str]:
    choice = choose_path(a_step, table)
    return choice.path, choice.reason


RANGE = {"key_range": {"column": "id", "start": 1, "end": 5}}


@pytest.mark.parametrize("a_step, table, path, reason", [
    (step("snapshot"), facts(), ApplyPath.ADOPT, "its files are adopted as they are"),
    (step("snapshot"), facts(partitioned=True), ApplyPath.REWRITE, "the table is partitioned"),
    (step("snapshot"), TableFacts(SOURCE, {**KEYED_TYPES, "gone": "int"}), ApplyPath.REWRITE,
     "columns the batch does not stage (gone)"),
    (step("snapshot", keyless=True), facts(keyless=True), ApplyPath.REWRITE, "numbers its identical rows"),
    (step("snapshot", batch_details=RANGE), facts(), ApplyPath.MERGE, "a ranged backfill replaces only its key range"),
    (step("snapshot", keyless=True, batch_details={"key_range": {"column": "n", "start": 1, "end": 5}}),
     facts(keyless=True), ApplyPath.MERGE, "a ranged backfill of a keyless table"),
], ids=["adopt", "partitioned", "unstaged-column", "keyless", "ranged", "keyless-ranged"])
def test_a_snapshot_is_adopted_where_its_files_are_the_tables_else_rewritten_or_merged(a_step, table, path, reason):
    taken, why = chosen(a_step, table)
    assert taken is path and reason in why


@pytest.mark.parametrize("keyless", [False, True], ids=["keyed", "keyless"])
def test_a_small_batch_of_whole_rows_is_a_row_delta(keyless):
    taken, why = chosen(step(keyless=keyless), facts(keyless=keyless))
    assert taken is ApplyPath.ROW_DELTA and "position deletes" in why
    taken, why = chosen(step(keyless=keyless), facts(keyless=keyless, format_version=3))
    assert taken is ApplyPath.ROW_DELTA and "deletion vectors (an updated row keeps its _row_id)" in why


@pytest.mark.parametrize("a_step, table, reason", [
    (step(), facts(row_deltas=False), "row deltas are switched off"),
    (step(rows=ROW_DELTA_MAX_ROWS + 1), facts(), f"more than {ROW_DELTA_MAX_ROWS}"),
    (step(position=151), facts(), "starts before the table's position"),
    (step(change_facts=None), facts(), "no change facts"),
    (step(), facts(partitioned=True), "the table is partitioned"),
    (step(), facts(format_version=1), "format version 1"),
    (step(), facts(merge_on_read=False), "copy-on-write"),
    (step(keyless=True), facts(keyless=True, numbered=False), "copies are not numbered yet"),
    (step(keyless=True, unchanged=True), facts(keyless=True), "TOAST"),
    (step(), TableFacts(SOURCE, {"id": "bigint", "v": "string"}), "differ"),
], ids=["switched-off", "too-many-rows", "before-position", "no-facts", "partitioned", "v1", "copy-on-write",
        "unnumbered", "keyless-toast", "widened"])
def test_anything_else_is_merged_and_the_reason_says_why(a_step, table, reason):
    taken, why = chosen(a_step, table)
    assert taken is ApplyPath.MERGE and why.startswith(("not a row delta: ", "row deltas")) and reason in why


def test_a_truncate_rewrites_and_an_empty_batch_does_nothing():
    assert chosen(step(truncated=True), facts()) == (
        ApplyPath.REWRITE, "the batch holds a TRUNCATE: the table is replaced by the rows after it")
    assert chosen(step(files=False), facts())[1] == "the batch stages no row of the table: nothing to do"
