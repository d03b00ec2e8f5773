"""Shared fixtures: real throwaway PostgreSQL clusters (a publisher and a subscriber).

The clusters live for the whole session; every test gets fresh databases on them, registered
as Airflow connections ``pglogical_publisher`` / ``pglogical_subscriber`` through environment
variables, and everything the test created on the clusters (subscriptions, slots) is removed.
"""

from __future__ import annotations

import os

import pytest

from tests.support.environment import deploy_spark_defaults, prepare

prepare()
deploy_spark_defaults()
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")

from airflow_provider_pglogical.embedded.postgres import LocalPostgres, available_servers  # noqa: E402
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
    "tests/integration/test_spark_copy.py",
    "tests/integration/test_object_store_lakehouse.py",
    "tests/integration/test_benchmarks_tiny.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the other files keep their order


#: test files whose outcome the PostgreSQL server decides (pgoutput decoding, pull, snapshot, TOAST,
#: two-phase, publications, row filters, column lists, slots): each of their tests runs on every
#: server version found here (:func:`test_server_versions`); every other test runs once, on the
#: oldest, since the server only feeds it
EVERY_SERVER = (
    "tests/integration/test_pull.py",
    "tests/integration/test_initial_sync.py",
    "tests/integration/test_publications.py",
    "tests/integration/test_slots.py",
    "tests/integration/test_columnar_decode.py",
    "tests/integration/test_health.py",
    "tests/integration/test_subscriptions.py",
    "tests/integration/test_toast_filter_crossing.py",
    "tests/integration/test_server_versions.py",
    "tests/integration/test_streaming.py",
    "tests/integration/test_generated_columns.py",
    "tests/integration/test_published_set.py",
    "tests/integration/test_chunked_load_whole.py",
    "tests/integration/test_chunked_load.py",
)


def test_server_versions() -> list[int]:
    """The server versions the suite runs on: every supported one found (Debian's 15, the wheels'
    16 and 18), or ``$PGLOGICAL_TEST_PG_VERSIONS`` (``15,18``) to run fewer while developing."""
    found = available_servers()
    wanted = os.environ.get("PGLOGICAL_TEST_PG_VERSIONS")
    if not wanted:
        return list(found)
    versions = [int(v) for v in wanted.split(",") if v.strip()]
    missing = [v for v in versions if v not in found]
    if missing:
        raise pytest.UsageError(f"PGLOGICAL_TEST_PG_VERSIONS names {missing}, not installed here (found {list(found)})")
    return versions


test_server_versions.__test__ = False  # a helper, not a test


def pytest_generate_tests(metafunc) -> None:
    """Run the tests of :data:`EVERY_SERVER` once per server version (ids ``[pg15]``, ``[pg16]``, …)."""
    path = metafunc.definition.nodeid.split("::", 1)[0]
    one_server = metafunc.definition.get_closest_marker("one_server") is not None
    if path in EVERY_SERVER and not one_server and "pg_version" in metafunc.fixturenames:
        minimum = metafunc.definition.get_closest_marker("min_server")
        versions = [v for v in test_server_versions() if minimum is None or v >= minimum.args[0]]
        metafunc.parametrize("pg_version", versions, ids=[f"pg{v}" for v in versions])


@pytest.fixture
def pg_version() -> int:
    """The server version of this test's clusters: the oldest one installed, unless the test runs on
    every one."""
    return next(iter(available_servers()))


class ClusterPool:
    """The session's clusters, one per role and server version, started on first use."""

    def __init__(self) -> None:
        self.clusters: dict[tuple[str, int], LocalPostgres] = {}

    def get(self, role: str, version: int) -> LocalPostgres:
        if (role, version) not in self.clusters:
            self.clusters[(role, version)] = LocalPostgres(name=f"{role}{version}", version=version).start()
        return self.clusters[(role, version)]

    def stop(self) -> None:
        for cluster in self.clusters.values():
            cluster.stop()


@pytest.fixture(scope="session")
def cluster_pool():
    pool = ClusterPool()
    yield pool
    pool.stop()


@pytest.fixture
def publisher_cluster(cluster_pool, pg_version) -> LocalPostgres:
    """The publisher cluster of this test's server version (shared by the session's tests)."""
    return cluster_pool.get("publisher", pg_version)


@pytest.fixture
def subscriber_cluster(cluster_pool, pg_version) -> LocalPostgres:
    """The subscriber cluster, of the publisher's version (PostgreSQL's own subscriber as the oracle)."""
    return cluster_pool.get("subscriber", pg_version)


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
