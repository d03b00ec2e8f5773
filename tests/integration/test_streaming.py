"""Streamed in-progress transactions on every server version: the batch holds exactly what committed.

The test clusters run with ``logical_decoding_work_mem = 64kB``, so each transaction below that
writes a few thousand rows is streamed to the pull in blocks before its commit or abort is decoded.
"""

from __future__ import annotations

import psycopg2
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture import peek
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.management.slots import changes_sql
from tests.integration.replay import replay, table_rows

ROWS = 3000  # ~300kB of changes: several times logical_decoding_work_mem


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


def pull(hook, root, **kwargs):
    return run_pull(hook, slot="s1", publications=["pub"], root=root, pipeline="p", **kwargs)


def streamed_transactions(publisher) -> int:
    return publisher.query("SELECT coalesce(sum(stream_txns), 0) FROM pg_stat_replication_slots "
                           "WHERE slot_name = 's1'")[0][0]


def test_streamed_commits_aborts_and_subtransaction_aborts_stage_only_committed_changes(
        publisher, publisher_hook, root, pg_version):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    pad = "x" * 80
    writer, other = publisher.connect(autocommit=True), publisher.connect(autocommit=True)
    with writer.cursor() as cur, other.cursor() as small:
        # A large transaction that commits, with a small one committing while it is open.
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t SELECT g, %s FROM generate_series(1, %s) g", (pad, ROWS))
        small.execute("INSERT INTO t VALUES (-1, 'small')")
        cur.execute("UPDATE t SET v = 'updated' WHERE id BETWEEN 1 AND 10")
        cur.execute("COMMIT")
        # A large transaction that aborts after it was streamed.
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t SELECT g, %s FROM generate_series(100001, 100000 + %s) g", (pad, ROWS))
        cur.execute("DELETE FROM t WHERE id <= 100")
        cur.execute("ROLLBACK")
        # A large transaction whose (streamed) subtransaction aborts, the rest commits.
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t SELECT g, %s FROM generate_series(200001, 200000 + %s) g", (pad, ROWS))
        cur.execute("SAVEPOINT s")
        cur.execute("INSERT INTO t SELECT g, %s FROM generate_series(300001, 300000 + %s) g", (pad, ROWS))
        cur.execute("UPDATE t SET v = 'lost' WHERE id <= 20")
        cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute("UPDATE t SET v = 'kept' WHERE id = 1")
        cur.execute("COMMIT")
        # max_changes far below one streamed transaction: the pull reads it whole, never stalls on it.
        results = [pull(publisher_hook, root, streaming=True, max_changes=500)]
        while results[-1]["batch"] is not None:
            results.append(pull(publisher_hook, root, streaming=True, max_changes=500))
        assert streamed_transactions(publisher) >= 3  # PostgreSQL did stream them
        assert sum(r["transactions"] for r in results) == 3
        assert sum(r["changes"] for r in results) == ROWS + 1 + 10 + ROWS + 1
        # A large transaction still running when the pull runs (a small commit flushes its WAL):
        # streamed, staged nothing of it, and the slot moved past its first changes; once it
        # commits, the next pull stages all of it.
        cur.execute("BEGIN")
        cur.execute("INSERT INTO t SELECT g, %s FROM generate_series(400001, 400000 + %s) g", (pad, ROWS))
        small.execute("INSERT INTO t VALUES (-2, 'flushes the WAL before it')")
        running = pull(publisher_hook, root, streaming=True)
        assert running["changes"] == 1 and Lsn.parse(running["advanced_to"]) > Lsn.parse(results[-1]["advanced_to"])
        cur.execute("UPDATE t SET v = 'last' WHERE id = 2")
        cur.execute("COMMIT")
    writer.close()
    other.close()
    assert pull(publisher_hook, root, streaming=True)["changes"] == ROWS + 1
    assert table_rows(replay(root, "p"), "public.t", ["id", "v"]) == sorted(publisher.query("SELECT id, v FROM t"))


def test_the_pull_reads_the_highest_protocol_the_server_offers(publisher, publisher_hook, root, pg_version):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    publisher.execute("INSERT INTO t VALUES (1)")
    version = peek.negotiated_proto_version(int(publisher.query("SHOW server_version_num")[0][0]))
    assert version == (3 if pg_version == 15 else 4)
    conn = publisher.connect(autocommit=True)
    try:
        with conn.cursor() as cur:  # one more than negotiated: the server refuses it
            query, args = changes_sql("s1", binary=True, consume=False, upto_lsn=None, upto_nchanges=10,
                                      options=peek.pgoutput_options(["pub"], version + 1))
            with pytest.raises(psycopg2.Error, match="proto_version"):
                cur.execute(query, args)
    finally:
        conn.close()
    assert pull(publisher_hook, root)["changes"] == 1
