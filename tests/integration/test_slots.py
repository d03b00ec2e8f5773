"""Replication slot lifecycle and exported snapshots on a real cluster."""

from __future__ import annotations

import uuid

import psycopg2
import pytest

from airflow_provider_pglogical.exceptions import SlotError
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.publications import PublishedTable


@pytest.fixture
def slot_name():
    return f"slot_{uuid.uuid4().hex[:10]}"


def test_slot_lifecycle(publisher, publisher_hook, slot_name):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text)")
    lsn = publisher_hook.create_slot(slot_name)
    assert isinstance(lsn, Lsn)
    assert publisher_hook.create_slot(slot_name) is None  # if_not_exists
    with pytest.raises(psycopg2.errors.DuplicateObject):
        publisher_hook.create_slot(slot_name, if_not_exists=False)
    with pytest.raises(SlotError, match="plugin 'pgoutput', not 'test_decoding'"):
        publisher_hook.create_slot(slot_name, plugin="test_decoding")

    (slot,) = [s for s in publisher_hook.list_slots() if s.name == slot_name]
    assert (slot.plugin, slot.slot_type, slot.database, slot.active, slot.wal_status) == (
        "pgoutput", "logical", publisher.name, False, "reserved"
    )
    assert slot.confirmed_flush_lsn == lsn and slot.restart_lsn <= lsn
    assert slot.retained_wal_bytes >= 0 and slot.lag_bytes >= 0

    publisher_hook.create_publication("p", [PublishedTable("t")])
    publisher.execute("INSERT INTO t VALUES (1, 'one')")
    publisher.execute("INSERT INTO t VALUES (2, 'two')")
    options = {"proto_version": "1", "publication_names": "p"}
    changes = publisher_hook.peek_changes(slot_name, options=options)
    assert [bytes(d)[:1] for _, _, d in changes] == [b"B", b"R", b"I", b"C", b"B", b"I", b"C"]
    # Bounded: upto_nchanges stops after the transaction that reaches the count.
    first_txn = publisher_hook.peek_changes(slot_name, upto_nchanges=1, options=options)
    assert [bytes(d)[:1] for _, _, d in first_txn] == [b"B", b"R", b"I", b"C"]
    # Peeking does not consume; advancing does.
    end_of_first = first_txn[-1][0]
    assert publisher_hook.advance_slot(slot_name, end_of_first) == end_of_first
    rest = publisher_hook.peek_changes(slot_name, options=options)
    assert [bytes(d)[:1] for _, _, d in rest] == [b"B", b"R", b"I", b"C"]
    consumed = publisher_hook.get_changes(slot_name, options=options)
    assert len(consumed) == 4
    assert publisher_hook.peek_changes(slot_name, options=options) == []

    assert publisher_hook.drop_slot(slot_name) is True
    assert publisher_hook.drop_slot(slot_name) is False
    assert publisher_hook.get_slot(slot_name) is None


@pytest.mark.one_server  # test_decoding is a contrib module: the pgserver wheel (16) does not ship it
def test_text_changes_with_test_decoding(publisher, publisher_hook, slot_name):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_slot(slot_name, plugin="test_decoding")
    publisher.execute("INSERT INTO t VALUES (7)")
    rows = publisher_hook.peek_changes(slot_name, binary=False, options={"include-xids": False})
    assert [d for _, _, d in rows] == ["BEGIN", "table public.t: INSERT: id[integer]:7", "COMMIT"]


def test_exported_snapshot_sees_exactly_rows_committed_before_the_slot(publisher, publisher_hook, slot_name):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 5)")
    publisher_hook.create_publication("p", [PublishedTable("t")])
    with publisher_hook.exported_snapshot(slot_name) as snapshot:
        publisher.execute("INSERT INTO t VALUES (6)")  # after the consistent point
        conn = publisher.connect(autocommit=False)
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot.snapshot_name,))
            cur.execute("SELECT array_agg(id ORDER BY id) FROM t")
            assert cur.fetchone()[0] == [1, 2, 3, 4, 5]
        conn.rollback()
        conn.close()
    slot = publisher_hook.get_slot(slot_name)
    assert slot.confirmed_flush_lsn == snapshot.consistent_lsn
    # The row the snapshot did not see is exactly what the slot delivers.
    changes = publisher_hook.peek_changes(slot_name, options={"proto_version": "1", "publication_names": "p"})
    inserts = [bytes(d) for _, _, d in changes if bytes(d)[:1] == b"I"]
    assert len(inserts) == 1 and inserts[0].endswith(b"t\x00\x00\x00\x016")
    # After the block the snapshot is gone.
    conn = publisher.connect(autocommit=False)
    with conn.cursor() as cur, pytest.raises(psycopg2.Error, match="snapshot"):
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot.snapshot_name,))
    conn.close()


def test_temporary_slot_is_dropped_with_its_snapshot(publisher, publisher_hook, slot_name):
    with publisher_hook.exported_snapshot(slot_name, temporary=True) as snapshot:
        assert publisher_hook.get_slot(slot_name).temporary
        assert snapshot.consistent_lsn > Lsn(0)
    from airflow_provider_pglogical.embedded.postgres import wait_until

    wait_until(lambda: publisher_hook.get_slot(slot_name) is None, message="temporary slot to go")


def test_exported_snapshot_refuses_an_existing_slot(publisher_hook, slot_name):
    publisher_hook.create_slot(slot_name)
    with pytest.raises(SlotError, match="already exists"):
        with publisher_hook.exported_snapshot(slot_name):
            pass


def test_drop_of_an_active_slot_names_the_problem(publisher, publisher_hook, slot_name):
    import psycopg2.extras

    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("p", [PublishedTable("t")])
    publisher_hook.create_slot(slot_name)
    consumer = psycopg2.connect(publisher.conninfo, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        consumer.cursor().start_replication(
            slot_name=slot_name, decode=False, options={"proto_version": "1", "publication_names": "p"}
        )
        from airflow_provider_pglogical.embedded.postgres import wait_until

        wait_until(lambda: publisher_hook.get_slot(slot_name).active, message="slot to become active")
        with pytest.raises(SlotError, match="in use by an active consumer"):
            publisher_hook.drop_slot(slot_name)
    finally:
        consumer.close()
