"""check_publisher: every problem reported at once, with its fix, and nothing changed."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.embedded.postgres import LocalPostgres
from airflow_provider_pglogical.exceptions import PublisherCheckError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook


def catalog_state(db) -> list:
    """What check_publisher must leave untouched."""
    return db.query(
        "SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_publication),"
        " (SELECT array_agg(relreplident ORDER BY oid) FROM pg_class WHERE relkind = 'r'),"
        " (SELECT count(*) FROM pg_index)"
    )


def problems_of(hook, publications, tables=()) -> list[str]:
    with pytest.raises(PublisherCheckError) as err:
        hook.check_publisher(publications, tables)
    return err.value.problems


def test_healthy_publisher_passes(publisher, publisher_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, region text);"
                      "CREATE PUBLICATION p FOR TABLE t (id, region) WHERE (id > 0)")
    publisher_hook.check_publisher(["p"], ["public.t"])


def test_server_settings_problems_are_reported_together(monkeypatch):
    """wal_level, exhausted slots and exhausted WAL senders, on a cluster configured wrongly."""
    with LocalPostgres(name="badconf", settings={"wal_level": "replica", "max_replication_slots": "1",
                                                  "max_wal_senders": "0"}) as bad:
        bad.execute("SELECT pg_create_physical_replication_slot('taken')")
        bad.execute("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t")
        monkeypatch.setenv("AIRFLOW_CONN_BADCONF", bad.connection_uri())
        before = bad.query("SELECT count(*) FROM pg_replication_slots")
        problems = problems_of(PgLogicalHook(postgres_conn_id="badconf"), ["p"])
        assert len(problems) == 3
        assert "wal_level is 'replica': set wal_level = logical" in problems[0]
        assert "all 1 replication slots are in use (max_replication_slots)" in problems[1]
        assert "all 0 WAL senders are busy (max_wal_senders): raise max_wal_senders" in problems[2]
        assert bad.query("SELECT count(*) FROM pg_replication_slots") == before


def test_role_without_replication(publisher, monkeypatch):
    publisher.execute("CREATE ROLE plain LOGIN PASSWORD 'plainpw'; CREATE TABLE t(id int PRIMARY KEY);"
                      "CREATE PUBLICATION p FOR TABLE t")
    try:
        cluster = publisher.cluster
        monkeypatch.setenv("AIRFLOW_CONN_PLAIN", f"postgres://plain:plainpw@{cluster.host}:{cluster.port}/{publisher.name}")
        (problem,) = problems_of(PgLogicalHook(postgres_conn_id="plain"), ["p"])
        assert "role 'plain' has neither REPLICATION nor SUPERUSER: ALTER ROLE plain WITH REPLICATION" in problem
    finally:
        publisher.execute("DROP OWNED BY plain; DROP ROLE plain")


def test_table_without_replica_identity(publisher, publisher_hook):
    publisher.execute("CREATE TABLE nokey(id int, v text); CREATE PUBLICATION p FOR TABLE nokey;"
                      "CREATE TABLE inserts_only(id int); CREATE PUBLICATION pi FOR TABLE inserts_only WITH (publish = 'insert')")
    before = catalog_state(publisher)
    (problem,) = problems_of(publisher_hook, ["p", "pi"])
    assert problem.startswith("table public.nokey in publication 'p' has no replica identity (REPLICA IDENTITY DEFAULT without a primary key)")
    assert "ALTER TABLE public.nokey REPLICA IDENTITY USING INDEX" in problem
    assert catalog_state(publisher) == before


def test_row_filter_outside_replica_identity_is_caught_before_the_update_fails(publisher, publisher_hook):
    import psycopg2

    publisher.execute("CREATE TABLE orders(id int PRIMARY KEY, region text, total numeric);"
                      "INSERT INTO orders VALUES (1, 'EU', 10);"
                      "CREATE PUBLICATION p FOR TABLE orders WHERE (region = 'EU')")
    before = catalog_state(publisher)
    (problem,) = problems_of(publisher_hook, ["p"])
    assert "the row filter of public.orders in publication 'p' uses column(s) region outside the replica identity" in problem
    assert "REPLICA IDENTITY USING INDEX" in problem
    assert catalog_state(publisher) == before
    # What PostgreSQL itself says, only later, at the application's UPDATE:
    with pytest.raises(psycopg2.Error, match="cannot update table"):
        publisher.execute("UPDATE orders SET total = 11")
    # The fix from the message works.
    publisher.execute("CREATE UNIQUE INDEX orders_id_region ON orders (id, region);"
                      "ALTER TABLE orders ALTER COLUMN region SET NOT NULL;"
                      "ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_id_region")
    publisher_hook.check_publisher(["p"])


def test_column_list_without_replica_identity_columns(publisher, publisher_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, a text, b text); CREATE PUBLICATION p FOR TABLE t (a, b);"
                      "CREATE TABLE f(id int, a text); ALTER TABLE f REPLICA IDENTITY FULL;"
                      "CREATE PUBLICATION pf FOR TABLE f (id)")
    problems = problems_of(publisher_hook, ["p", "pf"])
    assert len(problems) == 2
    assert "the column list of public.t in publication 'p' leaves out replica-identity column(s) id" in problems[0]
    assert "add id to the column list" in problems[0]
    assert "the column list of public.f in publication 'pf' leaves out replica-identity column(s) a" in problems[1]
    assert "REPLICA IDENTITY FULL makes every column part of the identity" in problems[1]


def test_missing_table_and_missing_publication(publisher, publisher_hook):
    problems = problems_of(publisher_hook, ["ghost"], ["public.nowhere"])
    assert problems == [
        "table public.nowhere does not exist on the publisher: create it or fix the name",
        "publication 'ghost' does not exist: create it (create_publication) or fix the name",
    ]
