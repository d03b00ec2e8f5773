"""Subscriptions, reproduced from the PostgreSQL 15 logical replication chapter's examples."""

from __future__ import annotations

import re

import pytest

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.management.publications import PublishedTable

TABLES = """
CREATE TABLE t1(a int, b text, PRIMARY KEY(a));
CREATE TABLE t2(c int, d text, PRIMARY KEY(c));
CREATE TABLE t3(e int, f text, PRIMARY KEY(e));
"""


def rows(db, table):
    return db.query(f"SELECT * FROM {table} ORDER BY 1")


def wait_ready(hook, name):
    wait_until(lambda: (s := hook.subscription_status(name)) is not None and s.ready, timeout=60,
               message=f"subscription {name} to be ready")


def wait_rows(db, table, expected):
    wait_until(lambda: rows(db, table) == expected, timeout=30, message=f"{table} to hold {expected}")


def test_sub1_sub2_sub3_example(publisher, subscriber, publisher_hook, subscriber_hook):
    publisher.execute(TABLES)
    subscriber.execute(TABLES)
    publisher.execute(
        "INSERT INTO t1 VALUES (1, 'one'), (2, 'two'), (3, 'three');"
        "INSERT INTO t2 VALUES (1, 'A'), (2, 'B'), (3, 'C');"
        "INSERT INTO t3 VALUES (1, 'i'), (2, 'ii'), (3, 'iii');"
    )
    publisher_hook.create_publication("pub1", [PublishedTable("t1")])
    publisher_hook.create_publication("pub2", [PublishedTable("t2")], publish=["truncate"])
    publisher_hook.create_publication("pub3a", [PublishedTable("t3")], publish=["truncate"])
    publisher_hook.create_publication("pub3b", [PublishedTable("t3", where="e > 5")])
    for name, pubs in (("sub1", ["pub1"]), ("sub2", ["pub2"]), ("sub3", ["pub3a", "pub3b"])):
        assert subscriber_hook.create_subscription(name, pubs, publisher_conn_id=publisher.conn_id)
        assert not subscriber_hook.create_subscription(name, pubs, publisher_conn_id=publisher.conn_id)
    for name in ("sub1", "sub2", "sub3"):
        wait_ready(subscriber_hook, name)

    # Initial data is copied regardless of the publish operations, and pub3a has no filter.
    assert rows(subscriber, "t1") == [(1, "one"), (2, "two"), (3, "three")]
    assert rows(subscriber, "t2") == [(1, "A"), (2, "B"), (3, "C")]
    assert rows(subscriber, "t3") == [(1, "i"), (2, "ii"), (3, "iii")]

    publisher.execute(
        "INSERT INTO t1 VALUES (4, 'four'), (5, 'five'), (6, 'six');"
        "INSERT INTO t2 VALUES (4, 'D'), (5, 'E'), (6, 'F');"
        "INSERT INTO t3 VALUES (4, 'iv'), (5, 'v'), (6, 'vi');"
    )
    wait_rows(subscriber, "t1", [(1, "one"), (2, "two"), (3, "three"), (4, "four"), (5, "five"), (6, "six")])
    wait_rows(subscriber, "t3", [(1, "i"), (2, "ii"), (3, "iii"), (6, "vi")])
    assert rows(subscriber, "t2") == [(1, "A"), (2, "B"), (3, "C")]

    status = subscriber_hook.subscription_status("sub3")
    assert status.enabled and status.slot_name == "sub3" and status.publications == ["pub3a", "pub3b"]
    assert status.worker_pid and status.received_lsn is not None
    assert [(t.table, t.state) for t in status.tables] == [("public.t3", "r")]
    assert (status.apply_error_count, status.sync_error_count) == (0, 0)


def test_refresh_after_alter_publication_add_table(publisher, subscriber, publisher_hook, subscriber_hook):
    publisher.execute(TABLES + "INSERT INTO t2 VALUES (1, 'A')")
    subscriber.execute(TABLES)
    publisher_hook.create_publication("pub", [PublishedTable("t1")])
    subscriber_hook.create_subscription("sub", ["pub"], publisher_conn_id=publisher.conn_id)
    wait_ready(subscriber_hook, "sub")
    publisher_hook.add_publication_tables("pub", [PublishedTable("t2")])
    subscriber_hook.refresh_subscription("sub", copy_data=True)
    wait_ready(subscriber_hook, "sub")
    assert [t.table for t in subscriber_hook.subscription_status("sub").tables] == ["public.t1", "public.t2"]
    wait_rows(subscriber, "t2", [(1, "A")])


def test_skip_after_duplicate_key_conflict(publisher, subscriber, publisher_hook, subscriber_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text)")
    subscriber.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t VALUES (10, 'local')")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    subscriber_hook.create_subscription("sub", ["pub"], publisher_conn_id=publisher.conn_id, copy_data=False)
    wait_ready(subscriber_hook, "sub")
    publisher.execute("INSERT INTO t VALUES (10, 'remote')")
    wait_until(lambda: subscriber_hook.subscription_status("sub").apply_error_count > 0, timeout=30,
               message="the duplicate-key apply error")
    # The apply worker logs the failed transaction's finish LSN: that is what SKIP takes.
    finish = wait_until(
        lambda: re.findall(r'finished at ([0-9A-F]+/[0-9A-F]+)', subscriber.cluster.log()), timeout=30,
        message="the 'finished at' LSN in the subscriber's log",
    )[-1]
    subscriber_hook.skip_subscription("sub", finish)
    publisher.execute("INSERT INTO t VALUES (11, 'after')")
    wait_rows(subscriber, "t", [(10, "local"), (11, "after")])


def test_drop_with_an_unreachable_publisher(publisher, subscriber, publisher_hook, subscriber_hook, capsys):
    from airflow_provider_pglogical.embedded.postgres import free_port

    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    subscriber.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    subscriber_hook.create_subscription("sub", ["pub"], publisher_conn_id=publisher.conn_id)
    wait_ready(subscriber_hook, "sub")
    dead = publisher.conninfo.replace(f"port={publisher.cluster.port}", f"port={free_port()}")
    subscriber_hook.disable_subscription("sub")
    subscriber_hook.set_subscription_connection("sub", conninfo=dead)
    subscriber_hook.drop_subscription("sub", keep_remote_slot=True)  # it never made one
    assert subscriber_hook.subscription_status("sub") is None
    logged = capsys.readouterr().out
    assert "remains on the publisher" in logged
    assert publisher.cluster.password not in logged and "password" not in logged.lower()
    # The remote slot stays behind (the publisher could not be told), as the warning says.
    assert publisher_hook.get_slot("sub") is not None
    subscriber_hook.drop_subscription("sub")  # missing_ok


def test_drop_keeping_the_remote_slot(publisher, subscriber, publisher_hook, subscriber_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    subscriber.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    subscriber_hook.create_subscription("sub", ["pub"], publisher_conn_id=publisher.conn_id, slot_name="kept_slot")
    wait_ready(subscriber_hook, "sub")
    subscriber_hook.drop_subscription("sub", keep_remote_slot=True)
    assert subscriber_hook.subscription_status("sub") is None
    assert publisher_hook.get_slot("kept_slot") is not None


def test_set_add_drop_publications(publisher, subscriber, publisher_hook, subscriber_hook):
    publisher.execute(TABLES)
    subscriber.execute(TABLES)
    publisher_hook.create_publication("pa", [PublishedTable("t1")])
    publisher_hook.create_publication("pb", [PublishedTable("t2")])
    subscriber_hook.create_subscription("sub", ["pa"], publisher_conn_id=publisher.conn_id, enabled=False, connect=True)
    subscriber_hook.add_subscription_publications("sub", ["pb"], refresh=False)
    assert subscriber_hook.subscription_status("sub").publications == ["pa", "pb"]
    subscriber_hook.drop_subscription_publications("sub", ["pa"], refresh=False)
    subscriber_hook.set_subscription_publications("sub", ["pa", "pb"], refresh=False)
    assert subscriber_hook.subscription_status("sub").publications == ["pa", "pb"]
    subscriber_hook.enable_subscription("sub")
    assert subscriber_hook.subscription_status("sub").enabled


def test_the_publishers_password_stays_out_of_the_subscribers_server_log(publisher, subscriber, publisher_hook,
                                                                         subscriber_hook):
    import psycopg2

    from airflow_provider_pglogical.embedded.postgres import free_port

    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    subscriber.execute("CREATE TABLE t(id int PRIMARY KEY)")
    publisher_hook.create_publication("pub", [PublishedTable("t")])
    # an administrator who logs every statement of the database; a failed one is logged whole by default
    subscriber.execute(f"ALTER DATABASE {subscriber.name} SET log_statement = 'all'")
    start = len(subscriber.cluster.log())
    dead = publisher.conninfo.replace(f"port={publisher.cluster.port}", f"port={free_port()}")
    with pytest.raises(psycopg2.OperationalError, match="could not connect to the publisher"):
        subscriber_hook.create_subscription("sub", ["pub"], conninfo=dead)
    assert subscriber_hook.subscription_status("sub") is None  # nothing was created
    assert subscriber_hook.create_subscription("sub", ["pub"], publisher_conn_id=publisher.conn_id, connect=False)
    subscriber_hook.set_subscription_connection("sub", conninfo=dead)
    subscriber_hook.drop_subscription("sub", keep_remote_slot=True)  # it never made one
    logged = wait_until(lambda: "could not connect to the publisher" in subscriber.cluster.log()[start:], timeout=30,
                        message="the failed CREATE SUBSCRIPTION in the server log") and subscriber.cluster.log()[start:]
    assert "DROP SUBSCRIPTION" in logged  # the other statements were logged
    assert publisher.cluster.password not in logged


def test_subscription_options_are_validated(subscriber_hook):
    from airflow_provider_pglogical.exceptions import SubscriptionError

    with pytest.raises(SubscriptionError, match="exactly one of publisher_conn_id or conninfo"):
        subscriber_hook.create_subscription("s", ["p"])
