"""The chunked initial load: equal to the source under concurrent writes, no transaction held
across chunks, resumable after a kill without recopying a chunk, refusals before any change, and a
keyless table loaded whole (test_chunked_load_whole.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading

import psycopg2.errors
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
from airflow_provider_pglogical.capture.chunked.progress import CHUNK_DETAILS, read_load
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.exceptions import PipelineStateError
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.ui.discovery import PipelineRef
from airflow_provider_pglogical.ui.figures import staging_figures
from tests.integration.replay import replay, table_rows

SOURCE = """
CREATE TABLE items(id int PRIMARY KEY, grp int NOT NULL, label text);
INSERT INTO items SELECT g, g % 7, 'item ' || g FROM generate_series(1, 2000) g;
CREATE TABLE notes(code text PRIMARY KEY, body text);
INSERT INTO notes SELECT 'n' || g, repeat('x', g % 50) FROM generate_series(1, 700) g;
"""


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


class Writer:
    """Random inserts, updates (some changing the key) and deletes on ``items`` and ``notes``."""

    def __init__(self, publisher, seed: int) -> None:
        self.conn = publisher.connect()
        self.random = random.Random(seed)
        self.next_id = 10_000

    def burst(self, transactions: int = 5) -> None:
        for _ in range(transactions):
            try:
                self._transaction()
            except (psycopg2.errors.UniqueViolation, psycopg2.errors.DeadlockDetected):
                self.conn.cursor().execute("ROLLBACK")  # two writers raced for one key: that one is undone

    def _transaction(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("BEGIN")
            for _ in range(self.random.randint(1, 4)):
                kind, key = self.random.random(), self.random.randint(1, 2400)
                if kind < 0.3:
                    self.next_id += 1
                    cur.execute("INSERT INTO items VALUES (%s, 1, 'new') ON CONFLICT DO NOTHING",
                                (self.random.choice([self.next_id, key]),))
                elif kind < 0.55:
                    cur.execute("UPDATE items SET label = label || '+', grp = grp + 1 WHERE id = %s", (key,))
                elif kind < 0.7:  # a key change, across chunks
                    self.next_id += 1
                    new = self.random.choice([self.next_id, 2400 - key, -key])
                    cur.execute("UPDATE items SET id = %s WHERE id = %s AND NOT EXISTS "
                                "(SELECT FROM items WHERE id = %s)", (new, key, new))
                elif kind < 0.85:
                    cur.execute("DELETE FROM items WHERE id = %s", (key,))
                else:
                    cur.execute("UPDATE notes SET code = code || 'k', body = 'moved' WHERE code = %s AND "
                                "NOT EXISTS (SELECT FROM notes WHERE code = %s)", (f"n{key % 700}", f"n{key % 700}k"))
            cur.execute("COMMIT" if self.random.random() < 0.9 else "ROLLBACK")


def _drain(publisher_hook, root) -> None:
    while run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p",
                   max_changes=500)["batch"] is not None:
        pass


def _assert_equal_to_source(publisher, root) -> None:
    state = replay(root, "p")
    assert table_rows(state, "public.items", ["id", "grp", "label"]) == sorted(
        publisher.query("SELECT id, grp, label FROM items"))
    assert table_rows(state, "public.notes", ["code", "body"]) == sorted(publisher.query("SELECT code, body FROM notes"))


def test_chunked_load_equals_the_source_under_concurrent_writes(publisher, publisher_hook, root):
    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("notes")])
    writer, background = Writer(publisher, 51), Writer(publisher, 52)
    stop = threading.Event()

    def keep_writing() -> None:  # truly concurrent, besides the bursts at each chunk's moments
        while not stop.is_set():
            background.burst(1)

    thread = threading.Thread(target=keep_writing, daemon=True)
    hooks = ChunkHooks(low=lambda e: writer.burst(), read=lambda e: writer.burst(), staged=lambda e: writer.burst())
    thread.start()
    try:
        result = run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p",
                                  chunk_rows=300, hooks=hooks)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    load = read_load(root, "p")
    assert load.complete and load.tables["public.items"].chunks >= 6 and load.tables["public.notes"].chunks >= 3
    assert result["tables"]["public.items"] == load.tables["public.items"].rows
    listing = sorted(p.name for p in (root / "p").iterdir())
    again = run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=300)
    assert again == result and sorted(p.name for p in (root / "p").iterdir()) == listing  # a re-run: nothing to do
    writer.burst(20)  # after the load: the pull's changes continue it
    _drain(publisher_hook, root)
    _assert_equal_to_source(publisher, root)


def test_a_partitioned_table_published_through_its_root_equals_the_source(publisher, publisher_hook, root):
    publisher.execute("""
        CREATE TABLE parts(id int, region int, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
        CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN (1, 2);
        CREATE TABLE parts_b PARTITION OF parts FOR VALUES IN (3, 4);
        INSERT INTO parts SELECT g, 1 + g % 4, 'v' || g FROM generate_series(1, 1200) g;
    """)
    publisher_hook.create_publication("p", [PublishedTable("parts")], publish_via_partition_root=True)
    conn, rng = publisher.connect(), random.Random(3)

    def burst(event) -> None:  # rows move between partitions, across chunks, inside and between reads
        with conn.cursor() as cur:
            for _ in range(5):
                key = rng.randint(1, 1300)
                cur.execute("UPDATE parts SET region = 1 + (region + 1) %% 4, v = v || '>' WHERE id = %s AND NOT "
                            "EXISTS (SELECT FROM parts o WHERE o.id = parts.id AND o.region = 1 + (parts.region + 1) %% 4)",
                            (key,))
                cur.execute("INSERT INTO parts VALUES (%s, %s, 'late') ON CONFLICT DO NOTHING",
                            (rng.randint(1, 1400), rng.randint(1, 4)))
                cur.execute("DELETE FROM parts WHERE id = %s", (rng.randint(1, 1300),))

    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=200,
                     hooks=ChunkHooks(low=burst, read=burst))
    assert read_load(root, "p").tables["public.parts"].chunks >= 6
    burst(None)
    _drain(publisher_hook, root)
    assert table_rows(replay(root, "p"), "public.parts", ["id", "region", "v"]) == sorted(
        publisher.query("SELECT id, region, v FROM parts"))


def test_no_transaction_is_held_between_chunks(publisher, publisher_hook, root):
    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("notes")])
    seen: dict[str, list] = {"read": [], "staged": []}

    def sample(moment: str):
        def probe(event) -> None:
            seen[moment].append(publisher.query(
                "SELECT backend_xmin IS NOT NULL, xact_start IS NOT NULL, state FROM pg_stat_activity WHERE pid = %s",
                (event.pid,))[0])
        return probe

    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=250,
                     hooks=ChunkHooks(read=sample("read"), staged=sample("staged")))
    assert len(seen["staged"]) >= 8
    # inside a chunk the probe sees the loader's snapshot: it can see one when there is one
    assert all(row == (True, True, "idle in transaction") for row in seen["read"]), seen["read"]
    # between chunks the loader holds no snapshot and no transaction
    assert all(row == (False, False, "idle") for row in seen["staged"]), seen["staged"]


KILLED_LOAD = textwrap.dedent("""
    import os, sys
    from airflow.sdk import ObjectStoragePath
    from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
    from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from tests.support.processes import die_now

    def kill(event):
        if event.table == "public.items" and event.chunk == int(os.environ["CHUNK"]):
            die_now()

    # the kill points inside the chunked load: "staged", after a chunk's batch is committed, before its
    # progress record; "read", inside a chunk's transaction, its Parquet written, no manifest
    run_chunked_sync(PgLogicalHook(postgres_conn_id=os.environ["CONN"]), slot="s1", publications=["p"],
                     root=ObjectStoragePath(os.environ["ROOT"]), pipeline="p", chunk_rows=300,
                     hooks=ChunkHooks(**{os.environ["AT"]: kill}))
    print("NOT KILLED")
""")


def test_a_killed_load_resumes_at_its_first_unstaged_chunk(publisher, publisher_hook, root):
    publisher.execute(SOURCE + "ANALYZE items, notes;")  # PostgreSQL's estimate, which the view shows
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("notes")])
    ref = PipelineRef(str(root), "p", publisher.conn_id, "s1")

    def killed(at: str, chunk: int) -> None:
        env = {**os.environ, "CONN": publisher.conn_id, "ROOT": str(root), "AT": at, "CHUNK": str(chunk)}
        proc = subprocess.run([sys.executable, "-c", KILLED_LOAD], env=env, cwd=os.getcwd(), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == -9, proc.stdout + proc.stderr

    killed("staged", 3)
    chunks_before = [n for n, _s, _e, k in committed_batches(root, "p") if k == "snapshot"]
    assert len(chunks_before) == 1 + 4  # the empty start, items' chunks 0..3
    assert read_load(root, "p").tables["public.items"].chunks == 3  # chunk 3 staged, its record not written
    # the pipeline view shows the unfinished load as its record says it: 3 chunks of items, of ~2,700 rows
    load = staging_figures(root, ref)["initial_load"]
    assert (load["complete"], load["chunks"], load["rows"], load["tables_done"], load["tables"]) == (False, 3, 900, 0, 2)
    assert load["estimated_rows"] == 2700 and load["per_table"]["public.items"]["estimated_rows"] == 2000
    listing = sorted(p.name for p in (root / "p").iterdir())
    with pytest.raises(PipelineStateError, match="has an unfinished chunked load of slot 's1': re-run the initial "
                       "sync with snapshot_mode='chunked'"):
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert sorted(p.name for p in (root / "p").iterdir()) == listing
    assert publisher.query("SELECT slot_name FROM pg_replication_slots") == [("s1",)]
    writer = Writer(publisher, 7)
    writer.burst(30)  # writes while nobody loads
    killed("read", 4)  # resumed, then killed inside chunk 4's read: its files stay, without a manifest
    unfinished = [p.name for p in (root / "p").iterdir() if p.name.endswith("-snapshot") and not (p / "_manifest.json").exists()]
    assert len(unfinished) == 1
    writer.burst(30)
    copied: list = []
    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=300,
                     hooks=ChunkHooks(low=lambda e: (copied.append((e.table, e.chunk)), writer.burst(2))))
    assert ("public.items", 3) not in copied and copied[0] == ("public.items", 4)
    load = staging_figures(root, ref)["initial_load"]
    assert (load["complete"], load["tables_done"], load["chunks"]) == (True, 2, len(copied) + 4), load
    assert not (root / "p" / unfinished[0]).exists()  # the killed chunk's files are gone; it was read again
    ranges = [read_manifest(root, "p", n).details.get(CHUNK_DETAILS, {}) for n, *_ in committed_batches(root, "p")]
    items = [(r["start"], r["end"]) for r in ranges if r.get("table") == "public.items"]
    assert len(items) == len(set(items)) and items[0][0] is None and items[-1][1] is None  # tiled once
    assert all(a[1] == b[0] for a, b in zip(items, items[1:]))
    _drain(publisher_hook, root)
    _assert_equal_to_source(publisher, root)


def test_a_keyless_table_is_loaded_whole_not_refused(publisher, publisher_hook, root):
    """Once refused (its duplicates could be doubled or lost by a chunk), a keyless table is now
    loaded whole in an exported snapshot of its own (test_chunked_load_whole.py has the rest)."""
    publisher.execute(SOURCE + "CREATE TABLE events(at int, what text); ALTER TABLE events REPLICA IDENTITY FULL;"
                      "INSERT INTO events VALUES (1, 'a'), (1, 'a');")
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("events")])
    lines: list[str] = []
    result = run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=300,
                              report=lines.append)
    assert result["tables"]["public.events"] == 2  # both copies: a multiset
    load = read_load(root, "p")
    assert load.complete and load.tables["public.events"].chunks == 1 and load.tables["public.items"].chunks >= 6
    assert "(REPLICA IDENTITY FULL): its rows are a multiset" in load.tables["public.events"].whole
    assert "1 table(s) loaded whole" in lines[0] and "public.events (no primary key" in lines[0]
    assert publisher.query("SELECT slot_name FROM pg_replication_slots") == [("s1",)]  # the temporary one is gone
