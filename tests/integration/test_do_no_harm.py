"""Do no harm: bad or careless input fails with a clear error and changes nothing.

Each test asserts the message (object, problem, fix) and that the publisher's publications, slots
(plugin and LSNs), subscriptions and the staging files are exactly as before, and that the
application can still UPDATE and DELETE.
"""

from __future__ import annotations

import hashlib

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import (
    InvalidInputError,
    PipelineStateError,
    PublisherCheckError,
    SlotError,
)
from airflow_provider_pglogical.operators.publication import PgCreatePublicationOperator
from airflow_provider_pglogical.capture.backfill import run_backfill
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.staging.layout import read_manifest
from airflow_provider_pglogical.staging.batches import read_table
from tests.support.source_state import SourceState, assert_application_can_write

ORDERS = """
CREATE TABLE orders(id int PRIMARY KEY, region text NOT NULL, total numeric);
INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'EU' ELSE 'US' END, g FROM generate_series(1, 20) g;
CREATE TABLE victim(id int PRIMARY KEY); INSERT INTO victim VALUES (1);
CREATE TABLE keyless(a int, b text); INSERT INTO keyless VALUES (1, 'x'), (1, 'x');
"""


@pytest.fixture
def staging_dir(tmp_path):
    return tmp_path / "staging"


@pytest.fixture
def root(staging_dir):
    return ObjectStoragePath(staging_dir.as_uri())


def publication_task(publisher, **kwargs) -> PgCreatePublicationOperator:
    return PgCreatePublicationOperator(task_id="publication", postgres_conn_id=publisher.conn_id, **kwargs)


# -- publications: DDL and checks in one transaction ----------------------------------------------


@pytest.mark.parametrize("table, problem", [
    (PublishedTable("orders", where="region = 'EU'"), "uses column(s) region outside the replica identity"),
    (PublishedTable("keyless"), "has no replica identity"),
    (PublishedTable("orders", columns=["region", "total"]), "leaves out replica-identity column(s) id"),
])
def test_a_failed_check_leaves_no_publication_behind(publisher, staging_dir, table, problem):
    publisher.execute(ORDERS)
    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(PublisherCheckError) as raised:
        publication_task(publisher, publication="orders_pub", tables=[table]).execute({})
    message = str(raised.value)
    assert problem in message and "public." in message and "orders_pub" in message
    assert "was left exactly as it was" in message and "rolled back" in message
    assert SourceState.capture(publisher, staging_dir) == before
    assert publisher.query("SELECT count(*) FROM pg_publication")[0][0] == 0
    assert_application_can_write(publisher, "public.orders")


def test_rerunning_converges_the_publication_and_reports_what_changed(publisher, publisher_hook):
    publisher.execute(ORDERS)
    first = publication_task(publisher, publication="p", tables=[PublishedTable("orders", where="id > 5")]).execute({})
    assert first["created"] is True and first["tables"] == ["public.orders"]
    # A bad change to an existing publication is rolled back: the old definition stays whole.
    before = SourceState.capture(publisher)
    with pytest.raises(PublisherCheckError, match="outside the replica identity"):
        publication_task(publisher, publication="p", tables=[PublishedTable("orders", where="region = 'EU'")]).execute({})
    assert SourceState.capture(publisher) == before
    assert_application_can_write(publisher, "public.orders")
    # A corrected definition converges: other filter, another table, other operations.
    second = publication_task(
        publisher, publication="p", tables=[PublishedTable("orders", where="id > 10"), PublishedTable("victim")],
        publish=["insert", "update", "delete"],
    ).execute({})
    assert second["created"] is False
    assert second["changes"] == [
        "publish: insert, update, delete, truncate -> insert, update, delete",
        "table public.orders: \"public.orders\" WHERE (id > 5) -> \"public.orders\" WHERE (id > 10)",
        "added \"public.victim\"",
    ]
    info = publisher_hook.describe_publication("p")
    assert [t.psql_line() for t in info.tables] == ['"public.orders" WHERE (id > 10)', '"public.victim"']
    assert not info.truncates
    # As declared already: nothing changes, nothing is reported.
    third = publication_task(
        publisher, publication="p", tables=[PublishedTable("orders", where="id > 10"), PublishedTable("victim")],
        publish=["insert", "update", "delete"],
    ).execute({})
    assert (third["created"], third["changes"]) == (False, [])


@pytest.mark.parametrize("where", [
    "true); DROP TABLE public.victim; --",
    "id > 0; DROP TABLE public.victim",
    "id > 0) OR (true",
    "id > 0 ORDER BY 1",
    "id > 0 UNION SELECT",
    "",
])
def test_a_row_filter_is_exactly_one_expression(publisher, publisher_hook, where):
    publisher.execute(ORDERS)
    publisher_hook.create_publication("existing", [PublishedTable("orders")])
    before = SourceState.capture(publisher)
    for name in ("fresh", "existing"):
        with pytest.raises(InvalidInputError) as raised:
            publication_task(publisher, publication=name, tables=[PublishedTable("orders", where=where)]).execute({})
        message = str(raised.value)
        assert "row filter of public.orders" in message and "expression" in message
    assert SourceState.capture(publisher) == before
    assert publisher.query("SELECT count(*) FROM victim") == [(1,)]
    assert_application_can_write(publisher, "public.orders")


def test_a_row_filter_with_a_trailing_comment_still_works(publisher, publisher_hook):
    publisher.execute(ORDERS)
    publication_task(publisher, publication="p", tables=[PublishedTable("orders", where="id > 5 -- big ones")]).execute({})
    assert [t.row_filter for t in publisher_hook.describe_publication("p").tables] == ["(id > 5)"]


def test_names_longer_than_postgres_keeps_are_refused(publisher, publisher_hook, staging_dir, root):
    publisher.execute(ORDERS)
    long_name = "p" * 64
    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(InvalidInputError, match="64 bytes long: PostgreSQL truncates names to 63 bytes"):
        publication_task(publisher, publication=long_name, tables=["orders"]).execute({})
    with pytest.raises(InvalidInputError, match="publication name 'p{64}' is 64 bytes long"):
        run_initial_sync(publisher_hook, slot="s1", publications=[long_name], root=root, pipeline="p")
    with pytest.raises(InvalidInputError, match="slot name 'S-1' is not valid"):
        run_initial_sync(publisher_hook, slot="S-1", publications=["p"], root=root, pipeline="p")
    assert SourceState.capture(publisher, staging_dir) == before


# -- initial sync: a pipeline owns its slot ------------------------------------------------------


def test_a_failed_first_attempt_does_not_claim_the_slot_name(publisher, publisher_hook, staging_dir, root, monkeypatch):
    """The role lacks REPLICATION: nothing is created, and no record claims the slot's name."""
    publisher.execute(ORDERS)
    publisher_hook.create_publication("p", [PublishedTable("orders")])
    publisher.execute("CREATE ROLE weak LOGIN PASSWORD 'weak'; GRANT SELECT ON ALL TABLES IN SCHEMA public TO weak")
    cluster = publisher.cluster
    monkeypatch.setenv("AIRFLOW_CONN_WEAK", f"postgres://weak:weak@{cluster.host}:{cluster.port}/{publisher.name}")
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(PublisherCheckError, match="role 'weak' has neither REPLICATION nor SUPERUSER"):
        run_initial_sync(PgLogicalHook(postgres_conn_id="weak"), slot="s1", publications=["p"], root=root,
                         pipeline="p")
    assert SourceState.capture(publisher, staging_dir) == before
    # Another tool now takes the name; the next initial sync must leave its slot alone.
    publisher.query("SELECT pg_create_logical_replication_slot('s1', 'test_decoding')")
    other = SourceState.capture(publisher, staging_dir)
    with pytest.raises(SlotError) as raised:
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    message = str(raised.value)
    assert "pipeline 'p' did not create it" in message and "plugin test_decoding" in message
    assert "Choose another slot name" in message
    assert SourceState.capture(publisher, staging_dir) == other
    publisher.execute("DROP OWNED BY weak; DROP ROLE weak")


def test_a_recreated_slot_of_the_same_name_is_not_taken_over(publisher, publisher_hook, staging_dir, root,
                                                             monkeypatch):
    """The pipeline's slot was dropped and someone re-created one of that name with pgoutput."""
    publisher.execute(ORDERS)
    publisher_hook.create_publication("p", [PublishedTable("orders")])
    # An attempt that failed after creating its slot drops it again, keeping its record.
    with pytest.raises(InvalidInputError):
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", parallelism=0)
    from airflow_provider_pglogical.capture import initial_sync

    def failing_copy(*args, **kwargs):  # the copy fails after the slot exists (e.g. a lost connection)
        raise RuntimeError("copy failed")

    with monkeypatch.context() as patch:
        patch.setattr(initial_sync, "copy_tables", failing_copy)
        with pytest.raises(RuntimeError, match="copy failed"):
            run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert publisher_hook.get_slot("s1") is None, "a failed copy must drop the slot it created"
    publisher.execute("INSERT INTO orders VALUES (100, 'EU', 1)")
    publisher.query("SELECT pg_create_logical_replication_slot('s1', 'pgoutput')")
    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(SlotError, match="is not the one pipeline 'p' created"):
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert SourceState.capture(publisher, staging_dir) == before


# -- pulls: refuse what would lose changes ---------------------------------------------------------


def test_a_pull_refuses_another_publication_set(publisher, publisher_hook, staging_dir, root):
    publisher.execute(ORDERS)
    publisher_hook.create_publication("p", [PublishedTable("orders")])
    publisher_hook.create_publication("other", [PublishedTable("victim")])
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    publisher.execute("UPDATE orders SET total = 0 WHERE id = 1")
    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(PipelineStateError) as raised:
        run_pull(publisher_hook, slot="s1", publications=["other"], root=root, pipeline="p")
    message = str(raised.value)
    assert "snapshotted from publication(s) ['p']" in message and "added: ['other']" in message
    assert "left out: ['p']" in message and "the next pull snapshots them" in message
    with pytest.raises(PipelineStateError, match="consumes slot 's1', not 's2'"):
        run_pull(publisher_hook, slot="s2", publications=["p"], root=root, pipeline="p")
    with pytest.raises(PipelineStateError, match="publication\\(s\\) \\['p'\\], but this backfill"):
        run_backfill(publisher_hook, tables=["victim"], publications=["other"], root=root, pipeline="p")
    assert SourceState.capture(publisher, staging_dir) == before
    # The right arguments still get the change.
    assert run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")["changes"] == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"max_changes": 0}, "max_changes must be a whole number, 1 or more \\(got 0\\)"),
    ({"max_changes": -5}, "max_changes must be a whole number, 1 or more \\(got -5\\)"),
    ({"max_bytes": 0}, "max_bytes must be a whole number, 1 or more \\(got 0\\); leave it unset"),
    ({"pipeline": "../escape"}, "pipeline name '../escape' is not a plain directory name"),
    ({"pipeline": "/abs/olute"}, "pipeline name '/abs/olute' is not a plain directory name"),
    ({"root": "relative/staging"}, "staging path 'relative/staging' is not an absolute URI"),
    ({"publications": "p"}, "publications 'p' is not a non-empty list of names"),
])
def test_pull_arguments_are_checked_before_anything(publisher, publisher_hook, staging_dir, root, kwargs, message):
    publisher.execute(ORDERS)
    publisher_hook.create_publication("p", [PublishedTable("orders")])
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    publisher.execute("UPDATE orders SET total = 0 WHERE id = 1")
    arguments = {"slot": "s1", "publications": ["p"], "root": root, "pipeline": "p", **kwargs}
    if isinstance(arguments["root"], str):
        arguments["root"] = ObjectStoragePath(arguments["root"])
    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(InvalidInputError, match=message):
        run_pull(publisher_hook, **arguments)
    assert SourceState.capture(publisher, staging_dir) == before
    assert not (staging_dir.parent / "escape").exists() and not (staging_dir / "relative").exists()


def test_the_operators_check_templated_values(publisher, staging_dir):
    from airflow_provider_pglogical.operators.pull import PgSlotPullOperator

    for staging_path, problem in [("staging", "is not an absolute URI"), ("file://rel/x", "is not an absolute URI"),
                                  ("file:///data/../x", "no '..'")]:
        task = PgSlotPullOperator(task_id="pull", slot="s1", publications=["p"], staging_root=staging_path,
                                  pipeline="p", postgres_conn_id=publisher.conn_id)
        with pytest.raises(InvalidInputError, match=problem):
            task.execute({})
    task = PgSlotPullOperator(task_id="pull", slot="s1", publications=["p"], staging_root=staging_dir.as_uri(),
                              pipeline="p", max_changes="-1", postgres_conn_id=publisher.conn_id)
    with pytest.raises(InvalidInputError, match="max_changes must be a whole number, 1 or more \\(got '-1'\\)"):
        task.execute({})


def test_a_second_run_waits_boundedly_then_names_the_holder(publisher, publisher_hook, staging_dir, root):
    from airflow_provider_pglogical.exceptions import ConcurrentRunError
    from airflow_provider_pglogical.management.consumer_lock import slot_consumer_lock

    publisher.execute(ORDERS)
    publisher_hook.create_publication("p", [PublishedTable("orders")])
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    publisher.execute("UPDATE orders SET total = 0 WHERE id = 1")
    before = SourceState.capture(publisher, staging_dir)
    with slot_consumer_lock(publisher_hook.connect_kwargs(), "s1", "pull"):
        with pytest.raises(ConcurrentRunError) as raised:
            run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p", lock_wait_seconds=0.2)
        message = str(raised.value)
        assert "slot 's1' is being consumed by another run" in message and "pglogical pull of slot s1" in message
        assert "waited 0.2s and changed nothing" in message and "max_active_runs=1" in message
        with pytest.raises(ConcurrentRunError):
            run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p",
                             lock_wait_seconds=0.2)
    assert SourceState.capture(publisher, staging_dir) == before
    assert run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")["changes"] == 1


def test_wal_level_replica_is_named_not_a_missing_slot(tmp_path, monkeypatch):
    from airflow_provider_pglogical.embedded.postgres import LocalPostgres
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    with LocalPostgres(name="replica-wal", settings={"wal_level": "replica"}) as cluster:
        cluster.execute("CREATE TABLE t(id int PRIMARY KEY); INSERT INTO t VALUES (1); CREATE PUBLICATION p FOR TABLE t")
        monkeypatch.setenv("AIRFLOW_CONN_REPLICA_WAL", cluster.connection_uri("postgres"))
        hook = PgLogicalHook(postgres_conn_id="replica_wal")
        root = ObjectStoragePath((tmp_path / "staging").as_uri())
        with pytest.raises(PublisherCheckError, match="wal_level is 'replica': set wal_level = logical"):
            run_initial_sync(hook, slot="s1", publications=["p"], root=root, pipeline="p")
        with pytest.raises(SlotError, match="runs with wal_level = replica, so no logical slot can exist"):
            run_pull(hook, slot="s1", publications=["p"], root=root, pipeline="p")
        assert cluster.query("SELECT count(*) FROM pg_replication_slots") == [(0,)]
        assert not (tmp_path / "staging").exists()


TOAST_ORDERS = """
CREATE TABLE orders(id int NOT NULL, region text NOT NULL, n int, note text);
CREATE UNIQUE INDEX orders_id_region ON orders(id, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_id_region;
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
INSERT INTO orders SELECT g, 'US', 0, repeat(md5(g::text), 100) FROM generate_series(1, 4) g;
INSERT INTO orders VALUES (100, 'EU', 0, 'small');
"""


@pytest.mark.parametrize("then, filled", [
    ("ALTER TABLE orders RENAME TO orders_renamed", 3),  # the fetch follows the table's OID
    ("DROP TABLE orders", 0),  # nothing to fetch from: the batch goes on, and says so
])
def test_a_renamed_or_dropped_table_does_not_block_the_pull(publisher, publisher_hook, root, then, filled):
    """Rows enter the row filter with unchanged TOAST values; then the table goes away."""
    publisher.execute(TOAST_ORDERS)
    publisher_hook.create_publication("p", [PublishedTable("orders", where="region = 'EU'")])
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    publisher.execute("UPDATE orders SET region = 'EU', n = 1 WHERE id <= 3")
    publisher.execute(then)
    result = run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert result["changes"] == 3
    manifest = read_manifest(root, "p", result["batch"].rsplit("/", 1)[1])
    fetch = manifest.tables["public.orders"].details["toast_fetch"]
    assert (fetch["rows"], fetch["filled"], fetch["missing"]) == (3, filled, 3 - filled)
    notes = read_table(root, "p", manifest.name, manifest.tables["public.orders"]).to_pydict()
    expected = [hashlib.md5(str(i).encode()).hexdigest() * 100 for i in (1, 2, 3)]
    assert sorted(notes["note"], key=str) == (expected if filled else [None] * 3)
    if not filled:
        assert "dropped" in fetch["unavailable"]
    # The slot moved on: the next pull does not trip over the same rows again.
    assert run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")["changes"] == 0


def test_columns_the_lakehouse_keeps_for_itself_are_refused_before_a_slot_exists(publisher, publisher_hook,
                                                                                 staging_dir, root):
    from airflow_provider_pglogical.exceptions import PublicationError

    publisher.execute('CREATE TABLE t(a int, "_pglogical_occurrence" int); CREATE TABLE u(a int, "__op" text); '
                      "ALTER TABLE t REPLICA IDENTITY FULL; ALTER TABLE u REPLICA IDENTITY FULL; "
                      "INSERT INTO t VALUES (1, 2); INSERT INTO u VALUES (1, 'x')")
    publisher_hook.create_publication("p", [PublishedTable("t")])
    publisher_hook.create_publication("q", [PublishedTable("u")])
    before = SourceState.capture(publisher, staging_dir)
    # a name the provider reserves for a metadata column: refused by the table-identity check
    with pytest.raises(PublicationError) as raised:
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    message = str(raised.value)
    assert "column '_pglogical_occurrence' has a name Iceberg or this provider reserves" in message
    assert "RENAME COLUMN" in message and "Nothing was changed" in message
    assert SourceState.capture(publisher, staging_dir) == before
    # a name the staged change files keep for themselves: refused by the publisher check
    with pytest.raises(PublisherCheckError) as raised:
        run_initial_sync(publisher_hook, slot="s1", publications=["q"], root=root, pipeline="q")
    message = str(raised.value)
    assert "column '__op' of public.u" in message and "RENAME COLUMN" in message
    assert SourceState.capture(publisher, staging_dir) == before


def test_a_table_without_columns_is_refused_before_a_slot_exists(publisher, publisher_hook, staging_dir, root):
    publisher.execute("CREATE TABLE nothing(); INSERT INTO nothing DEFAULT VALUES; CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("p", [PublishedTable("t"), PublishedTable("nothing")])
    before = SourceState.capture(publisher, staging_dir)
    with pytest.raises(PublisherCheckError) as raised:
        run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    assert ("table public.nothing is published (publication p) with no columns: a lakehouse table needs at "
            "least one column, so its rows could not be applied. Add a column (ALTER TABLE public.nothing ADD "
            "COLUMN ...), or remove the table from the publication (ALTER PUBLICATION p DROP TABLE "
            "public.nothing)") in str(raised.value)
    assert SourceState.capture(publisher, staging_dir) == before
