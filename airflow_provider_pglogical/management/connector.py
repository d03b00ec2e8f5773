"""What capture and management need of a database connection, and the few operations made over one.

A :class:`Connector` gives libpq keywords and an autocommit cursor. ``PgLogicalHook`` is one (the
Airflow face, connections built from an Airflow connection); :class:`LibpqConnector` is one built
from libpq keywords, for code that runs without Airflow (the reliability harness, scripts). Capture
code takes any Connector, so it never reaches into the hook's internals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Iterator, Protocol

import psycopg2
import psycopg2.extensions

from airflow_provider_pglogical.management import published, slots
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.management.slots import ExportedSnapshot, SlotInfo


class Connector(Protocol):
    def connect_kwargs(self) -> dict[str, Any]:
        """libpq keywords of a session (replication sessions add ``replication=database``)."""

    def autocommit_cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        """A cursor of a new autocommit session, closed on exit."""


@contextlib.contextmanager
def autocommit_cursor(connect_kwargs: dict[str, Any]) -> Iterator[psycopg2.extensions.cursor]:
    """Replication management statements must not run inside a transaction: autocommit, always."""
    conn = psycopg2.connect(**connect_kwargs)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            yield cursor
    finally:
        conn.close()


class LibpqConnector:
    """A :class:`Connector` from libpq keywords (``host``, ``port``, ``user``, ``dbname``, …)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs

    def connect_kwargs(self) -> dict[str, Any]:
        return dict(self._kwargs)

    def autocommit_cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        return autocommit_cursor(self.connect_kwargs())


def get_slot(connector: Connector, name: str) -> SlotInfo | None:
    with connector.autocommit_cursor() as cursor:
        return slots.get_slot(cursor, name)


def drop_slot(connector: Connector, name: str, missing_ok: bool = True) -> bool:
    """Drop a slot; False when it did not exist."""
    with connector.autocommit_cursor() as cursor:
        return slots.drop_slot(cursor, name, missing_ok)


def published_tables(connector: Connector, publications: Sequence[str]) -> list[ResolvedTable]:
    """Per published table: the effective column list and combined row filter, by PostgreSQL's rules."""
    with connector.autocommit_cursor() as cursor:
        return published.resolve_published_tables(cursor, publications)


def exported_snapshot(connector: Connector, name: str, plugin: str = "pgoutput", temporary: bool = False,
                      two_phase: bool = False, failover: bool = False) -> AbstractContextManager[ExportedSnapshot]:
    """Create a slot over a replication session and keep its exported snapshot valid inside the block."""
    kwargs = {**connector.connect_kwargs(), "replication": "database"}
    return slots.exported_snapshot(kwargs, name, plugin, temporary, two_phase, failover)
