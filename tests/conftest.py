"""Shared fixtures: real throwaway PostgreSQL clusters (a publisher and a subscriber).

The clusters live for the whole session; every test gets fresh databases on them, registered
as Airflow connections ``pglogical_publisher`` / ``pglogical_subscriber`` through environment
variables, and everything the test created on the clusters (subscriptions, slots) is removed.
"""

from __future__ import annotations

import itertools
import os
import sys
import uuid
from dataclasses import dataclass

import pytest

os.environ.setdefault("AIRFLOW_HOME", os.path.join(os.path.dirname(__file__), "..", ".airflow-test"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# spark-submit and airflow come with the interpreter's environment (a venv that may not be activated).
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

from psycopg2 import sql  # noqa: E402

from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until  # noqa: E402

_counter = itertools.count()


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


@dataclass
class Database:
    """One fresh database on a test cluster, with its Airflow connection id."""

    cluster: LocalPostgres
    name: str
    conn_id: str

    def execute(self, statements: str) -> None:
        self.cluster.execute(statements, dbname=self.name)

    def query(self, statement: str, params=None) -> list[tuple]:
        return self.cluster.query(statement, dbname=self.name, params=params)

    def connect(self, autocommit: bool = True):
        return self.cluster.connect(self.name, autocommit=autocommit)

    @property
    def conninfo(self) -> str:
        return self.cluster.dsn(self.name)


def _new_database(cluster: LocalPostgres, role: str, monkeypatch) -> Database:
    name = f"{role}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    cluster.create_database(name)
    conn_id = f"pglogical_{role}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", cluster.connection_uri(name))
    return Database(cluster, name, conn_id)


def _drop_database(db: Database) -> None:
    # Subscriptions must let go of their remote slots before their database can be dropped.
    for (sub,) in db.query("SELECT subname FROM pg_subscription WHERE subdbid = "
                           "(SELECT oid FROM pg_database WHERE datname = current_database())"):
        conn = db.connect()
        with conn.cursor() as cur:
            ident = sql.Identifier(sub)
            cur.execute(sql.SQL("ALTER SUBSCRIPTION {} DISABLE").format(ident))
            cur.execute(sql.SQL("ALTER SUBSCRIPTION {} SET (slot_name = NONE)").format(ident))
            cur.execute(sql.SQL("DROP SUBSCRIPTION {}").format(ident))
        conn.close()
    conn = db.cluster.connect()

    def slots_gone() -> bool:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s AND active",
                (db.name,),
            )
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE database = %s AND NOT active",
                (db.name,),
            )
            cur.execute("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (db.name,))
            return cur.fetchone()[0] == 0

    wait_until(slots_gone, timeout=30, message=f"replication slots of database {db.name} to go")
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db.name)))
    conn.close()


@pytest.fixture
def publisher(publisher_cluster, monkeypatch) -> Database:
    """A fresh database on the publisher cluster (Airflow connection ``pglogical_publisher``)."""
    db = _new_database(publisher_cluster, "publisher", monkeypatch)
    yield db
    _drop_database(db)


@pytest.fixture
def subscriber(subscriber_cluster, monkeypatch) -> Database:
    """A fresh database on the subscriber cluster (Airflow connection ``pglogical_subscriber``)."""
    db = _new_database(subscriber_cluster, "subscriber", monkeypatch)
    yield db
    _drop_database(db)


@pytest.fixture
def publisher_hook(publisher):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=publisher.conn_id)


@pytest.fixture
def subscriber_hook(subscriber):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    return PgLogicalHook(postgres_conn_id=subscriber.conn_id)
