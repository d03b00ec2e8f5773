"""Initial sync: staged snapshots hold exactly what PostgreSQL's own subscriber copies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import ColumnListConflict, PipelineStateError, PublicationError, SlotError
from airflow_provider_pglogical.capture import snapshot
from airflow_provider_pglogical.capture.backfill import KeyRange, run_backfill
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.staging import batches
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from tests.integration.sync_helpers import native_rows, staged_rows


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath(f"file://{tmp_path}/staging")


@pytest.fixture(autouse=True)
def small_work_units(monkeypatch):
    # Split even small test tables into several ctid ranges, so the parallel path runs.
    monkeypatch.setattr(snapshot, "MIN_BLOCKS_PER_UNIT", 2)


ROW_FILTER_TABLES = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
"""
ROW_FILTER_DATA = """
INSERT INTO t1 SELECT g, 100 + g, (ARRAY['NSW','QLD','VIC','ACT','NT'])[1 + g % 5] FROM generate_series(1, 3000) g;
INSERT INTO t2 SELECT g, g % 100, g FROM generate_series(1, 3000) g;
INSERT INTO t3 SELECT g, g, g FROM generate_series(1, 3000) g;
"""


@pytest.mark.parametrize("publications", [["p1"], ["p2"], ["p3"], ["p1", "p2", "p3"], ["p2", "p3"]])
def test_row_filter_publications_match_the_native_subscriber(
    publisher, subscriber, publisher_hook, subscriber_hook, root, publications
):
    publisher.execute(ROW_FILTER_TABLES + ROW_FILTER_DATA)
    subscriber.execute(ROW_FILTER_TABLES)
    publisher_hook.create_publication("p1", [PublishedTable("t1", where="a > 5 AND c = 'NSW'")])
    publisher_hook.create_publication("p2", [PublishedTable("t1"), PublishedTable("t2", where="e = 99")])
    publisher_hook.create_publication("p3", [PublishedTable("t2", where="d = 10"), PublishedTable("t3", where="g = 10")])
    result = run_initial_sync(publisher_hook, slot="s_ours", publications=publications, root=root, pipeline="p")
    tables = sorted(name.split(".")[1] for name in result["tables"])
    expected = native_rows(subscriber_hook, subscriber, publisher, "s_native", publications, tables)
    assert staged_rows(root, "p") == expected
    assert all(rows for rows in expected.values())


def test_column_list_matches_the_native_subscriber(publisher, subscriber, publisher_hook, subscriber_hook, root):
    publisher.execute("CREATE TABLE t1(id int, a text, b text, c text, d text, e text, PRIMARY KEY(id));"
                      "INSERT INTO t1 SELECT g, 'a-'||g, 'b-'||g, 'c-'||g, 'd-'||g, 'e-'||g FROM generate_series(1, 2000) g")
    subscriber.execute("CREATE TABLE t1(id int, a text, b text, d text, PRIMARY KEY(id))")
    publisher_hook.create_publication("p1", [PublishedTable("t1", columns=["id", "b", "a", "d"])])
    run_initial_sync(publisher_hook, slot="s_ours", publications=["p1"], root=root, pipeline="p")
    expected = native_rows(subscriber_hook, subscriber, publisher, "s_native", ["p1"], ["t1"])
    assert staged_rows(root, "p") == expected
    manifest = read_manifest(root, "p", committed_batches(root, "p")[0][0])
    assert [c.name for c in manifest.tables["public.t1"].columns] == ["id", "a", "b", "d"]
    assert manifest.tables["public.t1"].key == ["id"]


@pytest.mark.parametrize("via_root", [True, False])
def test_partitioned_example_matches_the_native_subscriber(
    publisher, subscriber, publisher_hook, subscriber_hook, root, via_root
):
    ddl = "CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a); CREATE TABLE child PARTITION OF parent DEFAULT;"
    publisher.execute(ddl + "INSERT INTO parent SELECT generate_series(1, 3000)")
    subscriber.execute(ddl)
    if via_root:
        tables = [PublishedTable("parent", where="a < 5"), PublishedTable("child", where="a >= 5")]
    else:
        tables = [PublishedTable("parent"), PublishedTable("child", where="a >= 5")]
    publisher_hook.create_publication("p4", tables, publish_via_partition_root=via_root)
    result = run_initial_sync(publisher_hook, slot="s_ours", publications=["p4"], root=root, pipeline="p")
    staged_table = "parent" if via_root else "child"
    assert list(result["tables"]) == [f"public.{staged_table}"]
    expected = native_rows(subscriber_hook, subscriber, publisher, "s_native", ["p4"], [staged_table])
    assert staged_rows(root, "p") == expected
    assert len(expected[staged_table]) == (4 if via_root else 2996)


def test_clear_errors_before_any_slot_is_created(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, a text, b text)")
    publisher_hook.create_publication("empty")
    publisher_hook.create_publication("pa", [PublishedTable("t", columns=["id", "a"])])
    publisher_hook.create_publication("pb", [PublishedTable("t", columns=["id", "b"])])
    with pytest.raises(PublicationError, match="publication\\(s\\) nope do not exist"):
        run_initial_sync(publisher_hook, slot="s1", publications=["nope"], root=root, pipeline="p")
    with pytest.raises(PublicationError, match="publish no tables"):
        run_initial_sync(publisher_hook, slot="s1", publications=["empty"], root=root, pipeline="p")
    with pytest.raises(ColumnListConflict, match="different column lists"):
        run_initial_sync(publisher_hook, slot="s1", publications=["pa", "pb"], root=root, pipeline="p")
    assert publisher_hook.get_slot("s1") is None
    # A slot in use by an active consumer.
    with publisher_hook.exported_snapshot("busy"):
        pass
    import psycopg2.extras

    consumer = psycopg2.connect(publisher.conninfo, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        consumer.cursor().start_replication(slot_name="busy", decode=False,
                                            options={"proto_version": "1", "publication_names": "pa"})
        from airflow_provider_pglogical.embedded.postgres import wait_until

        wait_until(lambda: publisher_hook.get_slot("busy").active, message="busy slot to be active")
        with pytest.raises(SlotError, match="in use by an active consumer"):
            run_initial_sync(publisher_hook, slot="busy", publications=["pa"], root=root, pipeline="p")
    finally:
        consumer.close()
    # A slot some other party created is not taken over.
    publisher_hook.create_slot("foreign")
    with pytest.raises(SlotError, match="pipeline 'p' did not create it"):
        run_initial_sync(publisher_hook, slot="foreign", publications=["pa"], root=root, pipeline="p")
    assert committed_batches(root, "p") == []


def test_copy_killed_mid_way_then_rerun_gives_a_complete_batch(publisher, publisher_hook, root, tmp_path):
    publisher.execute("CREATE TABLE big(id int PRIMARY KEY, pad text);"
                      "INSERT INTO big SELECT g, repeat(md5(g::text), 8) FROM generate_series(1, 400000) g")
    publisher_hook.create_publication("p", [PublishedTable("big")])
    script = textwrap.dedent(f"""
        import os, signal
        from airflow.sdk import ObjectStoragePath
        from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
        from airflow_provider_pglogical.capture import snapshot
        from airflow_provider_pglogical.capture import initial_sync
        from airflow_provider_pglogical.staging import batches
        snapshot.MIN_BLOCKS_PER_UNIT = 2
        snapshot.CSV_BLOCK_SIZE = 1 << 16
        counted = batches.BatchWriter._count
        def count_then_die(self, *args):  # the first Parquet part is complete: SIGKILL
            counted(self, *args)
            os.kill(os.getpid(), signal.SIGKILL)
        batches.BatchWriter._count = count_then_die
        initial_sync.run_initial_sync(PgLogicalHook(postgres_conn_id="{publisher.conn_id}"), slot="s1",
            publications=["p"], root=ObjectStoragePath("{root}"), pipeline="p", parallelism=2)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env={**os.environ}, timeout=300)
    assert proc.returncode == -signal.SIGKILL
    staging = tmp_path / "staging" / "p"
    assert list(staging.glob("*/*.parquet")), "killed after its first Parquet part"
    assert committed_batches(root, "p") == []
    # The pipeline has a slot but no committed snapshot: a pull must not consume the slot.
    slot_before = publisher_hook.get_slot("s1")
    publisher.execute("INSERT INTO big VALUES (0, 'during the failed sync')")
    with pytest.raises(PipelineStateError, match="pipeline 'p' has no committed initial snapshot .*its initial "
                                                 "sync has not finished"):
        run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    after = publisher_hook.get_slot("s1")
    assert (after.confirmed_flush_lsn, after.restart_lsn) == (slot_before.confirmed_flush_lsn, slot_before.restart_lsn)
    publisher.execute("DELETE FROM big WHERE id = 0")
    result = run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert result["tables"] == {"public.big": 400000}
    ids = [row[0] for row in staged_rows(root, "p")["big"]]
    assert ids == list(range(1, 400001))
    assert publisher_hook.get_slot("s1").confirmed_flush_lsn.__str__() == result["lsn"]


def test_an_error_in_one_copy_worker_fails_the_sync_promptly_then_a_rerun_is_exact(
        publisher, publisher_hook, root, tmp_path, monkeypatch):
    publisher.execute("CREATE TABLE w1(id int PRIMARY KEY, pad text); CREATE TABLE w2(id int PRIMARY KEY, v text);"
                      "INSERT INTO w1 SELECT g, repeat(md5(g::text), 4) FROM generate_series(1, 20000) g;"
                      "INSERT INTO w2 SELECT g, g::text FROM generate_series(1, 5000) g")
    publisher_hook.create_publication("p", [PublishedTable("w1"), PublishedTable("w2")])
    monkeypatch.setattr(snapshot, "CSV_BLOCK_SIZE", 1 << 16)
    counted = batches.BatchWriter._count
    calls = []

    def count_then_fail(self, *args):  # the worker's first Parquet part closes, then its bookkeeping fails
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure in a copy worker")
        counted(self, *args)

    monkeypatch.setattr(batches.BatchWriter, "_count", count_then_fail)
    outcome: dict = {}

    def sync() -> None:
        try:
            run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", parallelism=2)
        except BaseException as err:  # noqa: BLE001 - asserted below
            outcome["error"] = err

    runner = threading.Thread(target=sync, daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "the initial sync hung after a copy worker failed"
    assert isinstance(outcome.get("error"), RuntimeError) and "injected failure" in str(outcome["error"])
    assert publisher_hook.get_slot("s1") is None, "the failed sync drops the slot it created"
    assert committed_batches(root, "p") == []
    assert not list((tmp_path / "staging" / "p").glob("*/*.parquet")), "the failed batch leaves no files"
    monkeypatch.setattr(batches.BatchWriter, "_count", counted)
    result = run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", parallelism=2)
    assert result["tables"] == {"public.w1": 20000, "public.w2": 5000}
    staged = staged_rows(root, "p")
    assert staged == {t: sorted(publisher.query(f"SELECT * FROM {t}")) for t in ("w1", "w2")}


def test_backfill_of_one_table_and_a_key_range(publisher, publisher_hook, root):
    publisher.execute("CREATE TABLE a(id int PRIMARY KEY, v text); CREATE TABLE b(id int PRIMARY KEY);"
                      "INSERT INTO a SELECT g, 'v'||g FROM generate_series(1, 100) g; INSERT INTO b VALUES (1)")
    publisher_hook.create_publication("p", [PublishedTable("a", where="id <= 50"), PublishedTable("b")])
    first = run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    publisher.execute("UPDATE a SET v = 'new' WHERE id = 10")
    full = run_backfill(publisher_hook, tables=["a"], publications=["p"], root=root, pipeline="p")
    assert list(full["tables"]) == ["public.a"] and full["tables"]["public.a"] == 50
    assert Lsn.parse(full["lsn"]) > Lsn.parse(first["lsn"])
    assert (10, "new") in staged_rows(root, "p")["a"]
    ranged = run_backfill(publisher_hook, tables=["public.a"], publications=["p"], root=root, pipeline="p",
                          key_range=KeyRange("id", 10, 20))
    assert [r[0] for r in staged_rows(root, "p")["a"]] == list(range(10, 20))
    manifest = read_manifest(root, "p", committed_batches(root, "p")[-1][0])
    assert manifest.details["key_range"] == {"column": "id", "start": 10, "end": 20}
    assert ranged["tables"] == {"public.a": 10}
    with pytest.raises(PublicationError, match="not published"):
        run_backfill(publisher_hook, tables=["c"], publications=["p"], root=root, pipeline="p")
    # Backfills use temporary slots: only the pipeline's own slot remains.
    assert [s.name for s in publisher_hook.list_slots() if s.database == publisher.name] == ["s1"]


@pytest.mark.one_server  # needs an ICU collation: the wheels' servers (16, 18) are built without ICU
def test_a_key_range_is_selected_in_the_lakehouse_order_or_refused(publisher, publisher_hook, root, tmp_path):
    """The copy selects a range with PostgreSQL's comparison and the apply replaces it with Spark's:
    text is compared in byte order on both sides (a column with a linguistic collation would put
    'a' between 'B' and 'c' in PostgreSQL and after both in Spark, and the rows at the edges would
    be lost); a column whose order differs (jsonb, uuid, unconstrained numeric, an overridden
    one) is refused before anything is created."""
    from tests.support.source_state import SourceState

    (icu,) = publisher.query("SELECT collname FROM pg_collation WHERE collprovider = 'i' AND collname = 'und-x-icu'")[0]
    publisher.execute(f'CREATE TABLE w(k text COLLATE "{icu}" PRIMARY KEY, j jsonb, n numeric, t timestamp);'
                      "INSERT INTO w VALUES ('a', '{}', 1, now()), ('B', '{}', 2, now()), ('c', '{}', 3, now()),"
                      " ('D', '{}', 4, now())")
    publisher_hook.create_publication("p", [PublishedTable("w")])
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert [r[0] for r in publisher.query("SELECT k FROM w WHERE k >= 'B' AND k < 'c' ORDER BY k")] == ["B"]
    run_backfill(publisher_hook, tables=["w"], publications=["p"], root=root, pipeline="p",
                 key_range=KeyRange("k", "B", "c"))
    assert sorted(r[0] for r in staged_rows(root, "p")["w"]) == ["B", "D", "a"]  # 'B' <= k < 'c' in byte order

    before = SourceState.capture(publisher, tmp_path / "staging")
    for column, shown in (("j", "jsonb"), ("n", "numeric")):
        with pytest.raises(PublicationError, match=f"key range column '{column}' of public.w has type {shown}, which "
                                                   "PostgreSQL and the lakehouse order differently"):
            run_backfill(publisher_hook, tables=["w"], publications=["p"], root=root, pipeline="p",
                         key_range=KeyRange(column, 1, 2))
    with pytest.raises(PublicationError, match=r"staged as text by type_overrides.*Nothing was changed"):
        run_backfill(publisher_hook, tables=["w"], publications=["p"], root=root, pipeline="p",
                     key_range=KeyRange("t", "2020-01-01", None), type_overrides={"public.w.t": "string"})
    assert SourceState.capture(publisher, tmp_path / "staging") == before


def test_text_values_with_escapes_arrive_exactly(publisher, publisher_hook, root):
    """COPY text format escapes tabs, newlines and backslashes inside values; the staged values
    must equal the source's, for text, bytea, arrays and json alike (and the literal text \\N is
    not NULL)."""
    publisher.execute(r"""
        CREATE TABLE tricky(id int PRIMARY KEY, t text, b bytea, a text[], j jsonb, v varchar(20));
        INSERT INTO tricky VALUES
          (1, E'tab\there\nnew line\r\\back\\slash', E'\\x00095c0a'::bytea, ARRAY[E'a\tb', E'c\\d', 'x"y', NULL],
           '{"k": "line\nbreak \\\\ slash"}', E'\\N'),
          (2, '', NULL, '{}', 'null', NULL),
          (3, E'\\N', '\x'::bytea, ARRAY['plain'], '[1, 2]', E'\b\f\v'),
          (4, NULL, NULL, NULL, NULL, 'ünïcødé ✓');
        CREATE PUBLICATION pub FOR TABLE tricky;
    """)
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    staged = staged_rows(root, "p")["tricky"]
    source = publisher.query("SELECT id, t, b, a, j::text, v FROM tricky ORDER BY id")
    expected = [(i, t, bytes(b) if b is not None else None, a, j, v) for i, t, b, a, j, v in source]
    got = [(i, t, b, a, j, v) for i, t, b, a, j, v in staged]
    assert [r[:4] + r[5:] for r in got] == [r[:4] + r[5:] for r in expected]
    import json
    assert [json.loads(r[4]) if r[4] is not None else None for r in got] == [
        json.loads(r[4]) if r[4] is not None else None for r in expected]
    assert got[0][1] == "tab\there\nnew line\r\\back\\slash" and got[0][5] == "\\N" and got[2][1] == "\\N"


def test_a_workload_during_the_copy_is_neither_lost_nor_doubled(publisher, publisher_hook, root, monkeypatch):
    """Writers keep committing while the snapshot copies (each work unit waits for them, so they overlap):
    the snapshot plus the following change batch replay to exactly the source's rows."""
    import threading

    from airflow_provider_pglogical.capture.pull import run_pull
    from tests.integration.replay import replay, table_rows

    publisher.execute(
        "CREATE TABLE busy(id int NOT NULL, v int, region text NOT NULL);"
        "CREATE UNIQUE INDEX busy_key ON busy(id, region); ALTER TABLE busy REPLICA IDENTITY USING INDEX busy_key;"
        "INSERT INTO busy SELECT g, 0, CASE WHEN g % 3 = 0 THEN 'US' ELSE 'EU' END FROM generate_series(1, 20000) g;"
        "CREATE PUBLICATION pub FOR TABLE busy WHERE (region = 'EU')"
    )
    copying, stop, written = threading.Event(), threading.Event(), threading.Condition()
    real_copy_unit = snapshot._copy_unit

    def slow_copy_unit(*args, **kwargs):
        copying.set()
        with written:  # every work unit starts only after the writers committed 10 more statements
            seen = len(statements)
            assert written.wait_for(lambda: len(statements) >= seen + 10 or errors, timeout=30)
        return real_copy_unit(*args, **kwargs)

    monkeypatch.setattr(snapshot, "_copy_unit", slow_copy_unit)
    statements: list[str] = []
    errors: list[BaseException] = []

    def writer() -> None:
        copying.wait(30)
        conn = publisher.connect()
        try:
            with conn.cursor() as cur:
                write(cur)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            with written:
                errors.append(err)
                written.notify_all()
        finally:
            conn.close()

    def write(cur) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            statement = [
                f"UPDATE busy SET v = v + 1 WHERE id = {1 + i * 37 % 20000}",
                f"INSERT INTO busy VALUES ({20000 + i}, {i}, 'EU')",
                f"DELETE FROM busy WHERE id = {1 + i * 53 % 20000}",
                f"UPDATE busy SET region = 'US' WHERE id = {1 + i * 71 % 20000}",  # leaves the filter
                f"UPDATE busy SET region = 'EU' WHERE id = {1 + i * 89 % 20000}",  # may enter it
            ][i % 5]
            cur.execute(statement)
            with written:
                statements.append(statement)
                written.notify_all()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p", parallelism=2)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert len(statements) > 20, "the writers did not overlap the copy"
    run_pull(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    lake = table_rows(replay(root, "p"), "public.busy", ["id", "v", "region"])
    assert lake == sorted(publisher.query("SELECT id, v, region FROM busy WHERE region = 'EU'"))


SCHEMA_TABLES = """
CREATE SCHEMA sales;
CREATE TABLE sales.orders(id int PRIMARY KEY, region text, total numeric(10,2));
CREATE TABLE sales.lines(order_id int, line int, sku text, PRIMARY KEY(order_id, line));
CREATE TABLE other(id int PRIMARY KEY, note text);
"""


@pytest.mark.parametrize(("publications", "tables", "orders"), [
    (["by_schema"], ["sales.lines", "sales.orders"], 3000),
    (["everything"], ["public.other", "sales.lines", "sales.orders"], 3000),
    # A schema publication beside a filtered one publishes every row (filters are OR-ed; none is all).
    (["filtered", "by_schema"], ["sales.lines", "sales.orders"], 3000),
    (["filtered"], ["sales.orders"], 1000),
])
def test_all_tables_and_schema_publications_match_the_native_subscriber(
    publisher, subscriber, publisher_hook, subscriber_hook, root, publications, tables, orders
):
    publisher.execute(
        SCHEMA_TABLES
        + "INSERT INTO sales.orders SELECT g, (ARRAY['EU','US','APAC'])[1 + g % 3], g / 7.0 FROM generate_series(1, 3000) g;"
        "INSERT INTO sales.lines SELECT g / 3, g % 3, 'sku-' || g FROM generate_series(3, 6000) g;"
        "INSERT INTO other SELECT g, 'n' || g FROM generate_series(1, 2000) g"
    )
    subscriber.execute(SCHEMA_TABLES)
    publisher_hook.create_publication("filtered", [PublishedTable("sales.orders", where="region = 'EU'")])
    publisher_hook.create_publication("by_schema", schemas=["sales"])
    publisher_hook.create_publication("everything", all_tables=True)
    result = run_initial_sync(publisher_hook, slot="s_ours", publications=publications, root=root, pipeline="p")
    assert sorted(result["tables"]) == tables
    expected = native_rows(subscriber_hook, subscriber, publisher, "s_native", publications, tables)
    assert staged_rows(root, "p") == {name.split(".", 1)[1]: rows for name, rows in expected.items()}
    assert len(expected["sales.orders"]) == orders
