"""One semantics, two implementations: the Spark reduction (``spark/apply/reduction.py``) and the
driver's pyarrow one (``spark/row_delta/row_deltas.py``) leave every key of the same staged rows in
the same state (issue 50); for keyless tables, Spark's net copies (``spark/apply/multisets.py``) and
the driver's (``spark/row_delta/multiset_row_deltas.py``) give every row value the same change.

Hypothesis draws change batches of a keyed table: inserts, updates, deletes, key-changing updates
(chains of them), updates that leave a value unchanged (TOAST), ties on the commit LSN ordered by
``seq``, rows staged out of order. Both reductions read the same rows (pyarrow in memory, Spark
from the Parquet file the pull would stage) and must agree, key by key, on: deleted or present;
the value it ends with, or the key whose lakehouse row keeps it. One in-process Spark session.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.staged_tables import change_schema
from airflow_provider_pglogical.spark.apply.multisets import multiset_deltas
from airflow_provider_pglogical.spark.apply.reduction import read_rows, reduce_changes
from airflow_provider_pglogical.spark.row_delta.multiset_row_deltas import net_copies
from airflow_provider_pglogical.spark.row_delta.row_deltas import last_change_per_key
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.column_types import staged_columns
from tests.support.spark_jobs import reading_session

pytestmark = pytest.mark.spark

COLUMNS = [{"name": "id", "type": "int4", "type_oid": 23, "key": True},
           {"name": "v", "type": "text", "type_oid": 25}]
MANIFEST = {"columns": COLUMNS, "key": ["id"]}
TYPES = {"id": "int", "v": "string"}
KEYS = st.integers(1, 4)


@st.composite
def change(draw, index: int) -> dict:
    op = draw(st.sampled_from("IUUD"))
    row = {"op": op, "lsn": draw(st.integers(1, 6)), "id": draw(KEYS), "v": f"v{index}"}
    if op == "U":
        if draw(st.booleans()):
            row["old"] = draw(KEYS)  # equal to id: not a key change
        if draw(st.integers(0, 2)) == 0:
            row["u"], row["v"] = ["v"], None  # v left unchanged: TOAST not sent
    if op == "D":
        row["v"] = None
    return row


@st.composite
def batches(draw) -> list[dict]:
    count = draw(st.integers(1, 10))
    rows = [draw(change(index)) for index in range(count)]
    assume(possible(rows))
    return rows


def possible(rows: list[dict]) -> bool:
    """PostgreSQL can produce the batch: in commit order, no row is updated (or moved away) after its
    DELETE until an INSERT or a move brings the key back. (On such impossible histories the two
    reductions differ: Spark keeps the value sent before the DELETE, pyarrow the lakehouse's.)"""
    gone = set()
    for row in sorted(rows, key=lambda r: r["lsn"]):  # stable: seq breaks ties
        source = row.get("old", row["id"])
        if row["op"] == "U" and source in gone:
            return False
        if row["op"] == "D":
            gone.add(row["id"])
        else:
            gone.discard(row["id"])
            if row["op"] == "U" and source != row["id"]:
                gone.add(source)
    return True


def staged(rows: list[dict]) -> pa.Table:
    """The rows as the pull stages them (``seq`` follows the order given, LSNs may go back)."""
    return pa.Table.from_pylist([{
        contract.OP: r["op"], contract.COMMIT_LSN: r["lsn"], contract.SEQ: i, "id": r["id"], "v": r.get("v"),
        "_old_id": r.get("old"), contract.UNCHANGED: r.get("u"),
    } for i, r in enumerate(rows)], schema=change_schema(COLUMNS, ["id"]))


def by_pyarrow(table: pa.Table) -> dict:
    """key -> None (deleted) or ("row", value) / ("lake", origin key)."""
    reduction = last_change_per_key(table, ["id"], ["v"])
    values = table["v"].to_pylist()
    state: dict = {key: None for (key,) in reduction.touched}
    for index, ((key,), last) in enumerate(zip(reduction.present, reduction.last_rows)):
        source = reduction.sources["v"][index] if "v" in reduction.sources else last
        state[key] = ("row", values[source]) if source is not None else ("lake", reduction.origins[index][0])
    return state


def by_spark(spark, path: str) -> dict:
    rows = read_rows(spark, [path], staged_columns(MANIFEST, changes=True), TYPES, ["id"], changes=True)
    reduced = reduce_changes(spark, rows, ["id"], ["v"], 0)
    state = {}
    for row in reduced.frame.collect():
        if row["__op"] == "D":
            state[row["id"]] = None
        else:
            state[row["id"]] = ("lake", row["__ok0"]) if row["__keep0"] else ("row", row["v"])
    return state


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = reading_session(tmp_path_factory.mktemp("reduction") / "warehouse", "test-reduction-property")
    yield session
    session.stop()


def test_the_spark_and_the_pyarrow_reductions_agree_on_every_key(spark, tmp_path_factory):
    """Each example is many batches at once, their keys kept apart (batch i uses keys 10i+1..10i+4):
    the per-key semantics are independent, so pyarrow reduces each batch alone and Spark their union
    in one pass, and a few Spark reductions check hundreds of drawn batches."""
    directory = tmp_path_factory.mktemp("batches")
    seen = []

    @settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much,
                                                                HealthCheck.too_slow])
    @given(st.lists(batches(), min_size=1, max_size=25))
    def agree(drawn):
        expected, union = {}, []
        for number, rows in enumerate(drawn):
            moved = [{**row, "id": row["id"] + 10 * number,
                      **({"old": row["old"] + 10 * number} if "old" in row else {})} for row in rows]
            expected.update(by_pyarrow(staged(moved)))
            union += moved
        path = directory / f"part-{len(seen)}.parquet"
        pq.write_table(staged(union), path)
        assert by_spark(spark, path.as_uri()) == expected, drawn
        seen.append(expected)

    agree()
    # the draws reached what makes the reductions differ if anything does: deletes, kept values
    outcomes = [value for state in seen for value in state.values()]
    assert None in outcomes and any(v and v[0] == "lake" for v in outcomes) and any(v and v[0] == "row" for v in outcomes)


# --- the keyless half: a multiset's net copies ------------------------------------------------------

KEYLESS = [{"name": "n", "type": "int4", "type_oid": 23}, {"name": "v", "type": "text", "type_oid": 25}]
KEYLESS_MANIFEST = {"columns": KEYLESS, "key": ["n", "v"], "replica_identity": "f"}
KEYLESS_TYPES = {"n": "int", "v": "string"}
#: few values, NULL among them, so that copies of one row value meet, cancel and go negative
VALUE = st.tuples(st.integers(1, 3), st.sampled_from(["a", "b", None]))


@st.composite
def keyless_change(draw) -> dict:
    """An INSERT or DELETE of a row value, or an UPDATE from one to another (REPLICA IDENTITY FULL:
    the old row whole); LSNs drawn, so rows come staged out of commit order."""
    op = draw(st.sampled_from("IUD"))
    row = {"op": op, "lsn": draw(st.integers(1, 6)), "new": draw(VALUE)}
    if op == "U":
        row["old"] = draw(VALUE)
    return row


def staged_keyless(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist([{
        contract.OP: r["op"], contract.COMMIT_LSN: r["lsn"], contract.SEQ: i, "n": r["new"][0], "v": r["new"][1],
        "_old_n": r["old"][0] if "old" in r else None, "_old_v": r["old"][1] if "old" in r else None,
    } for i, r in enumerate(rows)], schema=change_schema(KEYLESS, ["n", "v"]))


def keyless_by_spark(spark, path: str, count: int) -> dict:
    rows = read_rows(spark, [path], staged_columns(KEYLESS_MANIFEST, changes=True), KEYLESS_TYPES, ["n", "v"],
                     changes=True)
    deltas, truncated, counted = multiset_deltas(rows, KEYLESS_TYPES, ["n", "v"], 0, known_rows=count)
    assert not truncated and counted == count
    return {(row["n"], row["v"]): row["__d"] for row in deltas.collect() if row["__d"]}


def test_the_spark_and_the_pyarrow_multiset_reductions_agree_on_every_row_value(spark, tmp_path_factory):
    """Keyless tables: Spark's ``multiset_deltas`` (the MERGE path) and the driver's ``net_copies``
    (the row-delta path) give every row value the same net change of its number of copies, over the
    same staged rows. Batches are kept apart by their ``n`` (batch i uses 10i+1..10i+3), so one
    Spark reduction checks many drawn batches."""
    directory = tmp_path_factory.mktemp("keyless")
    seen = []

    @settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
    @given(st.lists(st.lists(keyless_change(), min_size=1, max_size=10), min_size=1, max_size=25))
    def agree(drawn):
        expected, union = {}, []
        for number, rows in enumerate(drawn):
            moved = [{**row, "new": (row["new"][0] + 10 * number, row["new"][1]),
                      **({"old": (row["old"][0] + 10 * number, row["old"][1])} if "old" in row else {})}
                     for row in rows]
            expected.update(net_copies(staged_keyless(moved), ["n", "v"]))
            union += moved
        path = directory / f"part-{len(seen)}.parquet"
        pq.write_table(staged_keyless(union), path)
        assert keyless_by_spark(spark, path.as_uri(), len(union)) == expected, drawn
        seen.append(expected)

    agree()
    # the draws reached copies added, copies removed, and a NULL value among them
    changes = [(value, change) for state in seen for value, change in state.items()]
    assert any(change > 0 for _, change in changes) and any(change < 0 for _, change in changes)
    assert any(value[1] is None for value, _ in changes)
