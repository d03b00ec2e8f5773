"""Change assembly: captured PostgreSQL 15 streams in, committed transactions out, in commit order."""

from __future__ import annotations

import gc

import pytest

from airflow_provider_pglogical.decoding.assembler import (
    ChangeAssembler,
    ChangeAssemblyError,
    TableChanges,
    Transaction,
    TruncateChange,
    iter_transactions,
)
from airflow_provider_pglogical.decoding.pgoutput import Column, LogicalMessage, Relation
from tests.fixtures.pgoutput import build


def assemble(name: str, server: int) -> tuple[list, ChangeAssembler]:
    fixture = build.load(name, server)
    assembler = ChangeAssembler(int(fixture["options"][1]))
    return assembler.feed(fixture["rows"]), assembler


def only_table(txn: Transaction) -> TableChanges:
    (changes,) = txn.tables
    return changes


# -- captured: dml_v1 -------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=build.SERVERS, ids=[f"pg{v}" for v in build.SERVERS])
def server(request) -> int:
    """The server version the captured fixtures come from: each captured test runs on every one."""
    return request.param


@pytest.fixture(scope="module")
def dml(server):
    return assemble("dml_v1", server)


def test_transactions_come_out_in_commit_order(dml):
    out, assembler = dml
    txns = [t for t in out if isinstance(t, Transaction)]
    assert len(txns) == 18
    assert [t.commit_lsn for t in txns] == sorted(t.commit_lsn for t in txns)
    assert all(t.end_lsn > t.commit_lsn and t.commit_time.year >= 2024 for t in txns)
    assert assembler.prepared == {} and assembler.advance_limit is None
    assert assembler.open_transaction_xids == []


def test_rows_are_tuples_per_table(dml, server):
    out, assembler = dml
    changes = only_table(out[0])
    assert changes.relation.qualified_name == "public.items"
    assert changes.ops == ["I", "I"] and changes.seqs == [0, 1] and len(changes) == 2
    assert changes.rows == [(b"1", b"apple", b"1", b"1.50", b"happy", None, None),
                            (b"2", b"pear", None, b"0.25", b"sad", b"small", None)]
    assert changes.old_keys == {} and changes.unchanged == {}
    assert changes.columns()[:2] == [(b"1", b"2"), (b"apple", b"pear")]
    assert out[0].xid == int(build.load("dml_v1", server)["rows"][0][1])
    assert assembler.types[changes.relation.columns[4].type_oid].name == "mood"


def test_key_change_records_old_key_by_key_columns(dml):
    out, _ = dml
    changes = only_table(out[2])
    assert changes.ops == ["U"] and changes.rows[0][:2] == (b"10", b"pear")
    assert changes.relation.key_columns == ("id",) and changes.old_keys == {0: (b"2",)}


def test_delete_row_holds_the_key(dml):
    out, _ = dml
    changes = only_table(out[3])
    assert changes.ops == ["D"] and changes.rows == [(b"10", None, None, None, None, None, None)]


def test_unchanged_toast_is_recorded_per_row_never_as_a_value(dml):
    out, _ = dml
    untouched = only_table(out[4])
    assert untouched.rows == [(b"3", b"toasty", b"7", b"9.99", b"ok", None, None)]
    assert untouched.unchanged == {0: (5, 6)}
    nulled = only_table(out[5])
    assert nulled.rows[0][5:] == (None, None) and nulled.unchanged == {0: (6,)}  # big is NULL, ext kept
    key_change = only_table(out[6])
    assert key_change.old_keys == {0: (b"3",)} and key_change.unchanged == {0: (6,)}


def test_replica_identity_full_old_key_is_the_whole_old_row(dml):
    out, _ = dml
    update = only_table(out[8])
    assert update.old_keys == {0: (b"1", b"x")} and update.rows == [(b"1", b"y")]
    delete = only_table(out[9])
    assert delete.ops == ["D"] and delete.rows == [(b"1", b"y")]


def test_truncates(dml):
    out, assembler = dml
    (cascade,) = out[10].truncates
    names = [assembler.relations[oid].name for oid in cascade.relation_oids]
    assert names == ["parent", "child"] and cascade == TruncateChange(0, cascade.relation_oids, True, False)
    assert out[10].tables == []
    (restart,) = out[12].truncates
    assert (restart.cascade, restart.restart_identity) == (False, True)


def test_logical_messages(dml):
    out, _ = dml
    txn = out[13]
    (message,) = txn.messages
    assert only_table(txn).seqs == [0] and message.seq == 1
    assert (message.message.prefix, message.message.content, message.message.transactional) == (
        "app", b"in-transaction", True)
    standalone = out[14]
    assert isinstance(standalone, LogicalMessage) and not standalone.transactional
    assert standalone.content == b"right-now"
    assert out[13].commit_lsn < standalone.lsn < out[15].commit_lsn


def test_schema_changes_are_recorded_with_their_lsn(dml):
    out, assembler = dml
    first, second = assembler.schema_changes
    assert first.new.column_names[-1] == "extra" and first.old.column_names[-1] == "ext"
    assert second.old.column_names[-1] == "extra" and second.new.column_names[-1] == "more"
    assert out[16].schema_changes == [first] and out[17].schema_changes == [second]
    assert out[16].commit_lsn > first.lsn > out[15].commit_lsn
    assert first.xid == out[16].xid
    assert assembler.relations[first.new.oid] is second.new


def test_schema_change_inside_a_transaction_splits_its_rows(dml):
    out, _ = dml
    before, after = out[17].tables
    assert before.relation.oid == after.relation.oid and before.relation is not after.relation
    assert before.rows == [(b"7", b"same txn before", None, None, None, None, None, None)]
    assert after.rows == [(b"8", b"same txn after", None, None, None, None, None, None, b"42")]
    assert (before.seqs, after.seqs) == ([0], [1])


def test_unchanged_relation_message_keeps_one_table_group(dml):
    out, _ = dml
    # Every transaction that touched items after the ALTER got the Relation again (new session
    # state): unchanged, so no schema change and no extra TableChanges.
    assert len(out[18].tables) == 1 and not out[18].schema_changes
    assert out[18].origin == "upstream"


# -- captured: row filter ------------------------------------------------------------------------
def test_row_filter_crossing_update_becomes_insert_with_unchanged_toast(server):
    out, _ = assemble("rowfilter_v1", server)
    moved_in = only_table(out[0])
    assert moved_in.ops == ["I"] and moved_in.rows == [(b"1", b"EU", None)] and moved_in.unchanged == {0: (2,)}
    assert [only_table(t).ops[0] for t in out] == ["I", "I", "U", "D", "I"]
    assert only_table(out[3]).rows == [(b"1", b"EU", None)]
    assert only_table(out[4]).relation.column_names == ("id", "a")


# -- captured: two-phase ------------------------------------------------------------------------------
def test_prepared_transactions_wait_for_commit_prepared(server):
    fixture = build.load("twophase_v3", server)
    out, assembler = assemble("twophase_v3", server)
    plain, g1, after_pending = out
    assert only_table(plain).rows == [(b"2", b"plain")] and plain.gid is None
    # g1 is emitted at COMMIT PREPARED, with the commit facts of that message.
    assert g1.gid == "g1" and only_table(g1).rows == [(b"1", b"committed")]
    assert g1.commit_lsn > plain.commit_lsn and g1.prepare_lsn < plain.commit_lsn
    assert only_table(after_pending).rows == [(b"5", b"after pending")]
    # g2 was rolled back: nothing; g3 is still prepared: held and exposed.
    assert all(b"rolled back" not in row[1] for t in out for c in t.tables for row in c.rows)
    (pending,) = assembler.prepared.values()
    assert pending.gid == "g3" and pending.commit_lsn is None and only_table(pending).rows == [(b"4", b"pending")]
    assert assembler.advance_limit == pending.prepare_lsn < after_pending.commit_lsn
    assert str(pending.xid) in {xid for _l, xid, _d in fixture["rows"]}


def test_commit_prepared_without_its_prepare_is_an_error():
    rows = [(1, None, build.commit_prepared(0x50, 0x60, 8, 701, "lost"))]
    with pytest.raises(ChangeAssemblyError, match="COMMIT PREPARED 'lost'.*advance_limit"):
        ChangeAssembler(3).feed(rows)


def test_rollback_prepared_of_an_unknown_gid_is_ignored():
    assert ChangeAssembler(3).feed([(1, None, build.rollback_prepared(1, 2, 3, 4, 5, "gone"))]) == []


# -- captured: streaming -------------------------------------------------------------------------------
def test_streamed_transaction_is_assembled_at_stream_commit_without_aborted_subtransaction(server):
    out, assembler = assemble("stream_v2", server)
    small1, big, small2 = out
    assert only_table(small1).rows == [(b"1",)] and only_table(small2).rows == [(b"2",)]
    assert big.streamed and not small1.streamed and small1.commit_lsn < big.commit_lsn < small2.commit_lsn
    changes = only_table(big)
    ids = [int(row[0]) for row in changes.rows]
    assert ids == list(range(1, 1001)) + [5000, 1, 2]  # 1001..2000 were rolled back to the savepoint
    assert changes.ops == ["I"] * 1001 + ["U", "D"]
    assert changes.rows[-2] == (b"1", b"updated") and changes.rows[-1] == (b"2", None)
    (message,) = big.messages
    assert message.message.content == b"inside stream"
    assert sorted(changes.seqs + [message.seq]) == list(range(big.change_count)) == list(range(1004))
    assert message.seq == 1000  # emitted after the first 1000 inserts
    assert assembler.open_transaction_xids == []  # the rolled-back big transaction is gone


def test_streamed_prepared_transaction(server):
    (txn,), assembler = assemble("stream_twophase_v3", server)
    assert txn.streamed and txn.gid == "big1" and len(only_table(txn)) == 1000
    assert assembler.prepared == {}


def test_feeding_in_chunks_gives_the_same_transactions(server):
    fixture = build.load("stream_v2", server)
    whole = ChangeAssembler(2).feed(fixture["rows"])
    chunked = list(iter_transactions(fixture["rows"], 2, chunk_size=7))
    assert [(t.xid, t.commit_lsn, [c.rows for c in t.tables]) for t in chunked] == [
        (t.xid, t.commit_lsn, [c.rows for c in t.tables]) for t in whole]


# -- hand-built ------------------------------------------------------------------------------------
REL = build.relation(5, "public", "t", [(1, "id", 23, -1), (0, "v", 25, -1)])


def rows(*messages: bytes) -> list[tuple[int, None, bytes]]:
    return [(i + 1, None, m) for i, m in enumerate(messages)]


def test_protocol_4_parallel_stream_abort_drops_the_subtransaction():
    out = ChangeAssembler(4).feed(rows(
        build.stream_start(10, True), build.relation(5, "public", "t", [(1, "id", 23, -1), (0, "v", 25, -1)], xid=10),
        build.insert(5, ["1", "a"], xid=10), build.insert(5, ["2", "b"], xid=11),
        build.insert(5, ["3", "c"], xid=12), build.stream_stop(),
        build.stream_abort(10, 11, abort_lsn=0x99, abort_ts=5),
        build.stream_start(10, False), build.insert(5, ["4", "d"], xid=10), build.stream_stop(),
        build.stream_commit(10, 0x100, 0x110, 7),
    ))
    (txn,) = out
    assert [r[0] for r in only_table(txn).rows] == [b"1", b"3", b"4"] and only_table(txn).seqs == [0, 1, 2]
    assert (txn.commit_lsn, txn.end_lsn, txn.commit_ts) == (0x100, 0x110, 7)


def test_stream_restarting_at_first_segment_starts_over():
    """A new peek replays a streamed transaction from its first segment."""
    out = ChangeAssembler(2).feed(rows(
        build.stream_start(10, True), build.relation(5, "public", "t", [(1, "id", 23, -1)], xid=10),
        build.insert(5, ["1"], xid=10), build.stream_stop(),
        build.stream_start(10, True), build.insert(5, ["1"], xid=10), build.stream_stop(),
        build.stream_commit(10, 0x100, 0x110, 7),
    ))
    assert only_table(out[0]).rows == [(b"1",)]


def test_stream_continuation_without_first_segment_is_an_error():
    with pytest.raises(ChangeAssemblyError, match="without its first segment"):
        ChangeAssembler(2).feed(rows(build.stream_start(10, False)))


def test_schema_change_against_seeded_relations():
    known = Relation(5, "public", "t", "d", (Column(1, "id", 23, -1),))
    assembler = ChangeAssembler(1, relations=[known])
    out = assembler.feed([("0/A0", None, build.begin(1, 2, 3)), ("0/B0", None, REL),
                          ("0/B0", None, build.insert(5, ["1", "x"])), ("0/C0", None, build.commit(1, 2, 2))])
    (change,) = out[0].schema_changes
    assert (change.lsn, change.old, change.new.column_names, change.xid) == (0xB0, known, ("id", "v"), 3)


def test_schema_change_inside_a_stream_keeps_each_row_with_its_schema():
    wide = build.relation(5, "public", "t", [(1, "id", 23, -1), (0, "v", 25, -1), (0, "w", 25, -1)], xid=10)
    out = ChangeAssembler(2).feed(rows(
        build.stream_start(10, True), build.relation(5, "public", "t", [(1, "id", 23, -1), (0, "v", 25, -1)], xid=10),
        build.insert(5, ["1", "a"], xid=10), wide, build.insert(5, ["2", "b", "c"], xid=10),
        build.update(5, ["2", "B", build.U], xid=10), build.stream_stop(), build.stream_commit(10, 0x100, 0x110, 7),
    ))
    narrow, wider = out[0].tables
    assert narrow.rows == [(b"1", b"a")] and wider.rows == [(b"2", b"b", b"c"), (b"2", b"B", None)]
    assert wider.unchanged == {1: (2,)} and [c.lsn for c in out[0].schema_changes] == [4]


def test_change_before_its_relation_is_an_error():
    with pytest.raises(ChangeAssemblyError, match="relation oid 5 .* before any Relation message"):
        ChangeAssembler().feed(rows(build.begin(1, 2, 3), build.insert(5, ["1", "x"])))
    with pytest.raises(ChangeAssemblyError, match="relation oid 5"):
        ChangeAssembler().feed(rows(build.begin(1, 2, 3), build.delete(5, ["1", None])))


def test_changes_outside_a_transaction_are_an_error():
    with pytest.raises(ChangeAssemblyError, match="outside a transaction"):
        ChangeAssembler().feed(rows(REL, build.insert(5, ["1", "x"])))
    with pytest.raises(ChangeAssemblyError, match="Commit at LSN 1 outside a transaction"):
        ChangeAssembler().feed(rows(build.commit(1, 2, 3)))
    with pytest.raises(ChangeAssemblyError, match="while xid 3 is open"):
        ChangeAssembler().feed(rows(build.begin(1, 2, 3), build.begin(1, 2, 4)))


def test_open_transaction_is_kept_between_feeds():
    assembler = ChangeAssembler()
    assert assembler.feed(rows(build.begin(1, 2, 3), REL, build.insert(5, ["1", "x"]))) == []
    assert assembler.open_transaction_xids == [3]
    (txn,) = assembler.feed([(9, None, build.update(5, ["1", "y"])), (10, None, build.commit(1, 2, 2))])
    assert only_table(txn).ops == ["I", "U"] and only_table(txn).seqs == [0, 1]


def test_feed_pauses_the_gc_and_restores_it():
    assembler = ChangeAssembler()
    assert gc.isenabled()
    assembler.feed(rows(build.begin(1, 2, 3), REL, build.insert(5, ["1", "x"]), build.commit(1, 2, 2)))
    assert gc.isenabled()
    gc.disable()
    try:
        assembler.feed(rows(build.begin(1, 2, 3), build.commit(1, 2, 2)))
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ChangeAssemblyError):
        assembler.feed(rows(build.commit(1, 2, 2)))
    assert gc.isenabled()


def test_memoryview_rows_as_psycopg2_returns_them(server):
    data = [(lsn, xid, memoryview(d)) for lsn, xid, d in build.load("rowfilter_v1", server)["rows"]]
    out = ChangeAssembler().feed(data)
    assert only_table(out[1]).rows == [(b"2", b"EU", b"p2")]
