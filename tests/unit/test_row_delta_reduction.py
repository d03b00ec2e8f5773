"""The driver's reduction of a small change batch (last change per key) and which batches it takes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.staged_tables import change_schema
from airflow_provider_pglogical.spark.row_delta.row_deltas import ROW_DELTA_MAX_ROWS, ineligible, last_change_per_key
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest, TableManifest

COLUMNS = [{"name": "id", "type": "int4", "key": True}, {"name": "v", "type": "text"}]
TYPES = {"id": "int", "v": "string"}


def staged(rows: list[dict]) -> pa.Table:
    """Change rows as the pull stages them, in the order given (``seq`` follows it)."""
    return pa.Table.from_pylist([{
        contract.OP: r["op"], contract.COMMIT_LSN: r["lsn"], contract.SEQ: i, "id": r["id"], "v": r.get("v"),
        "_old_id": r.get("old"), contract.UNCHANGED: r.get("u"),
    } for i, r in enumerate(rows)], schema=change_schema(COLUMNS, ["id"]))


def reduced(rows: list[dict]) -> tuple[dict, set]:
    """(key -> the value its last row leaves, every key touched)."""
    table = staged(rows)
    reduction = last_change_per_key(table, ["id"], ["v"])
    assert not reduction.sources  # no value left unchanged: every present key takes its last row
    values = table["v"].to_pylist()
    return ({key: values[row] for (key,), row in zip(reduction.present, reduction.last_rows)},
            {key for (key,) in reduction.touched})


def kept(rows: list[dict]) -> dict:
    """key -> (the value it ends with: from a row of the batch, or ``lake@<origin>``)."""
    table = staged(rows)
    reduction = last_change_per_key(table, ["id"], ["v"])
    values = table["v"].to_pylist()
    return {key: values[source] if source is not None else f"lake@{origin[0]}"
            for (key,), source, origin in zip(reduction.present, reduction.sources["v"], reduction.origins)}


def test_the_last_change_per_key_wins_by_commit_lsn_then_seq():
    # staged out of LSN order on purpose: the reduction sorts
    rows = [{"op": "U", "lsn": 300, "id": 1, "v": "late"}, {"op": "I", "lsn": 100, "id": 1, "v": "first"},
            {"op": "I", "lsn": 100, "id": 2, "v": "b"}, {"op": "D", "lsn": 200, "id": 2}]
    assert reduced(rows) == ({1: "late"}, {1, 2})


def test_a_key_change_deletes_the_old_key_and_chains_follow():
    rows = [{"op": "U", "lsn": 100, "id": 11, "v": "a", "old": 1},
            {"op": "U", "lsn": 200, "id": 21, "v": "a", "old": 11},
            {"op": "I", "lsn": 300, "id": 1, "v": "back"}]
    assert reduced(rows) == ({21: "a", 1: "back"}, {1, 11, 21})


def test_an_update_with_its_old_key_equal_is_not_a_key_change():
    rows = [{"op": "U", "lsn": 100, "id": 5, "v": "x", "old": 5}]
    assert reduced(rows) == ({5: "x"}, {5})


def test_a_key_deleted_after_a_key_change_to_it_is_gone():
    rows = [{"op": "U", "lsn": 100, "id": 2, "v": "moved", "old": 1}, {"op": "D", "lsn": 200, "id": 2}]
    assert reduced(rows) == ({}, {1, 2})


def test_an_unchanged_value_comes_from_the_rows_history_else_from_the_lakehouse_row_it_began_at():
    rows = [{"op": "U", "lsn": 100, "id": 1, "u": ["v"]},                 # kept: the lakehouse row of 1
            {"op": "U", "lsn": 100, "id": 2, "v": "sent"},
            {"op": "U", "lsn": 200, "id": 2, "u": ["v"]},                 # kept: the batch sent it before
            {"op": "U", "lsn": 300, "id": 13, "u": ["v"], "old": 3},      # moved: the lakehouse row of 3
            {"op": "U", "lsn": 400, "id": 23, "u": ["v"], "old": 13},     # moved again: still of 3
            {"op": "U", "lsn": 500, "id": 14, "u": ["v"], "old": 2},      # moved after the batch sent it
            {"op": "I", "lsn": 600, "id": 5, "u": ["v"]}]                 # an INSERT begins a history
    assert kept(rows) == {1: "lake@1", 23: "lake@3", 14: "sent", 5: "lake@5"}


def test_a_key_deleted_and_inserted_again_does_not_take_its_old_value():
    rows = [{"op": "U", "lsn": 100, "id": 1, "v": "old"}, {"op": "D", "lsn": 200, "id": 1},
            {"op": "I", "lsn": 300, "id": 1, "v": "new"}, {"op": "U", "lsn": 400, "id": 1, "u": ["v"]}]
    assert kept(rows) == {1: "new"}


def test_a_truncate_is_refused_not_reduced():
    with pytest.raises(ValueError, match="'T'"):
        reduced([{"op": "T", "lsn": 100, "id": 0}])


def manifest(columns: list | None = None, key: list | None = None, **details) -> TableManifest:
    facts = {"rows": 10, "first_commit_lsn": 500, "unchanged": False, "old_keys": True, **details}
    return TableManifest(columns=columns or COLUMNS, key=["id"] if key is None else key, details={contract.CHANGE_FACTS: facts})


def test_only_batches_that_set_whole_rows_of_matching_columns_are_eligible():
    assert ineligible(manifest(), TYPES, 500) is None
    assert ineligible(manifest(unchanged=True), TYPES, 500) is None  # looked up by key
    composite = manifest(key=["id", "v"], unchanged=True)
    assert ineligible(composite, TYPES, 500) is None  # looked up by every key column
    stamped = manifest([*COLUMNS, {"name": "at", "type": "timestamptz"}], ["id", "at"], unchanged=True)
    assert "key column at is timestamp" in ineligible(stamped, {**TYPES, "at": "timestamp"}, 500)
    assert ineligible(manifest(key=["id", "v"]), TYPES, 500) is None
    truncated = manifest()
    truncated.details["truncated"] = True
    assert "TRUNCATE" in ineligible(truncated, TYPES, 500)
    assert "before the table's position" in ineligible(manifest(), TYPES, 501)
    assert "more than" in ineligible(manifest(rows=ROW_DELTA_MAX_ROWS + 1), TYPES, 500)
    # a column dropped at the source keeps its lakehouse value in updated rows: a MERGE does that
    assert "differ" in ineligible(manifest(), {**TYPES, "dropped": "string"}, 500)
    assert "differ" in ineligible(manifest(), {"id": "bigint", "v": "string"}, 500)  # widened: a cast
    floats = manifest([{"name": "id", "type": "float8"}])
    assert "key column id is double" in ineligible(floats, {"id": "double"}, 500)
    binary = manifest([{"name": "id", "type": "bytea"}])
    assert "key column id is binary" in ineligible(binary, {"id": "binary"}, 500)  # found by key: not exact
    assert ineligible(manifest([{"name": "id", "type": "bytea"}], []), {"id": "binary"}, 500) is None  # a binary value column is fine
    no_facts = TableManifest(columns=COLUMNS, key=["id"])
    assert ineligible(no_facts, TYPES, 0) is not None
