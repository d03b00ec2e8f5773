"""Shared fixtures: real throwaway PostgreSQL clusters (a publisher and a subscriber).

The clusters live for the whole session; every test gets fresh databases on them, registered
as Airflow connections ``pglogical_publisher`` / ``pglogical_subscriber`` through environment
variables, and everything the test created on the clusters (subscriptions, slots) is removed.
"""

from __future__ import annotations

import os

import pytest

from tests.support.environment import prepare

prepare()
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")

from airflow_provider_pglogical.embedded.postgres import LocalPostgres  # noqa: E402
from tests.support.databases import Database, drop_database, new_database  # noqa: E402


#: the longest test files by CI's ``--durations`` (each several minutes), collected first. CI hands
#: files to its two workers in collection order (``--dist loadfile --no-loadscope-reorder``), so
#: the longest start first and the short ones fill in behind them; collected last, the reliability
#: harness kept one worker busy for minutes after the other had run out of files.
LONGEST_FIRST = (
    "tests/integration/test_iceberg_apply.py",
    "tests/reliability/test_reliability.py",
    "tests/integration/test_dags.py",
    "tests/integration/test_keyless_multiset.py",
    "tests/integration/test_assets.py",
    "tests/integration/test_openlineage.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the other files keep their order


@pytest.fixture(scope="session")
def publisher_cluster():
    cluster = LocalPostgres(name="publisher").start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def subscriber_cluster():
    cluster = LocalPostgres(name="subscriber").start()
    yield cluster
    cluster.stop()


@pytest.fixture
def publisher(publisher_cluster, monkeypatch) -> Database:
    """A fresh database on the publisher cluster (Airflow connection ``pglogical_publisher``)."""
    db = new_database(publisher_cluster, "publisher", monkeypatch.setenv)
    yield db
    drop_database(db)


@pytest.fixture
def subscriber(subscriber_cluster, monkeypatch) -> Database:
    """A fresh database on the subscriber cluster (Airflow connection ``pglogical_subscriber``)."""
    db = new_database(subscriber_cluster, "subscriber", monkeypatch.setenv)
    yield db
    drop_database(db)


@pytest.fixture
def publisher_hook(publisher):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=publisher.conn_id)


@pytest.fixture
def subscriber_hook(subscriber):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=subscriber.conn_id)
