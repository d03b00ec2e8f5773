"""PgLogicalHook: publications, replication slots, subscriptions and publisher health checks."""

from __future__ import annotations

import contextlib
import os
import time
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterator, Mapping, Sequence

import psycopg2
import psycopg2.errors
import psycopg2.extras
from airflow.providers.postgres.hooks.postgres import PostgresHook
from psycopg2 import sql

from airflow_provider_pglogical.hooks.subscription_methods import SubscriptionMethods
from airflow_provider_pglogical.management import connector, health, monitoring
from airflow_provider_pglogical.management import publication_sync
from airflow_provider_pglogical.management import slots
from airflow_provider_pglogical.management import publications as pubs
from airflow_provider_pglogical.exceptions import PublisherCheckError
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.publications import PublicationInfo, PublishedTable
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.management.slots import ExportedSnapshot, SlotInfo

#: the ``cursor`` extra, as psycopg2 cursor classes (PostgresHook maps it to psycopg 3 row factories
#: when psycopg 3 is installed)
_CURSOR_FACTORIES = {
    "dictcursor": psycopg2.extras.DictCursor,
    "realdictcursor": psycopg2.extras.RealDictCursor,
    "namedtuplecursor": psycopg2.extras.NamedTupleCursor,
}
#: reuse an IAM token for this long (RDS tokens live 15 minutes, Redshift credentials 15 by default)
_IAM_TOKEN_REUSE_SECONDS = 300


def _check_hosts(conn_id: str, kwargs: Mapping[str, Any]) -> None:
    """A multi-host connection needs one port per host, or one port for all (libpq's rule)."""
    hosts = str(kwargs.get("host", "")).split(",")
    ports = str(kwargs["port"]).split(",") if "port" in kwargs else []
    if len(ports) > 1 and len(ports) != len(hosts):
        raise ValueError(
            f"connection {conn_id!r} names {len(hosts)} host(s) ({kwargs.get('host', '')}) but {len(ports)} ports "
            f"({kwargs['port']}): give the 'port' extra one port per host, in the hosts' order, or one port for all"
        )


class PgLogicalHook(SubscriptionMethods, PostgresHook):
    """Manage PostgreSQL logical replication from a standard ``postgres`` Airflow connection.

    Connections are built as :class:`PostgresHook` builds them (host, port, login, password,
    database, ``options``, libpq extras such as ``sslmode``; IAM tokens for RDS/Aurora, Redshift
    and Azure through :meth:`PostgresHook.get_iam_token`), and always with psycopg2 (also when
    psycopg 3 is installed), because the replication protocol and ``psycopg2.sql`` composition
    are psycopg2's. Every DDL call is idempotent (``if_not_exists`` / ``missing_ok``) and quotes
    identifiers with ``psycopg2.sql``. See ``docs/connections.md``.

    :param postgres_conn_id: the Airflow connection of the cluster to manage.
    :param database: overrides the connection's database (schema field).
    :param options: libpq ``options`` (e.g. ``"-c statement_timeout=0"``), as for PostgresHook.
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    conn_type = "postgres"
    hook_name = "PostgreSQL logical replication"

    def __init__(self, *args, database: str | None = None, **kwargs) -> None:
        super().__init__(*args, database=database, **kwargs)
        self.database = database
        self._iam: tuple[float, tuple[str, str, int]] | None = None

    # -- connections -------------------------------------------------------------------------
    def connect_kwargs(self) -> dict[str, Any]:
        """libpq keywords for this connection, as :meth:`PostgresHook.get_conn` builds them.

        Used for SQL and replication connections alike (the replication ones add
        ``replication=database``). With ``iam`` in the extras the login, password and port come
        from :meth:`PostgresHook.get_iam_token` (a token is reused for a few minutes). Extras that
        are Airflow's (:attr:`PostgresHook.ignored_extra_options`) are left out; every other extra
        is a libpq keyword (``sslmode``, ``sslrootcert``, ``connect_timeout``, ``application_name``, …).

        A multi-host connection (libpq tries each host in turn, e.g. to follow a failover): the host
        field lists the hosts (``a,b``) and the ``port`` extra one port per host (``"5432,5433"``;
        the port field holds one number), with ``target_session_attrs: read-write`` in the extras.
        """
        conn = self.connection
        login, password, port = conn.login, conn.password, conn.port
        if conn.extra_dejson.get("iam", False):
            login, password, port = self._iam_credentials(conn)
        kwargs: dict[str, Any] = {
            "host": conn.host, "port": port, "user": login, "password": password,
            "dbname": self.database or conn.schema,
        }
        if self.options:
            kwargs["options"] = self.options
        for key, value in conn.extra_dejson.items():
            if key not in self.ignored_extra_options:
                kwargs[key] = value
        kwargs = {k: v for k, v in kwargs.items() if v not in (None, "")}
        _check_hosts(self.get_conn_id(), kwargs)
        return kwargs

    def _iam_credentials(self, conn) -> tuple[str, str, int]:
        now = time.monotonic()
        if self._iam is None or now - self._iam[0] > _IAM_TOKEN_REUSE_SECONDS:
            self._iam = (now, tuple(self.get_iam_token(conn)))
        return self._iam[1]

    def get_conn(self) -> psycopg2.extensions.connection:
        """A psycopg2 connection (autocommit off, like PostgresHook's); honours the ``cursor`` extra."""
        kwargs = self.connect_kwargs()
        raw_cursor = self.connection.extra_dejson.get("cursor")
        if raw_cursor:
            try:
                kwargs["cursor_factory"] = _CURSOR_FACTORIES[str(raw_cursor).lower()]
            except KeyError:
                raise ValueError(
                    f"Invalid cursor passed {raw_cursor}. Valid options are: {', '.join(_CURSOR_FACTORIES)}"
                ) from None
        self.conn = psycopg2.connect(**kwargs)
        return self.conn

    def copy_expert(self, sql: str, filename: str) -> None:
        """Run ``COPY … FROM STDIN`` / ``TO STDOUT`` with a local file, over psycopg2.

        (PostgresHook takes its psycopg 3 path whenever psycopg 3 is installed; this hook's
        connections are psycopg2's, so ``bulk_load`` and ``bulk_dump`` come here.)
        """
        self.log.info("Running copy expert: %s, filename: %s", sql, filename)
        if not os.path.isfile(filename):
            with open(filename, "w"):
                pass
        with open(filename, "r+") as file, contextlib.closing(self.get_conn()) as conn, \
                contextlib.closing(conn.cursor()) as cursor:
            cursor.copy_expert(sql, file)
            file.truncate(file.tell())
            conn.commit()

    @staticmethod
    def _serialize_cell(cell: object, conn: Any | None = None) -> Any:
        """``insert_rows`` values, adapted for psycopg2 (whatever psycopg PostgresHook prefers)."""
        serialize = getattr(PostgresHook, "_serialize_cell_ppg2", None)  # providers before psycopg 3 support
        return serialize(cell, conn) if serialize else PostgresHook._serialize_cell(cell, conn)

    def autocommit_cursor(self) -> AbstractContextManager[psycopg2.extensions.cursor]:
        """An autocommit cursor (:class:`~airflow_provider_pglogical.management.connector.Connector`):
        replication management statements must not run in a transaction."""
        return connector.autocommit_cursor(self.connect_kwargs())

    def _execute(self, statement: sql.Composable, params: Sequence[Any] | None = None) -> None:
        with self.autocommit_cursor() as cursor:
            self.log.info("Executing: %s", statement.as_string(cursor))
            cursor.execute(statement, params)

    # -- publications ------------------------------------------------------------------------
    def create_publication(
        self,
        name: str,
        tables: Sequence[PublishedTable] | None = None,
        *,
        all_tables: bool = False,
        schemas: Sequence[str] | None = None,
        publish: Sequence[str] = pubs.PUBLISH_OPERATIONS,
        publish_via_partition_root: bool = False,
        if_not_exists: bool = True,
        publish_generated_columns: str = "none",
    ) -> bool:
        """Create a publication; returns False when it existed already (and ``if_not_exists``).

        :param name: publication name.
        :param tables: tables with optional column lists and row filters.
        :param all_tables: publish every table of the database (``FOR ALL TABLES``).
        :param schemas: publish every table of these schemas (``FOR TABLES IN SCHEMA``).
        :param publish: the DML operations to publish.
        :param publish_via_partition_root: publish partitions' changes as their root table's.
        :param if_not_exists: do nothing (and return False) when the publication exists.
        :param publish_generated_columns: ``"stored"`` publishes stored generated columns
            (PostgreSQL 18 and later; refused on an older server before anything is created).
        """
        with self.autocommit_cursor() as cursor:
            server_version = cursor.connection.server_version
        pubs.check_generated_columns(name, publish_generated_columns, server_version)
        statement = pubs.create_publication_sql(
            name, tables, all_tables=all_tables, schemas=schemas, publish=publish,
            publish_via_partition_root=publish_via_partition_root,
            publish_generated_columns="stored" if publish_generated_columns == "stored" else None,
        )
        return self._create_unless_exists("Publication", name, if_not_exists, lambda: self._execute(statement))

    def _create_unless_exists(self, what: str, name: str, if_not_exists: bool, create: Callable[[], None]) -> bool:
        """Run ``create``; False (and a log line) when the object exists already and ``if_not_exists``."""
        try:
            create()
        except psycopg2.errors.DuplicateObject:
            if not if_not_exists:
                raise
            self.log.info("%s %s exists already", what, name)
            return False
        return True

    # The declaration is create_publication's on purpose: ensure_publication is its converging, checked twin.
    def ensure_publication(
        self,
        name: str,
        tables: Sequence[PublishedTable] | None = None,
        *,
        all_tables: bool = False,
        schemas: Sequence[str] | None = None,
        publish: Sequence[str] = pubs.PUBLISH_OPERATIONS,
        publish_via_partition_root: bool = False,
        check: bool = True,
        publish_generated_columns: str = "none",
    ) -> publication_sync.PublicationChange:
        """Create the publication, or converge it to what is declared, and check it: in one transaction.

        A failed check (e.g. a row filter on a column outside the replica identity, which would make
        the application's UPDATEs fail) rolls the DDL back, so nothing remains.

        :param name: publication name.
        :param tables: tables with optional column lists and row filters.
        :param all_tables: ``FOR ALL TABLES``.
        :param schemas: ``FOR TABLES IN SCHEMA``.
        :param publish: the DML operations to publish.
        :param publish_via_partition_root: publish partitions' changes as their root table's.
        :param check: run the publisher checks before committing.
        :param publish_generated_columns: ``"stored"`` publishes stored generated columns
            (PostgreSQL 18 and later; refused on an older server, changing nothing).
        :return: whether it was created, and each change made to an existing one.
        """
        conn = psycopg2.connect(**self.connect_kwargs())
        try:
            return publication_sync.ensure_publication(
                conn, name, tables, all_tables=all_tables, schemas=schemas, publish=publish,
                publish_via_partition_root=publish_via_partition_root, check=check,
                publish_generated_columns=publish_generated_columns,
            )
        finally:
            conn.close()

    def add_publication_tables(self, name: str, tables: Sequence[PublishedTable]) -> None:
        """``ALTER PUBLICATION … ADD TABLE``; tables already in the publication are skipped."""
        current = self.describe_publication(name)
        known = {(t.schema, t.table) for t in current.tables} if current else set()
        new = [t for t in tables if t.qualified not in known]
        if new:
            self._execute(pubs.alter_publication_tables_sql(name, "ADD", new))

    def set_publication_tables(self, name: str, tables: Sequence[PublishedTable]) -> None:
        """``ALTER PUBLICATION … SET TABLE``: replace the table list (filters and lists included)."""
        self._execute(pubs.alter_publication_tables_sql(name, "SET", tables))

    def drop_publication_tables(self, name: str, tables: Sequence[PublishedTable | str]) -> None:
        """``ALTER PUBLICATION … DROP TABLE``; tables not in the publication are skipped."""
        wanted = [t if isinstance(t, PublishedTable) else PublishedTable(t) for t in tables]
        current = self.describe_publication(name)
        known = {(t.schema, t.table) for t in current.tables} if current else set()
        present = [t for t in wanted if t.qualified in known]
        if present:
            self._execute(pubs.alter_publication_tables_sql(name, "DROP", present))

    def set_publication_options(
        self, name: str, *, publish: Sequence[str] | None = None, publish_via_partition_root: bool | None = None
    ) -> None:
        """Change a publication's ``publish`` operations or ``publish_via_partition_root``."""
        self._execute(
            pubs.alter_publication_options_sql(name, publish=publish, publish_via_partition_root=publish_via_partition_root)
        )

    def drop_publication(self, name: str, missing_ok: bool = True) -> None:
        """Drop a publication (``IF EXISTS`` unless ``missing_ok=False``)."""
        self._execute(pubs.drop_publication_sql(name, missing_ok))

    def describe_publication(self, name: str) -> PublicationInfo | None:
        """What psql ``\\dRp+`` shows: owner, flags, and each table with its filter and column list."""
        with self.autocommit_cursor() as cursor:
            return pubs.describe_publication(cursor, name)

    def published_tables(self, publications: Sequence[str]) -> list[ResolvedTable]:
        """Per published table: the effective column list and combined row filter, by PostgreSQL's rules."""
        return connector.published_tables(self, publications)

    # -- slots -------------------------------------------------------------------------------
    def create_slot(
        self, name: str, plugin: str = "pgoutput", temporary: bool = False, two_phase: bool = False,
        if_not_exists: bool = True,
    ) -> Lsn | None:
        """Create a logical slot; returns its consistent LSN (None when it existed already)."""
        with self.autocommit_cursor() as cursor:
            return slots.create_slot(cursor, name, plugin, temporary, two_phase, if_not_exists)

    @contextlib.contextmanager
    def exported_snapshot(
        self, name: str, plugin: str = "pgoutput", temporary: bool = False, two_phase: bool = False
    ) -> Iterator[ExportedSnapshot]:
        """Create a slot over a replication connection and keep its exported snapshot valid.

        Inside the block, other sessions ``SET TRANSACTION SNAPSHOT <snapshot_name>`` and see exactly
        the rows committed before the slot's consistent LSN.
        """
        with connector.exported_snapshot(self, name, plugin, temporary, two_phase) as snapshot:
            yield snapshot

    def drop_slot(self, name: str, missing_ok: bool = True) -> bool:
        """Drop a slot; returns False when it did not exist."""
        return connector.drop_slot(self, name, missing_ok)

    def list_slots(self) -> list[SlotInfo]:
        """Every slot with active, restart/confirmed LSNs, wal_status, retained WAL and lag bytes."""
        with self.autocommit_cursor() as cursor:
            return slots.list_slots(cursor)

    def get_slot(self, name: str) -> SlotInfo | None:
        return connector.get_slot(self, name)

    def advance_slot(self, name: str, lsn: Lsn | str) -> Lsn:
        """Confirm everything before ``lsn`` as consumed, so PostgreSQL may recycle that WAL."""
        with self.autocommit_cursor() as cursor:
            return slots.advance_slot(cursor, name, lsn)

    def peek_changes(
        self, name: str, *, upto_lsn: Lsn | str | None = None, upto_nchanges: int | None = None,
        options: Mapping[str, Any] | None = None, binary: bool = True,
    ) -> list[tuple[Lsn, int, Any]]:
        """Decoded changes without consuming them: ``(lsn, xid, data)`` rows.

        :param upto_lsn: stop at the first transaction committing at or after this LSN.
        :param upto_nchanges: stop after the transaction that brings the count past this.
        :param options: output-plugin options, e.g. ``{"proto_version": "1", "publication_names": "p"}``.
        :param binary: use the ``_binary_`` function (required for pgoutput).
        """
        with self.autocommit_cursor() as cursor:
            return slots.read_changes(
                cursor, name, binary=binary, consume=False, upto_lsn=upto_lsn, upto_nchanges=upto_nchanges,
                options=options,
            )

    def get_changes(
        self, name: str, *, upto_lsn: Lsn | str | None = None, upto_nchanges: int | None = None,
        options: Mapping[str, Any] | None = None, binary: bool = True,
    ) -> list[tuple[Lsn, int, Any]]:
        """Like :meth:`peek_changes`, but consumes what it returns."""
        with self.autocommit_cursor() as cursor:
            return slots.read_changes(
                cursor, name, binary=binary, consume=True, upto_lsn=upto_lsn, upto_nchanges=upto_nchanges,
                options=options,
            )

    def slot_health(self, name: str, max_retained_wal_bytes: int | None = None,
                    max_lag_bytes: int | None = None, until_next_pull: float | None = None) -> dict:
        """The slot classified (``missing``, ``invalidated``, ``breach``, ``busy``, ``ok``) with its metrics,
        its limits and the ``warnings`` that come before PostgreSQL invalidates it (:func:`monitoring.slot_status`).

        :param until_next_pull: seconds until the pipeline's next scheduled pull, when known: the slot's
            idle time is judged at that pull against ``idle_replication_slot_timeout``.
        """
        with self.autocommit_cursor() as cursor:
            return monitoring.slot_status(cursor, name, max_retained_wal_bytes, max_lag_bytes, until_next_pull)

    # -- health ------------------------------------------------------------------------------
    def check_publisher(self, publications: Sequence[str], tables: Sequence[str] = (), failover: bool = False,
                        standby: "PgLogicalHook | None" = None, pull_every: float | None = None) -> list[str]:
        """Raise one :class:`~airflow_provider_pglogical.exceptions.PublisherCheckError` listing every
        problem (server version, wal_level, slots, WAL senders, REPLICATION role, replica identities, row
        filters and column lists against the replica identity, missing tables or publications). Read-only.

        :param failover: also check what failover slots need on the primary (17+, synchronized_standby_slots).
        :param standby: the physical standby's hook: also check its slot-sync settings.
        :param pull_every: seconds between the pipeline's scheduled pulls, if known (see
            :func:`health.publisher_warnings`).
        :return: warnings that do not stop replication (e.g. a short idle_replication_slot_timeout).
        """
        with self.autocommit_cursor() as cursor:
            problems = health.find_publisher_problems(cursor, publications, tables)
            if failover:
                if standby is None:
                    problems += health.failover_problems(cursor)
                else:
                    with standby.autocommit_cursor() as standby_cursor:
                        problems += health.failover_problems(cursor, standby_cursor)
            if problems:
                raise PublisherCheckError(problems)
            return health.publisher_warnings(cursor, pull_every)
