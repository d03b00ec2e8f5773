"""The pull's facts of a table's staged change rows, and when they spare the apply its read."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from airflow_provider_pglogical.decoding.staged_tables import change_schema
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.change_facts import change_facts

COLUMNS = [{"name": "id", "type": "int4", "key": True}, {"name": "doc", "type": "text"}]


def staged(rows: list[dict]) -> pa.Table:
    """Change rows as the pull stages them (``change_schema``); absent fields are NULL."""
    schema = change_schema(COLUMNS, ["id"])
    return pa.Table.from_pylist([{
        contract.OP: r["op"], contract.COMMIT_LSN: r["lsn"], contract.SEQ: i,
        contract.COMMIT_TS: r.get("ts"), contract.UNCHANGED: r.get("u"), "id": r.get("id"), "doc": r.get("doc"), "_old_id": r.get("old"),
    } for i, r in enumerate(rows)], schema=schema)


def test_facts_count_rows_and_see_kept_values_and_old_keys():
    plain = staged([{"op": "I", "lsn": 300, "id": 1, "doc": "a"}, {"op": "U", "lsn": 200, "id": 1, "doc": "b"},
                    {"op": "D", "lsn": 400, "id": 1}])
    assert change_facts(plain, ["id"]) == {"rows": 3, "first_commit_lsn": 200, "unchanged": False, "old_keys": False,
                                           "first_commit_ts": None, "last_commit_ts": None}

    moved = staged([{"op": "U", "lsn": 100, "id": 2, "doc": "x", "old": 1}])
    assert change_facts(moved, ["id"])["old_keys"] is True
    kept = staged([{"op": "U", "lsn": 100, "id": 2, "u": ["doc"]}, {"op": "I", "lsn": 100, "id": 3, "u": []}])
    assert change_facts(kept, ["id"])["unchanged"] is True
    empty_lists = staged([{"op": "I", "lsn": 100, "id": 3, "u": []}])
    assert change_facts(empty_lists, ["id"])["unchanged"] is False
    assert change_facts(staged([]), ["id"]) == {"rows": 0, "first_commit_lsn": None, "unchanged": False,
                                               "old_keys": False, "first_commit_ts": None, "last_commit_ts": None}


def test_facts_give_the_commit_times_the_ui_measures_freshness_from():
    t0 = dt.datetime(2026, 11, 27, 18, 0, tzinfo=dt.timezone.utc)
    rows = staged([{"op": "I", "lsn": 300, "id": 1, "ts": t0 + dt.timedelta(seconds=5)},
                   {"op": "U", "lsn": 200, "id": 1, "ts": t0}])
    facts = change_facts(rows, ["id"])
    assert (facts["first_commit_ts"], facts["last_commit_ts"]) == (t0.isoformat(), (t0 + dt.timedelta(seconds=5)).isoformat())


def test_facts_decide_only_whole_batches_without_truncate_or_kept_values():
    facts = {"rows": 3, "first_commit_lsn": 200, "unchanged": False, "old_keys": True}
    details = {"truncated": False, contract.CHANGE_FACTS: facts}
    assert contract.facts_decide(details, 200) == facts
    assert contract.facts_decide(details, 201) is None, "rows before the position: the job filters them"
    assert contract.facts_decide({**details, "truncated": True}, 0) is None
    assert contract.facts_decide({contract.CHANGE_FACTS: {**facts, "unchanged": True}}, 0) is None
    assert contract.facts_decide({"truncated": False}, 0) is None, "a batch staged before the facts were written"
    assert contract.facts_decide({contract.CHANGE_FACTS: {**facts, "rows": 0, "first_commit_lsn": None}}, 10)["rows"] == 0
