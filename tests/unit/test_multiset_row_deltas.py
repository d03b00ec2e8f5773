"""A keyless table's small batch as the driver applies it: net copies per row value, the copies
written and deleted, and which batches it takes (``spark/row_delta/multiset_row_deltas.py``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest

from airflow_provider_pglogical.decoding.staged_tables import change_schema
from airflow_provider_pglogical.spark.row_delta.multiset_row_deltas import (
    copy_changes,
    multiset_ineligible,
    net_copies,
    python_column,
)
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest, TableManifest

COLUMNS = [{"name": "n", "type": "int4", "key": True}, {"name": "s", "type": "text", "key": True}]
TYPES = {"n": "int", "s": "string", contract.OCCURRENCE: "int", contract.WRITTEN_BY: "string"}


def staged(rows: list[dict]) -> pa.Table:
    """Change rows of a REPLICA IDENTITY FULL table as the pull stages them."""
    return pa.Table.from_pylist([{
        contract.OP: r["op"], contract.COMMIT_LSN: 100 + i, contract.SEQ: i, "n": r.get("n"), "s": r.get("s"),
        "_old_n": r.get("old", (None, None))[0], "_old_s": r.get("old", (None, None))[1],
    } for i, r in enumerate(rows)], schema=change_schema(COLUMNS, ["n", "s"]))


def test_net_copies_count_inserts_deletes_and_both_rows_of_an_update_with_nulls_equal():
    rows = [{"op": "I", "n": 1, "s": "x"}, {"op": "I", "n": 1, "s": "x"}, {"op": "D", "n": 1, "s": "x"},
            {"op": "I", "n": None, "s": None}, {"op": "U", "n": 2, "s": None, "old": (None, None)},
            {"op": "U", "n": 3, "s": "y", "old": (3, "y")},  # an update to the same value: no net change
            {"op": "D", "n": 4, "s": "z"}]
    assert net_copies(staged(rows), ["n", "s"]) == {(1, "x"): 1, (2, None): 1, (4, "z"): -1}


def test_a_truncate_is_refused_not_counted():
    with pytest.raises(ValueError, match="'T'"):
        net_copies(staged([{"op": "T"}]), ["n", "s"])


def test_copies_are_added_above_the_count_and_deleted_from_the_top_with_the_highest_kept_marked():
    net = {("a",): 2, ("b",): -2, ("c",): -5, ("d",): 1}
    lake = {("a",): (1, False), ("b",): (3, False), ("c",): (2, False)}  # ("d",): none yet
    changes = copy_changes(net, lake)
    assert sorted(changes.written) == [(("a",), 2), (("a",), 3), (("b",), 1), (("d",), 1)]
    # b: 3 -> 1 copies (2 and 3 go, copy 1 is written again with the batch's name); c: all go
    assert sorted(changes.deleted) == [(("b",), 1), (("b",), 2), (("b",), 3), (("c",), 1), (("c",), 2)]


def test_a_value_the_batch_wrote_already_is_left_as_it_is():
    """A step applied again after its data commit: every value it left copies of carries its name."""
    net = {("a",): 2, ("b",): -1, ("c",): -3}
    lake = {("a",): (3, True), ("b",): (2, True), ("c",): (0, False)}  # c: removed entirely, no copy left
    changes = copy_changes(net, lake)
    assert changes.written == [] and changes.deleted == []


def test_timestamps_compare_as_microseconds():
    table = pa.table({"t": pa.array([datetime(1850, 1, 1, tzinfo=timezone.utc), None], pa.timestamp("us", "UTC"))})
    assert python_column(table, "t") == [-3786825600000000, None]
    assert python_column(table, "absent") == [None, None]


def manifest(columns: list | None = None, key: list | None = None, **facts) -> TableManifest:
    facts = {"rows": 10, "first_commit_lsn": 500, "unchanged": False, "old_keys": True, **facts}
    return TableManifest(columns=columns or COLUMNS, key=["n", "s"] if key is None else key, details={contract.CHANGE_FACTS: facts})


def test_only_batches_the_driver_can_net_exactly_are_eligible():
    assert multiset_ineligible(manifest(), TYPES, 500) is None
    assert "TOAST" in multiset_ineligible(manifest(unchanged=True), TYPES, 500)
    assert "before the table's position" in multiset_ineligible(manifest(), TYPES, 501)
    floats = manifest([{"name": "n", "type": "float8", "key": True}], ["n"])
    assert "float" in multiset_ineligible(floats, {"n": "double", **contract.MULTISET_COLUMNS}, 500)
    arrays = manifest([{"name": "n", "type": "_int4", "element_type": "int4", "key": True}], ["n"])
    assert "array" in multiset_ineligible(arrays, {"n": "array<int>", **contract.MULTISET_COLUMNS}, 500)
    assert "differ" in multiset_ineligible(manifest(), {**TYPES, "dropped": "string"}, 500)
    # deletes are by position: a binary column compares exactly in Python (no equality delete to lose)
    binary = manifest([{"name": "n", "type": "bytea", "key": True}], ["n"])
    assert multiset_ineligible(binary, {"n": "binary", **contract.MULTISET_COLUMNS}, 500) is None
