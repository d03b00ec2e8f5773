"""Throwaway databases on real PostgreSQL clusters, for tests and the reliability harness."""

from __future__ import annotations

import itertools
import os
import uuid
from dataclasses import dataclass
from typing import Callable

from psycopg2 import sql

from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until

_counter = itertools.count()


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


def new_database(cluster: LocalPostgres, role: str, setenv: Callable[[str, str], None] = os.environ.__setitem__,
                 name: str | None = None) -> Database:
    """A fresh database, registered as the Airflow connection ``pglogical_<role>`` through ``setenv``
    (pytest's ``monkeypatch.setenv`` in tests, so the variable goes with the test)."""
    name = name or f"{role}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    cluster.create_database(name)
    conn_id = f"pglogical_{role}"
    setenv(f"AIRFLOW_CONN_{conn_id.upper()}", cluster.connection_uri(name))
    return Database(cluster, name, conn_id)


def drop_database(db: Database) -> None:
    """Drop a test database and everything that holds on to it (subscriptions, replication slots)."""
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
