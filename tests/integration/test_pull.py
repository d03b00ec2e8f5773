"""Incremental pull on a real cluster: decoded changes reach staging exactly once, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.staging import batches, contract, layout
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from tests.integration.replay import replay, table_rows


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


def start(hook, root, publications, slot="s1"):
    return run_initial_sync(hook, slot=slot, publications=publications, root=root, pipeline="p")


def pull(hook, root, publications, slot="s1", **kwargs):
    return run_pull(hook, slot=slot, publications=publications, root=root, pipeline="p", **kwargs)


def changes_of(root, result) -> list[dict]:
    name = result["batch"].rsplit("/", 1)[1]
    manifest = layout.read_manifest(root, "p", name)
    rows = []
    for qualified, table in manifest.tables.items():
        for row in batches.read_table(root, "p", name, table).to_pylist():
            rows.append({"table": qualified, **row})
    return sorted(rows, key=lambda r: (r[contract.COMMIT_LSN], r[contract.SEQ]))


def source_rows(db, table, columns="*", where="true"):
    rows = db.query(f"SELECT {columns} FROM {table} WHERE {where}")
    return sorted(tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows)


def test_insert_update_delete_truncate(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'one')")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("INSERT INTO t VALUES (2, 'two')")
    publisher.execute("UPDATE t SET v = 'uno' WHERE id = 1")
    publisher.execute("DELETE FROM t WHERE id = 2")
    result = pull(publisher_hook, root, ["pub"])
    assert [(r["_op"], r["id"], r["v"]) for r in changes_of(root, result)] == [
        ("I", 2, "two"), ("U", 1, "uno"), ("D", 2, None)
    ]
    assert table_rows(replay(root, "p"), "public.t", ["id", "v"]) == source_rows(publisher, "t")
    publisher.execute("INSERT INTO t VALUES (3, 'three'); TRUNCATE t; INSERT INTO t VALUES (4, 'four')")
    result = pull(publisher_hook, root, ["pub"])
    assert [r["_op"] for r in changes_of(root, result)] == ["I", "T", "I"]
    manifest = layout.read_manifest(root, "p", result["batch"].rsplit("/", 1)[1])
    assert manifest.tables["public.t"].details["truncated"] is True
    assert table_rows(replay(root, "p"), "public.t", ["id", "v"]) == [(4, "four")]


def test_key_changing_update_carries_the_old_key(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a')")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("UPDATE t SET id = 10 WHERE id = 1")
    (row,) = changes_of(root, pull(publisher_hook, root, ["pub"]))
    assert (row["_op"], row["id"], row["_old_id"], row["v"]) == ("U", 10, 1, "a")
    assert table_rows(replay(root, "p"), "public.t", ["id", "v"]) == [(10, "a")]


def test_filter_crossing_updates_arrive_as_insert_and_delete(publisher, publisher_hook, root):
    """The row-filter chapter's t1 example ends with exactly (6,999,NSW) and (555,102,NSW)."""
    publisher.execute("CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c))")
    publisher_hook.create_publication("p1", [PublishedTable("t1", where="a > 5 AND c = 'NSW'")])
    start(publisher_hook, root, ["p1"])
    for values in ["2, 102, 'NSW'", "3, 103, 'QLD'", "4, 104, 'VIC'", "5, 105, 'ACT'", "6, 106, 'NSW'",
                   "7, 107, 'NT'", "8, 108, 'QLD'", "9, 109, 'NSW'"]:
        publisher.execute(f"INSERT INTO t1 VALUES ({values})")
    pull(publisher_hook, root, ["p1"])
    assert table_rows(replay(root, "p"), "public.t1", ["a", "b", "c"]) == [(6, 106, "NSW"), (9, 109, "NSW")]
    publisher.execute("UPDATE t1 SET b = 999 WHERE a = 6")
    publisher.execute("UPDATE t1 SET a = 555 WHERE a = 2")
    publisher.execute("UPDATE t1 SET c = 'VIC' WHERE a = 9")
    result = pull(publisher_hook, root, ["p1"])
    assert [(r["_op"], r["a"]) for r in changes_of(root, result)] == [("U", 6), ("I", 555), ("D", 9)]
    assert table_rows(replay(root, "p"), "public.t1", ["a", "b", "c"]) == [(6, 999, "NSW"), (555, 102, "NSW")]


def test_replica_identity_full_sends_old_rows(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE f(a int, b text); ALTER TABLE f REPLICA IDENTITY FULL;"
                      "INSERT INTO f VALUES (1, 'x'), (2, 'y')")
    publisher_hook.create_publication("pub", [PublishedTable("f")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("UPDATE f SET b = 'z' WHERE a = 1")
    publisher.execute("DELETE FROM f WHERE a = 2")
    rows = changes_of(root, pull(publisher_hook, root, ["pub"]))
    assert [(r["_op"], r["a"], r["b"], r["_old_a"], r["_old_b"]) for r in rows] == [
        ("U", 1, "z", 1, "x"), ("D", 2, "y", None, None)
    ]
    manifest = layout.read_manifest(root, "p", layout.committed_batches(root, "p")[-1][0])
    assert manifest.tables["public.f"].key == ["a", "b"]
    assert table_rows(replay(root, "p"), "public.f", ["a", "b"]) == [(1, "z")]


def test_toast_values_untouched_null_and_changed(publisher, publisher_hook, root):
    publisher.execute(
        "CREATE TABLE doc(id int PRIMARY KEY, n int, body text, ext text, blob bytea);"
        "ALTER TABLE doc ALTER COLUMN ext SET STORAGE EXTERNAL;"
    )
    publisher_hook.create_publication("pub", [PublishedTable("doc")])
    start(publisher_hook, root, ["pub"])
    # md5 text compresses about 2x: stored compressed, out of line. EXTERNAL: out of line, uncompressed.
    publisher.execute(
        "INSERT INTO doc SELECT 1, 0, string_agg(md5(g::text) || repeat('z', 64), ''), string_agg(md5(g::text), '') || 'e',"
        " decode(string_agg(md5(g::text), ''), 'hex') FROM generate_series(1, 500) g"
    )
    (big, external, blob), = publisher.query("SELECT body, ext, blob FROM doc")
    assert publisher.query(
        "SELECT pg_column_compression(body), pg_column_size(body) > 2000, pg_column_compression(ext) FROM doc"
    ) == [("pglz", True, None)]
    publisher.execute("INSERT INTO doc VALUES (2, 0, NULL, NULL, NULL)")
    publisher.execute("UPDATE doc SET n = 1")                 # TOAST untouched: sent as unchanged
    publisher.execute("UPDATE doc SET body = 'short' WHERE id = 1")  # changed
    rows = changes_of(root, pull(publisher_hook, root, ["pub"]))
    summary = [(r["_op"], r["id"], r["_unchanged_toast"], r["body"] is None) for r in rows]
    assert summary == [
        ("I", 1, None, False), ("I", 2, None, True),
        ("U", 1, ["body", "ext", "blob"], True), ("U", 2, None, True),
        ("U", 1, ["ext", "blob"], False),
    ]
    assert rows[0]["body"] == big and rows[0]["ext"] == external and rows[0]["blob"] == bytes(blob)
    state = replay(root, "p")
    assert table_rows(state, "public.doc", ["id", "n", "body", "ext", "blob"]) == source_rows(
        publisher, "doc", "id, n, body, ext, blob"
    )


def test_big_transaction_is_never_split(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v int)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("INSERT INTO t VALUES (0, 0)")
    publisher.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 200000) g")
    publisher.execute("INSERT INTO t VALUES (-1, -1)")
    # upto_nchanges=1000 is reached inside the big transaction: it still comes whole, and the
    # window ends right after it.
    first = pull(publisher_hook, root, ["pub"], max_changes=1000)
    assert first["transactions"] == 2 and first["changes"] == 200001
    second = pull(publisher_hook, root, ["pub"], max_changes=1000)
    assert second["transactions"] == 1 and second["changes"] == 1
    assert len(replay(root, "p")["public.t"]) == 200002


def test_two_phase_commit_and_rollback(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    conn = publisher.connect(autocommit=True)
    with conn.cursor() as cur:
        cur.execute("BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION 'keep'")
        cur.execute("BEGIN; INSERT INTO t VALUES (2); PREPARE TRANSACTION 'drop'")
        assert pull(publisher_hook, root, ["pub"])["changes"] == 0  # nothing committed yet
        cur.execute("COMMIT PREPARED 'keep'")
        cur.execute("ROLLBACK PREPARED 'drop'")
    conn.close()
    rows = changes_of(root, pull(publisher_hook, root, ["pub"]))
    assert [(r["_op"], r["id"]) for r in rows] == [("I", 1)]
    assert table_rows(replay(root, "p"), "public.t", ["id"]) == [(1,)]


def test_schema_change_inside_a_batch(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, a text)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("INSERT INTO t VALUES (1, 'a')")
    publisher.execute("ALTER TABLE t ADD COLUMN n numeric(8,2)")
    publisher.execute("INSERT INTO t VALUES (2, 'b', 1.50)")
    publisher.execute("UPDATE t SET n = 2.25 WHERE id = 1")
    result = pull(publisher_hook, root, ["pub"])
    manifest = layout.read_manifest(root, "p", result["batch"].rsplit("/", 1)[1])
    assert [c.name for c in manifest.tables["public.t"].columns] == ["id", "a", "n"]
    assert [c.formatted for c in manifest.tables["public.t"].columns] == ["integer", "text", "numeric(8,2)"]
    assert manifest.schema_changes and manifest.schema_changes[0]["columns"] == ["id", "a", "n"]
    from decimal import Decimal

    assert table_rows(replay(root, "p"), "public.t", ["id", "a", "n"]) == [(1, "a", Decimal("2.25")), (2, "b", Decimal("1.50"))]


def test_idle_slot_does_not_pin_wal_while_another_database_writes(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    cluster = publisher.cluster
    other = f"{publisher.name}_busy"
    cluster.create_database(other)
    try:
        retained = []
        first_lsn = publisher_hook.get_slot("s1").confirmed_flush_lsn
        for _ in range(4):
            cluster.execute("CREATE TABLE IF NOT EXISTS w(x int); INSERT INTO w SELECT generate_series(1, 20000);"
                            "CHECKPOINT", dbname=other)
            result = pull(publisher_hook, root, ["pub"])
            assert result["batch"] is None
            retained.append(publisher_hook.get_slot("s1").retained_wal_bytes)
        written = publisher.query("SELECT pg_current_wal_lsn() - %s::pg_lsn", (str(first_lsn),))[0][0]
        # WAL keeps being written elsewhere, but what the slot holds back stays flat: about one
        # round's worth (restart_lsn follows the running-xacts record of the last CHECKPOINT).
        assert retained[-1] <= retained[1] * 1.2, retained
        assert retained[-1] < written / 3, (retained, written)
        assert publisher_hook.get_slot("s1").lag_bytes < written / 3
    finally:
        from psycopg2 import sql

        conn = cluster.connect()
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(other)))
        conn.close()


def test_logical_messages_are_exposed(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("BEGIN; INSERT INTO t VALUES (1); SELECT pg_logical_emit_message(true, 'wm', 'inside'); COMMIT")
    result = pull(publisher_hook, root, ["pub"])
    manifest = layout.read_manifest(root, "p", result["batch"].rsplit("/", 1)[1])
    assert [(m["prefix"], m["content"], m["transactional"]) for m in manifest.messages] == [("wm", "inside", True)]


KILL_SCRIPT = """
import os, signal
from airflow.sdk import ObjectStoragePath
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.capture import pull
from airflow_provider_pglogical.staging import batches, contract, layout
point = os.environ["KILL_AT"]
if point == "before_manifest":
    original = batches.BatchWriter.commit
    def die(self):
        os.kill(os.getpid(), signal.SIGKILL)
    batches.BatchWriter.commit = die
def before_advance(path):
    if point == "before_advance":
        os.kill(os.getpid(), signal.SIGKILL)
pull.run_pull(PgLogicalHook(postgres_conn_id=os.environ["CONN"]), slot="s1", publications=["pub"],
              root=ObjectStoragePath(os.environ["ROOT"]), pipeline="p", before_advance=before_advance)
"""


@pytest.mark.parametrize("kill_at", ["before_manifest", "before_advance"])
def test_pull_killed_then_rerun_stages_every_change_once(publisher, publisher_hook, root, kill_at):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v int)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    publisher.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 1000) g")
    publisher.execute("UPDATE t SET v = v + 1 WHERE id <= 10")
    position = publisher_hook.get_slot("s1").confirmed_flush_lsn
    env = {**os.environ, "KILL_AT": kill_at, "CONN": publisher.conn_id, "ROOT": str(root)}
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT], env=env)
    assert proc.returncode == -signal.SIGKILL
    assert publisher_hook.get_slot("s1").confirmed_flush_lsn == position  # never advanced
    changes = [b for b in layout.committed_batches(root, "p") if b[3] == "changes"]
    assert len(changes) == (1 if kill_at == "before_advance" else 0)
    rerun = pull(publisher_hook, root, ["pub"])
    assert rerun["recovered"] is (kill_at == "before_advance")
    assert pull(publisher_hook, root, ["pub"])["batch"] is None  # nothing left, nothing twice
    batches = [b for b in layout.committed_batches(root, "p") if b[3] == "changes"]
    assert len(batches) == 1
    rows = changes_of(root, {"batch": f"{root}/p/{batches[0][0]}"})
    assert len(rows) == 1010
    assert table_rows(replay(root, "p"), "public.t", ["id", "v"]) == source_rows(publisher, "t")


def test_max_bytes_cuts_windows_at_transaction_boundaries(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, pad text)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    start(publisher_hook, root, ["pub"])
    for txn in range(5):
        publisher.execute(f"INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series({txn * 100 + 1}, {txn * 100 + 100}) g")
    sizes = []
    while (result := pull(publisher_hook, root, ["pub"], max_bytes=15_000))["batch"] is not None:
        sizes.append((result["transactions"], result["changes"]))
    # Each transaction is ~13 kB of messages: every window stops right after the commit that
    # crossed 15 kB, so windows hold whole transactions and nothing is read twice.
    assert sizes == [(2, 200), (2, 200), (1, 100)]
    assert table_rows(replay(root, "p"), "public.t", ["id"]) == [(i,) for i in range(1, 501)]


def start_filtered_toast_table(publisher, publisher_hook, root) -> None:
    """Row 407 outside the filter ``region = 'EU'``, an external TOAST note; the pipeline started."""
    publisher.execute(
        "CREATE TABLE o(id int NOT NULL, region text NOT NULL, status text, note text);"
        "CREATE UNIQUE INDEX o_key ON o(id, region); ALTER TABLE o REPLICA IDENTITY USING INDEX o_key;"
        "ALTER TABLE o ALTER COLUMN note SET STORAGE EXTERNAL;"
        "INSERT INTO o SELECT 407, 'US', 'new', repeat(md5('x'), 200)"
    )
    publisher_hook.create_publication("pub", [PublishedTable("o", where="region = 'EU'")])
    start(publisher_hook, root, ["pub"])


def test_toast_fetch_follows_a_later_key_change_in_the_batch(publisher, publisher_hook, root):
    """Found by the reliability harness (seed 20261123): a row enters the filter, then its key changes."""
    start_filtered_toast_table(publisher, publisher_hook, root)
    publisher.execute("UPDATE o SET region = 'EU' WHERE id = 407")   # enters the filter: note unchanged
    publisher.execute("UPDATE o SET status = 'paid' WHERE id = 407")
    publisher.execute("UPDATE o SET id = 880 WHERE id = 407")        # key change, note unchanged
    result = pull(publisher_hook, root, ["pub"])
    manifest = layout.read_manifest(root, "p", result["batch"].rsplit("/", 1)[1])
    assert manifest.tables["public.o"].details["toast_fetch"]["filled"] == 2  # the INSERT and the key change
    assert table_rows(replay(root, "p"), "public.o", ["id", "region", "status", "note"]) == source_rows(
        publisher, "o", "id, region, status, note")


def test_toast_fetch_after_a_key_change_in_a_later_batch(publisher, publisher_hook, root):
    """The row enters the filter in one batch; its key changes before that batch's fetch runs and the
    key change itself lands in the next batch: the next batch's fetch supplies the value."""
    start_filtered_toast_table(publisher, publisher_hook, root)
    publisher.execute("UPDATE o SET region = 'EU' WHERE id = 407")  # enters the filter: note unchanged
    boundary = publisher.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]
    publisher.execute("UPDATE o SET id = 880 WHERE id = 407")       # key change, note unchanged
    # Pull only up to the boundary (as a window that ended there), after the key change happened.
    from airflow_provider_pglogical.capture import peek
    from airflow_provider_pglogical.capture import pull as pull_module

    first = peek.peek_window(publisher_hook.connect_kwargs(), "s1", ["pub"],
                                    pull_module.Lsn.parse(boundary), 1000, None)
    manifest = pull_module.stage_batch(publisher_hook, root, "p", publisher_hook.get_slot("s1").confirmed_flush_lsn,
                                       pull_module.Lsn(first.last_end_lsn), first)
    publisher_hook.advance_slot("s1", pull_module.Lsn(first.last_end_lsn))
    assert manifest.tables["public.o"].details["toast_fetch"]["missing"] == 1  # 407 is gone already
    second = pull(publisher_hook, root, ["pub"])
    later = layout.read_manifest(root, "p", second["batch"].rsplit("/", 1)[1])
    assert later.tables["public.o"].details["toast_fetch"]["filled"] == 1     # found under 880
    assert table_rows(replay(root, "p"), "public.o", ["id", "region", "status", "note"]) == source_rows(
        publisher, "o", "id, region, status, note")
