"""The pull's review of DDL (capture/ddl.py): which shapes are followed, which re-snapshot, by attnum."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_pglogical.capture import ddl
from airflow_provider_pglogical.decoding.messages import Column, Relation
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.published import ColumnInfo, ResolvedTable
from airflow_provider_pglogical.staging import contract

TEXT, INT4 = 25, 23
OID = 500


def table(*columns: tuple[int, str, int], name: str = "t", oid: int = OID) -> ResolvedTable:
    infos = [ColumnInfo(n, a, t, -1, "x", "x", None, False, n == "id") for a, n, t in columns]
    return ResolvedTable(oid, "public", name, "r", "d", infos, False, None)


def relation(*columns: tuple[str, int], name: str = "t") -> Relation:
    return Relation(OID, "public", name, "d", tuple(Column(int(n == "id"), n, t, -1) for n, t in columns))


def review(before: ResolvedTable, now: ResolvedTable, versions=(), since: str | None = None, defaults=frozenset(),
           enums_before=None, enums_now=None) -> ddl.Review:
    entry = ddl.relation_entry(before, enums_before or {}, ("public", "t"), since)
    window = {OID: list(versions)} if versions else {}
    return ddl.review({"public.t": OID}, {str(OID): entry}, {now.oid: now}, set(defaults), enums_now or {},
                      window, Lsn(100), Lsn(200))


BEFORE = table((1, "id", INT4), (2, "b", TEXT))


def test_a_renamed_column_is_followed_by_attnum_old_rows_included():
    now = table((1, "id", INT4), (2, "c", TEXT))
    found = review(BEFORE, now, [relation(("id", INT4), ("c", TEXT)), relation(("id", INT4), ("b", TEXT))])
    assert not found.resnapshot
    assert found.columns == {OID: {"b": "c"}}
    assert found.evolution == {OID: {"renamed": {"b": "c"}, "dropped": []}}
    assert found.relations[str(OID)]["shapes"] == [[[1, "id", INT4, -1], [2, "b", TEXT, -1]]]


def test_a_dropped_and_added_again_column_is_a_new_column_and_resnapshots():
    now = table((1, "id", INT4), (3, "b", TEXT))
    found = review(BEFORE, now, [relation(("id", INT4), ("b", TEXT))])
    assert "dropped and added again" in found.resnapshot[OID] and OID in found.superseded


def test_added_with_a_default_and_unpromotable_types_resnapshot_promotable_ones_follow():
    added = table((1, "id", INT4), (2, "b", TEXT), (3, "d", INT4))
    assert "default" in review(BEFORE, added, defaults={(OID, 3)}).resnapshot[OID]
    assert not review(BEFORE, added).resnapshot
    assert "cannot promote" in review(BEFORE, table((1, "id", INT4), (2, "b", INT4))).resnapshot[OID]
    wider = review(table((1, "id", INT4), (2, "n", 1700)), table((1, "id", 20), (2, "n", 1700)))
    assert "replica-identity key" not in wider.resnapshot.get(OID, "") and "promote" not in wider.resnapshot.get(OID, "")


def test_a_renamed_enum_label_resnapshots():
    before = table((1, "id", INT4), (2, "m", 9000))
    found = review(before, before, enums_before={"9000": {"1": "ok", "2": "bad"}},
                   enums_now={"9000": {"1": "ok", "2": "awful"}})
    assert "'bad' -> 'awful'" in found.resnapshot[OID]


def test_versions_no_known_layout_explains_resnapshot_unless_older_than_the_tables_snapshot():
    now = table((1, "id", INT4), (2, "d", TEXT))  # b -> c -> d: the middle layout was never seen
    middle = [relation(("id", INT4), ("d", TEXT)), relation(("id", INT4), ("c", TEXT))]
    assert "more than once" in review(BEFORE, now, middle).resnapshot[OID]
    assert OID in review(now, now, middle, since="0/C8").superseded  # all of the window predates it
    straddling = review(now, now, middle, since="0/96")
    assert not straddling.resnapshot and OID not in straddling.superseded
    assert straddling.columns == {OID: {"c": None}}  # the older rows' column is not staged


def test_a_renamed_table_keeps_its_identity_and_a_new_oid_under_its_name_is_resnapshotted():
    found = review(BEFORE, table((1, "id", INT4), (2, "b", TEXT), name="t2"))
    assert found.identities == {OID: ("public", "t")} and not found.resnapshot
    entry = ddl.relation_entry(BEFORE, {}, ("public", "t"), None)
    recreated = table((1, "id", INT4), (2, "x", TEXT), oid=OID + 1)
    found = ddl.review({"public.t": OID}, {str(OID): entry}, {recreated.oid: recreated}, set(), {}, {},
                       Lsn(100), Lsn(200))
    assert "created again" in found.resnapshot[OID + 1] and found.superseded == {OID, OID + 1}
    renamed_away = table((1, "id", INT4), (2, "b", TEXT), name="t_old")
    found = ddl.review({"public.t": OID}, {str(OID): entry}, {OID: renamed_away, recreated.oid: recreated}, set(),
                       {}, {}, Lsn(100), Lsn(200))
    assert found.refused and "public.t_old" in found.refused[0]


def test_restage_moves_old_values_and_unchanged_marks_to_the_new_name():
    # rows of the old layout (b) and of the new one (c): each marks the name its layout lacks;
    # the third row's b was unchanged TOAST, the fourth's c
    data = pa.table({contract.OP: ["U"] * 4, "id": [1, 2, 3, 4], "c": [None, "new", None, None],
                     "b": ["old", None, None, None], "gone": ["x", None, "z", None],
                     contract.UNCHANGED: [["c"], ["b", "gone"], ["b", "c"], ["c", "b", "gone"]]})
    columns = [{"name": n} for n in ("id", "c", "b", "gone")]
    staged, entries = ddl.restage(data, columns, {"b": "c", "gone": None})
    assert staged.column("c").to_pylist() == ["old", "new", None, None]
    assert "b" not in staged.column_names and "gone" not in staged.column_names
    assert staged.column(contract.UNCHANGED).to_pylist() == [None, None, ["c"], ["c"]]
    assert [e["name"] for e in entries] == ["id", "c"]


def test_verify_compares_a_renamed_table_with_the_target_of_its_first_name(tmp_path):
    from airflow.sdk import ObjectStoragePath

    from airflow_provider_pglogical.verification.witness import followed_renames
    from airflow_provider_pglogical.staging.pipeline_record import PipelineRecord, write_record

    root = ObjectStoragePath(tmp_path.as_uri())
    record = PipelineRecord(slot="s1", plugin="pgoutput", database="d", created_lsn="0/1", publications=["p"],
                            tables={"public.t": OID, "public.u": OID + 1})
    record.relations = {str(OID): ddl.relation_entry(BEFORE, {}, ("public", "t"), None)}
    write_record(root, "p", record)
    tables = [table((1, "id", INT4), name="t2"), table((1, "id", INT4), name="u", oid=OID + 1)]
    assert followed_renames(root, "p", tables, None) == {"public.t2": "public__t"}
    assert followed_renames(root, "p", tables, {"public.t": "orders"}) == {"public.t": "orders", "public.t2": "orders"}
