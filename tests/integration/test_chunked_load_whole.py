"""A chunked load with tables it cannot read in key chunks: a keyless table (a multiset, with
duplicate rows) and a key PostgreSQL and Spark may order differently are loaded whole, each in the
exported snapshot of a temporary slot of its own, exactly, under concurrent writes; the primary's
xmin is held for that one table's copy only; a load killed inside that copy resumes with the same
slot, copies the table again from scratch and no finished chunk; and the one refusal left (no room
for the temporary slot) changes nothing."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
from collections import Counter

import psycopg2.errors
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.chunked.chunks import APPLICATION_NAME, ChunkHooks
from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
from airflow_provider_pglogical.capture.chunked.plan import ChunkedLoadRefused
from airflow_provider_pglogical.capture.chunked.progress import CHUNK_DETAILS, read_load
from airflow_provider_pglogical.capture.chunked.whole import SLOT_PREFIX
from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.ui.discovery import PipelineRef
from airflow_provider_pglogical.ui.figures import staging_figures
from tests.integration.replay import multiset_rows, replay, table_rows
from tests.integration.test_chunked_load import SOURCE, Writer, _drain

# items (int key, chunks), ledger (keyless, duplicates: loaded whole), notes (text key, chunks),
# tokens (uuid key: loaded whole); published in this order
WHOLE_SOURCE = SOURCE + """
CREATE TABLE ledger(account int, amount int, memo text);
ALTER TABLE ledger REPLICA IDENTITY FULL;
INSERT INTO ledger SELECT g % 5, g % 3, CASE WHEN g % 4 = 0 THEN NULL ELSE 'm' || (g % 2) END
  FROM generate_series(1, 900) g;
CREATE TABLE tokens(id uuid PRIMARY KEY, v int);
INSERT INTO tokens SELECT md5(g::text)::uuid, g FROM generate_series(1, 300) g;
"""
TABLES = ["items", "ledger", "notes", "tokens"]
LEDGER = ["account", "amount", "memo"]
VALUES = [(a, m, memo) for a in range(6) for m in range(3) for memo in ("m0", "m1", None)]


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


class LedgerWriter:
    """Inserts of duplicate rows, deletes and updates of one copy of a duplicated row (by ctid, as an
    application without a key does), and updates of ``tokens``."""

    def __init__(self, publisher, seed: int) -> None:
        self.conn = publisher.connect()
        self.random = random.Random(seed)

    def burst(self, transactions: int = 3) -> None:
        for _ in range(transactions):
            try:
                self._transaction()
            except psycopg2.errors.DeadlockDetected:
                self.conn.cursor().execute("ROLLBACK")

    def _transaction(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("BEGIN")
            for _ in range(self.random.randint(1, 4)):
                kind, value = self.random.random(), self.random.choice(VALUES)
                one = ("ctid = (SELECT ctid FROM ledger WHERE (account, amount, memo) IS NOT DISTINCT FROM "
                       "(%s, %s, %s) LIMIT 1)")
                if kind < 0.35:
                    cur.execute("INSERT INTO ledger VALUES (%s, %s, %s), (%s, %s, %s)", value + value)
                elif kind < 0.6:
                    cur.execute("DELETE FROM ledger WHERE " + one, value)
                elif kind < 0.85:
                    cur.execute("UPDATE ledger SET (account, amount, memo) = (%s, %s, %s) WHERE " + one,
                                self.random.choice(VALUES) + value)
                else:
                    cur.execute("UPDATE tokens SET v = v + 1 WHERE v = %s", (self.random.randint(1, 300),))
            cur.execute("COMMIT" if self.random.random() < 0.9 else "ROLLBACK")


class Background:
    """Writes to every table from other sessions for as long as the block runs."""

    def __init__(self, publisher, seed: int) -> None:
        self.keyed, self.keyless = Writer(publisher, seed), LedgerWriter(publisher, seed + 1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.keyed.burst(1)
            self.keyless.burst(1)

    def __enter__(self) -> "Background":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


KILLED_IN_WHOLE_COPY = textwrap.dedent("""
    import os
    from airflow.sdk import ObjectStoragePath
    from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
    from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from tests.support.processes import die_now

    def kill(event):
        if event.table == os.environ["TABLE"] and event.chunk == int(os.environ.get("CHUNK", event.chunk)):
            die_now()

    # "read": inside the table's exported snapshot, its Parquet written, no manifest; "staged": its
    # batch committed, the progress record not yet written
    run_chunked_sync(PgLogicalHook(postgres_conn_id=os.environ["CONN"]), slot="s1", publications=["p"],
                     root=ObjectStoragePath(os.environ["ROOT"]), pipeline="p", chunk_rows=300,
                     hooks=ChunkHooks(**{os.environ.get("AT", "read"): kill}))
    print("NOT KILLED")
""")


def load_backends(publisher) -> list[tuple]:
    """The load's sessions (loader, a whole table's copiers and temporary slot's walsender) holding an xmin."""
    return publisher.query("SELECT pid, backend_type FROM pg_stat_activity WHERE application_name = %s "
                           "AND backend_xmin IS NOT NULL", (APPLICATION_NAME,))


def killed_and_resumed(publisher, publisher_hook, root) -> dict:
    """The scenario: killed inside ledger's whole copy under concurrent writes, resumed with the same
    slot; returns what the resume saw (the chunks it copied, the load's sessions at each moment)."""
    publisher.execute(WHOLE_SOURCE + "ANALYZE items, ledger, notes, tokens;")
    publisher_hook.create_publication("p", [PublishedTable(t) for t in TABLES])
    env = {**os.environ, "CONN": publisher.conn_id, "ROOT": str(root), "TABLE": "public.ledger"}
    with Background(publisher, 11):
        proc = subprocess.run([sys.executable, "-c", KILLED_IN_WHOLE_COPY], env=env, cwd=os.getcwd(),
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    load = read_load(root, "p")
    assert load.tables["public.items"].done and load.tables["public.items"].chunks >= 6
    assert not load.tables["public.ledger"].done and "multiset" in load.tables["public.ledger"].whole
    finished_items = [n for n, *_ in committed_batches(root, "p")
                      if read_manifest(root, "p", n).details.get(CHUNK_DETAILS, {}).get("table") == "public.items"]
    unfinished = [p.name for p in (root / "p").iterdir()
                  if p.name.endswith("-snapshot") and not (p / "_manifest.json").exists()]
    assert len(unfinished) == 1  # the killed copy's Parquet, never committed
    # the killed task's temporary slot goes with its session; the pipeline's slot stays
    wait_until(lambda: publisher.query("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %s",
                                       (SLOT_PREFIX + "%",))[0][0] == 0, timeout=30, message="the temporary slot")
    assert publisher.query("SELECT slot_name FROM pg_replication_slots") == [("s1",)]

    seen: dict = {"copied": [], "whole_read": [], "between": [], "lines": []}
    keyed, keyless = Writer(publisher, 12), LedgerWriter(publisher, 13)

    def low(event) -> None:
        seen["copied"].append((event.table, event.chunk))
        if event.table == "public.notes" and event.chunk == 0:  # the table after ledger's whole copy
            seen["between"].append(load_backends(publisher))
        keyed.burst(2)
        keyless.burst(2)  # inside the whole copy's snapshot too: the copy must not see these

    def read(event) -> None:
        if event.table == "public.ledger":
            loader = publisher.query("SELECT backend_xmin IS NULL, state FROM pg_stat_activity WHERE pid = %s",
                                     (event.pid,))[0]
            seen["whole_read"].append((loader, load_backends(publisher)))

    def staged(event) -> None:
        if event.table == "public.ledger":  # its snapshot ends with the copy: every session lets go
            wait_until(lambda: not load_backends(publisher), timeout=30, message="the whole copy's xmin to go")

    with Background(publisher, 14):
        run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=300,
                         hooks=ChunkHooks(low=low, read=read, staged=staged), report=seen["lines"].append)
    assert not (root / "p" / unfinished[0]).exists()  # removed, then the table copied again from scratch
    assert [n for n, *_ in committed_batches(root, "p")
            if read_manifest(root, "p", n).details.get(CHUNK_DETAILS, {}).get("table") == "public.items"] \
        == finished_items
    seen["finished_items"] = finished_items
    return seen


def assert_equal_to_source(publisher, root) -> None:
    state = replay(root, "p")
    assert table_rows(state, "public.items", ["id", "grp", "label"]) == sorted(
        publisher.query("SELECT id, grp, label FROM items"))
    assert table_rows(state, "public.notes", ["code", "body"]) == sorted(
        publisher.query("SELECT code, body FROM notes"))
    assert table_rows(state, "public.tokens", ["id", "v"]) == sorted(
        (str(i), v) for i, v in publisher.query("SELECT id, v FROM tokens"))
    assert multiset_rows(root, "p", "public.ledger", LEDGER) == Counter(
        publisher.query("SELECT account, amount, memo FROM ledger"))


def test_a_keyless_table_killed_in_its_whole_copy_resumes_and_equals_the_source(publisher, publisher_hook, root):
    seen = killed_and_resumed(publisher, publisher_hook, root)
    # no finished chunk of items was copied again; ledger again from scratch, then notes and tokens
    assert seen["copied"][0] == ("public.ledger", 0) and not [c for c in seen["copied"] if c[0] == "public.items"]
    assert ("public.tokens", 0) in seen["copied"] and seen["copied"][-1] == ("public.tokens", 0)
    # inside ledger's copy its snapshot is held (the temporary slot's walsender, the copy's sessions),
    # not by the loader's own session; between tables no session of the load holds an xmin
    ((loader, holders),) = seen["whole_read"]
    assert loader == (True, "idle") and holders, holders
    assert seen["between"] == [[]]
    # the log names the tables loaded whole and why, and says the xmin is held for that copy only
    line = next(m for m in seen["lines"] if m.startswith("resuming"))
    assert "public.ledger (no primary key or replica identity index (REPLICA IDENTITY FULL)" in line
    assert "public.tokens (its first key column 'id' has type uuid" in line and "not for the whole load" in line
    assert any("public.ledger: loading it whole in the exported snapshot of a temporary slot" in m
               and "xmin is held until this table's copy is staged" in m for m in seen["lines"])
    load = read_load(root, "p")
    assert load.complete and (load.tables["public.ledger"].chunks, load.tables["public.tokens"].chunks) == (1, 1)
    figures = staging_figures(root, PipelineRef(str(root), "p", publisher.conn_id, "s1"))["initial_load"]
    assert figures["tables_whole"] == 2 and "multiset" in figures["per_table"]["public.ledger"]["whole"]
    assert figures["per_table"]["public.items"]["whole"] is None
    # one batch per whole table, at its temporary slot's LSN, no range: the apply replaces the table there
    ledger = [read_manifest(root, "p", n) for n, *_ in committed_batches(root, "p")
              if read_manifest(root, "p", n).details.get(CHUNK_DETAILS, {}).get("table") == "public.ledger"]
    assert len(ledger) == 1 and ledger[0].details.get("key_range") is None
    assert ledger[0].start_lsn == ledger[0].details[CHUNK_DETAILS]["low"]
    Writer(publisher, 15).burst(20)
    LedgerWriter(publisher, 16).burst(20)
    _drain(publisher_hook, root)
    assert_equal_to_source(publisher, root)


@pytest.mark.one_server  # the load's logic, not the server's: once
def test_no_room_for_a_temporary_slot_is_refused_before_anything_changes(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE items(id int PRIMARY KEY); CREATE TABLE bag(v int); "
                      "ALTER TABLE bag REPLICA IDENTITY FULL; INSERT INTO bag VALUES (1), (1);")
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("bag")])
    free = publisher.query("SELECT current_setting('max_replication_slots')::int - count(*) "
                           "FROM pg_replication_slots")[0][0]
    fillers = [f"filler_{publisher.name}_{n}"[:63] for n in range(free - 1)]  # one slot left: the pipeline's
    try:
        for name in fillers:
            publisher.query("SELECT 1 FROM pg_create_physical_replication_slot(%s)", (name,))
        slots = sorted(publisher.query("SELECT slot_name FROM pg_replication_slots"))
        with pytest.raises(ChunkedLoadRefused) as refused:
            run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
        message = str(refused.value)
        assert "table(s) public.bag are loaded whole, each in the exported snapshot of a temporary" in message
        assert "needs 2 free replication slot(s)" in message and "1 slot(s)" in message
        assert "raise max_replication_slots" in message and message.endswith("Nothing was changed")
        assert sorted(publisher.query("SELECT slot_name FROM pg_replication_slots")) == slots  # no s1
        assert not (root / "p").exists()
    finally:
        for name in fillers:
            publisher.query("SELECT 1 FROM pg_drop_replication_slot(%s)", (name,))
    result = run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert result["tables"] == {"public.bag": 2, "public.items": 0}  # the duplicate kept: a multiset


@pytest.mark.one_server  # the load's logic, not the server's: once
def test_a_whole_table_committed_before_its_progress_record_is_not_copied_again(publisher, publisher_hook, root):
    publisher.execute(SOURCE + "CREATE TABLE ledger(account int, amount int, memo text); "
                      "ALTER TABLE ledger REPLICA IDENTITY FULL; INSERT INTO ledger VALUES (1, 1, 'a'), (1, 1, 'a');")
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("ledger"), PublishedTable("notes")])
    env = {**os.environ, "CONN": publisher.conn_id, "ROOT": str(root), "TABLE": "public.ledger", "AT": "staged"}
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_WHOLE_COPY], env=env, cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert not read_load(root, "p").tables["public.ledger"].done  # its batch is committed, the record is older
    copied: list = []
    lines: list[str] = []
    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=300,
                     hooks=ChunkHooks(low=lambda e: copied.append((e.table, e.chunk))), report=lines.append)
    assert copied[0] == ("public.notes", 0) and "public.ledger" not in {t for t, _ in copied}
    assert "(1 found committed after the last progress record)" in lines[0]
    ledger = read_load(root, "p").tables["public.ledger"]
    assert (ledger.done, ledger.chunks, ledger.rows) == (True, 1, 2) and "multiset" in ledger.whole
    _drain(publisher_hook, root)
    assert multiset_rows(root, "p", "public.ledger", LEDGER) == Counter({(1, 1, "a"): 2})


@pytest.mark.one_server
def test_a_table_whose_chunk_column_changed_between_attempts_is_loaded_whole(publisher, publisher_hook, root):
    """Its staged chunks are ranges of the old column: resuming them by the new one would leave rows
    out or in twice; a whole copy replaces them all (the staging still holds the old ranges)."""
    publisher.execute(SOURCE)
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("notes")])
    env = {**os.environ, "CONN": publisher.conn_id, "ROOT": str(root), "TABLE": "public.items", "CHUNK": "2"}
    proc = subprocess.run([sys.executable, "-c", KILLED_IN_WHOLE_COPY], env=env, cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    items = read_load(root, "p").tables["public.items"]
    assert (items.chunks, items.column, items.done) == (2, "id", False)
    publisher.execute("ALTER TABLE items DROP CONSTRAINT items_pkey, ADD PRIMARY KEY (grp, id)")
    lines: list[str] = []
    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=300,
                     report=lines.append)
    items = read_load(root, "p").tables["public.items"]
    why = "its chunk column changed from 'id' to 'grp' during the load"
    assert (items.done, items.chunks, items.whole, items.column) == (True, 3, why, None)
    assert any(m.startswith("public.items: loading it whole") and why in m for m in lines)
    assert table_rows(replay(root, "p"), "public.items", ["id", "grp", "label"]) == sorted(
        publisher.query("SELECT id, grp, label FROM items"))


@pytest.mark.one_server
def test_a_keyless_partitioned_table_published_through_its_root_is_loaded_whole(publisher, publisher_hook, root):
    publisher.execute(SOURCE + """
        CREATE TABLE moves(region int, amount int) PARTITION BY LIST (region);
        CREATE TABLE moves_a PARTITION OF moves FOR VALUES IN (1, 2);
        CREATE TABLE moves_b PARTITION OF moves FOR VALUES IN (3, 4);
        ALTER TABLE moves_a REPLICA IDENTITY FULL; ALTER TABLE moves_b REPLICA IDENTITY FULL;
        INSERT INTO moves SELECT 1 + g % 4, g % 3 FROM generate_series(1, 600) g;
    """)
    publisher_hook.create_publication("p", [PublishedTable("items"), PublishedTable("moves")],
                                      publish_via_partition_root=True)
    conn, rng = publisher.connect(), random.Random(5)

    def burst(event) -> None:  # duplicates inserted, one copy moved across partitions or deleted
        with conn.cursor() as cur:
            for _ in range(4):
                region, amount = rng.randint(1, 4), rng.randint(0, 2)
                cur.execute("INSERT INTO moves VALUES (%s, %s), (%s, %s)", (region, amount) * 2)
                one = "tableoid = 'moves_a'::regclass AND ctid = (SELECT ctid FROM moves_a WHERE amount = %s LIMIT 1)"
                cur.execute("UPDATE moves SET region = 3 WHERE " + one, (amount,))
                cur.execute("DELETE FROM moves_b WHERE ctid = (SELECT ctid FROM moves_b WHERE amount = %s LIMIT 1)",
                            (amount,))

    run_chunked_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", chunk_rows=500,
                     hooks=ChunkHooks(low=burst, read=burst))
    moves = read_load(root, "p").tables["public.moves"]
    assert moves.whole and "multiset" in moves.whole and moves.chunks == 1
    burst(None)
    _drain(publisher_hook, root)
    assert multiset_rows(root, "p", "public.moves", ["region", "amount"]) == Counter(
        publisher.query("SELECT region, amount FROM moves"))
