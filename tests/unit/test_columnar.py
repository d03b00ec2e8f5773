"""The vectorised window decoder on captured and hand-built pgoutput bytes.

Every staged table must equal what the message-by-message assembler stages from the same rows;
what it does not handle must raise NeedsAssembler (never decode wrongly).
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.decoding import staged_tables
from airflow_provider_pglogical.decoding import columnar, wire
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.decoding.assembler import ChangeAssembler, Transaction
from airflow_provider_pglogical.lsn import Lsn
from tests.fixtures.pgoutput import build

def copy_chunks(rows, header_alone: bool = False) -> list[bytes]:
    """``(lsn, xid, data)`` rows framed as psycopg2 hands over a binary COPY of ``(lsn, data)``."""
    header, *chunks, trailer = wire.write_copy(
        (Lsn.parse(lsn).value if isinstance(lsn, str) else lsn, data) for lsn, _xid, data in rows)
    if header_alone:
        return [header, *chunks, trailer]
    return [header + chunks[0], *chunks[1:], trailer] if chunks else [header + trailer]


def both_ways(rows) -> tuple[dict, dict]:
    """Staged rows per table from the vectorised decoder and from the assembler."""
    fast = columnar.decode_window(copy_chunks(rows), 1)
    assembler = ChangeAssembler(1)
    txns = [t for t in assembler.feed(rows) if isinstance(t, Transaction)]
    slow = staged_tables.group_by_table(txns, assembler.relations)
    assert fast.transaction_count == len(txns)
    assert fast.last_end_lsn == (txns[-1].end_lsn if txns else None)

    def staged(tables):
        return {t.qualified_name: sorted(t.build({}).to_pylist(), key=lambda r: (r[contract.COMMIT_LSN], r[contract.SEQ]))
                for t in tables.values()}
    return staged(fast.tables), staged(slow)


@pytest.mark.parametrize("server", build.SERVERS, ids=[f"pg{v}" for v in build.SERVERS])
@pytest.mark.parametrize("fixture", ["dml_v1", "rowfilter_v1"])
def test_captured_streams_stage_identically(fixture, server):
    fast, slow = both_ways(build.load(fixture, server)["rows"])
    assert fast and fast == slow
    assert sum(len(rows) for rows in fast.values()) >= 5


OID = 16400
COLUMNS = [(1, "id", 23, -1), (0, "v", 25, -1), (0, "big", 25, -1)]


def txn(xid, lsn, *messages):
    rows = [(lsn, xid, build.begin(lsn + 90, 1000, xid))]
    rows += [(lsn + i + 1, xid, m) for i, m in enumerate(messages)]
    rows.append((lsn + 90, xid, build.commit(lsn + 90, lsn + 99, 1000)))
    return rows


def test_hand_built_shapes_stage_identically():
    rel = build.relation(OID, "public", "t", COLUMNS)
    rows = txn(700, 1000, rel,
               build.insert(OID, ["1", "a", "x" * 3000]),
               build.insert(OID, ["2", None, build.U]),                  # filter-crossing: unchanged TOAST
               build.update(OID, ["1", "b", build.U]),                   # plain update, TOAST untouched
               build.update(OID, ["10", "c", build.U], old=["1", None, None]),  # key change
               build.delete(OID, ["2", None, None]),
               build.message(True, 1050, "wm", b"inside"),
               build.truncate([OID], 0),
               build.insert(OID, ["3", "é", None]))
    rows += [(1100, 0, build.message(False, 1100, "loose", b"\xc3"))]
    rows += txn(701, 1200, build.update(OID, ["3", "full", "z"], old=["3", "é", None], old_kind="O"))
    fast, slow = both_ways(rows)
    assert fast == slow
    staged = fast["public.t"]
    assert [r[contract.OP] for r in staged] == ["I", "I", "U", "U", "D", "T", "I", "U"]
    assert [r[contract.SEQ] for r in staged] == [0, 1, 2, 3, 4, 6, 7, 0]  # the message took seq 5
    assert staged[1][contract.UNCHANGED] == ["big"] and staged[1]["big"] is None
    assert (staged[3]["id"], staged[3]["_old_id"]) == ("10", "1")  # no type info given: text
    window = columnar.decode_window(copy_chunks(rows), 1)
    assert [(m["prefix"], m["commit_lsn"]) for m in window.messages] == [("loose", None), ("wm", str(Lsn(1090)))]
    assert window.tables[OID].truncated


def test_a_schema_change_splits_versions_and_keeps_message_order():
    old = build.relation(OID, "public", "t", COLUMNS[:2])
    new = build.relation(OID, "public", "t", COLUMNS)
    rows = txn(700, 1000, old, build.insert(OID, ["1", "a"]), new, build.insert(OID, ["2", "b", "c"]),
               build.update(OID, ["2", "d", build.U]))
    rows += txn(701, 1200, build.update(OID, ["1", "e", "f"]))
    fast, slow = both_ways(rows)
    assert fast == slow
    window = columnar.decode_window(copy_chunks(rows), 1)
    assert [c["columns"] for c in window.schema_changes] == [["id", "v", "big"]]
    assert [len(g.index) for g in window.tables[OID].groups] == [1, 3]


def test_the_header_may_come_alone_and_an_empty_window_is_empty():
    rows = txn(700, 1000, build.relation(OID, "public", "t", COLUMNS), build.insert(OID, ["1", "a", "b"]))
    assert columnar.decode_window(copy_chunks(rows, header_alone=True), 1).rows == 3 + 0 + 1
    empty = columnar.decode_window(copy_chunks([]), 1)
    assert (empty.rows, empty.tables, empty.transaction_count) == (0, {}, 0)


@pytest.mark.parametrize("why, rows", [
    ("streamed", [(1, 5, build.stream_start(5, True))]),
    ("two-phase", txn(700, 1000)[:1] + [(1050, 700, build.prepare(1050, 1060, 1, 700, "g"))]),
    ("open transaction", txn(700, 1000, build.relation(OID, "public", "t", COLUMNS))[:-1]),
    ("binary column", txn(700, 1000, build.relation(OID, "public", "t", COLUMNS),
                          build.insert(OID, ["1", build.Binary(b"\x00"), None]))),
    ("column count", txn(700, 1000, build.relation(OID, "public", "t", COLUMNS), build.insert(OID, ["1", "a"]))),
    ("no Relation", txn(700, 1000, build.insert(OID, ["1", "a", "b"]))),
    ("length past the end", txn(700, 1000, build.relation(OID, "public", "t", COLUMNS),
                                build.insert(OID, ["1", "a", "b"])[:-1] + b"\xff\xff\xff\xff")),
    ("row outside a transaction", [(1, 0, build.relation(OID, "public", "t", COLUMNS)),
                                   (2, 0, build.insert(OID, ["1", "a", "b"]))]),
])
def test_what_it_does_not_handle_goes_to_the_assembler(why, rows):
    with pytest.raises(columnar.NeedsAssembler):
        columnar.decode_window(copy_chunks(rows), 1)


def test_rows_not_one_per_chunk_go_to_the_assembler():
    chunks = copy_chunks(txn(700, 1000, build.relation(OID, "public", "t", COLUMNS)))
    with pytest.raises(columnar.NeedsAssembler):
        columnar.decode_window([b"".join(chunks)], 1)


@pytest.mark.parametrize("proto_version", [2, 3, 4])
def test_later_protocol_versions_decode_the_same_complete_transactions(proto_version):
    """Without streaming or two-phase messages, protocols 2 to 4 send protocol 1's bytes."""
    rows = txn(700, 1000, build.relation(OID, "public", "t", COLUMNS), build.insert(OID, ["1", "a", None]))
    assert columnar.decode_window(copy_chunks(rows), proto_version).tables[OID].build({}).to_pylist() == \
        columnar.decode_window(copy_chunks(rows), 1).tables[OID].build({}).to_pylist()


def test_unknown_protocol_versions_go_to_the_assembler():
    with pytest.raises(columnar.NeedsAssembler):
        columnar.decode_window(copy_chunks(txn(700, 1000)), 5)


def test_parts_split_large_groups_and_build_in_order(monkeypatch):
    monkeypatch.setattr(columnar, "PART_ROWS", 2)
    monkeypatch.setattr(columnar, "WORKERS", 3)
    rows = txn(700, 1000, build.relation(OID, "public", "t", COLUMNS),
               *[build.insert(OID, [str(i), f"v{i}", None]) for i in range(7)])
    window = columnar.decode_window(copy_chunks(rows), 1)
    assert [len(g.index) for g in window.tables[OID].groups] == [3, 2, 2]
    assert [r["id"] for r in window.tables[OID].build({}).to_pylist()] == [str(i) for i in range(7)]


def test_copy_text_unescape_touches_only_escaped_values():
    import pyarrow as pa

    from airflow_provider_pglogical.staging.values import unescape_copy_text

    texts = pa.array(["plain", "a\\tb\\nc", "\\\\N", None, "\\b\\f\\v\\r", "é\\\\"])
    assert unescape_copy_text(texts).to_pylist() == ["plain", "a\tb\nc", "\\N", None, "\b\f\v\r", "é\\"]
    untouched = pa.array(["x", None])
    assert unescape_copy_text(untouched) is untouched
    # A slice shares its parent's values buffer: a backslash outside the slice changes nothing.
    sliced = texts.slice(3, 3)
    assert unescape_copy_text(sliced).to_pylist() == [None, "\b\f\v\r", "é\\"]
    assert unescape_copy_text(texts.slice(0, 1)).to_pylist() == ["plain"]
    assert unescape_copy_text(pa.array([None, None], pa.string())).to_pylist() == [None, None]
    assert unescape_copy_text(pa.array([], pa.string())).to_pylist() == []
