"""What a pull does about each change to what the source publishes (``capture/published_changes.py``)."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.capture.published_changes import (
    SourceChangePolicy, publish_problems, recorded_fields, resnapshot_reasons, via_root_flips,
)
from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.management.published import ColumnInfo, ResolvedTable


def column(name: str, attnum: int) -> ColumnInfo:
    return ColumnInfo(name, attnum, 23, -1, "int4", "integer", None, attnum == 1, attnum == 1)


def table(*, columns=("id", "a"), listed=False, where=None, publish=("insert", "update", "delete", "truncate"),
          storage=((100, 100),), oid=100, relkind="r", rows=(("p", "7", []),)) -> ResolvedTable:
    return ResolvedTable(oid=oid, schema="public", name=f"t{oid}", relkind=relkind, replica_identity="d",
                         columns=[column(n, i + 1) for i, n in enumerate(columns)], has_column_list=listed,
                         row_filter=where, publications=["p"], publish=set(publish),
                         storage=[list(s) for s in storage], publication_rows=[list(r) for r in rows])


def entry(t: ResolvedTable) -> dict:
    return {"columns": [[c.attnum, c.name, c.type_oid, c.typmod] for c in t.columns], **recorded_fields(t)}


def test_nothing_changed_needs_nothing():
    assert resnapshot_reasons(entry(table()), table()) == []


@pytest.mark.parametrize("now, expected", [
    (table(where="(id > 5)", rows=(("p", "7", ["1:9"]),)), "row filter changed from none to WHERE (id > 5)"),
    (table(storage=((100, 200),)), "its storage was rewritten"),
    (table(columns=("id", "a", "secret"), listed=True), "column list now also publishes secret"),
    (table(rows=(("p", "8", []),)), "its publications were altered since the last pull"),
])
def test_each_change_says_why_the_table_is_snapshotted_again(now, expected):
    before = entry(table(listed=True)) if "secret" in expected else entry(table())
    reasons = resnapshot_reasons(before, now)
    assert len(reasons) == 1 and expected in reasons[0], reasons


def test_a_narrowed_list_is_followed_and_a_truncate_explains_a_new_relfilenode():
    assert resnapshot_reasons(entry(table(columns=("id", "a", "b"), listed=True)), table(listed=True)) == []
    assert resnapshot_reasons(entry(table()), table(storage=((100, 200),)), truncated=True) == []
    # a new leaf is no truncate's doing
    assert resnapshot_reasons(entry(table()), table(storage=((100, 200), (101, 101))), truncated=True)


def test_a_publish_set_that_gains_an_action_snapshots_again_and_one_that_lacks_updates_is_refused():
    before = entry(table(publish=("insert",)))
    (reason,) = resnapshot_reasons(before, table())
    assert "now publish delete, truncate, update too (publish was insert" in reason
    (problem,) = publish_problems([table(publish=("insert",))], append_only=False)
    assert "published by p without update, delete (publish = 'insert')" in problem and "append_only=True" in problem
    assert publish_problems([table(publish=("insert",))], append_only=True) == []
    assert publish_problems([table(publish=("update", "delete"))], append_only=True)


def test_a_via_root_flip_names_the_orphans_both_ways():
    leaves = {"1": {"storage": [[1, 1]]}, "2": {"storage": [[2, 2]]}}
    root = table(oid=9, relkind="p", storage=((1, 1), (2, 2)))
    assert via_root_flips(leaves, {9: root}) == {9: [1, 2]}
    known_root = {"9": {"storage": [[1, 1], [2, 2]]}}
    assert via_root_flips(known_root, {1: table(oid=1), 2: table(oid=2)}) == {1: [9], 2: [9]}
    assert via_root_flips({**leaves, "9": {"storage": []}}, {9: root, 1: table(oid=1)}) == {}


def test_the_policy_refuses_unknown_values_by_name():
    with pytest.raises(InvalidInputError, match="orphaned_tables must be one of"):
        SourceChangePolicy(orphaned_tables="keep")
    with pytest.raises(InvalidInputError, match="on_ddl must be one of"):
        SourceChangePolicy(on_ddl="ignore")
