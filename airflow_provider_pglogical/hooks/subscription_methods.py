"""The subscription half of :class:`~airflow_provider_pglogical.hooks.pglogical.PgLogicalHook`.

These methods run on the *subscriber* (the hook is connected to it); the SQL builders and status
read-outs are :mod:`airflow_provider_pglogical.management.subscriptions`. Kept apart so the hook's
module stays about connections, publications and slots.
"""

from __future__ import annotations

from typing import Any, Sequence

import psycopg2
import psycopg2.errors
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import SubscriptionError
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management import monitoring, subscriptions
from airflow_provider_pglogical.management.subscriptions import SubscriptionStatus


class SubscriptionMethods:
    """Create, alter, drop and read native subscriptions (mixed into ``PgLogicalHook``)."""

    log: Any
    # provided by PgLogicalHook: autocommit_cursor, _execute, _create_unless_exists

    def create_subscription(
        self,
        name: str,
        publications: Sequence[str],
        *,
        publisher_conn_id: str | None = None,
        conninfo: str | None = None,
        copy_data: bool | None = None,
        create_slot: bool | None = None,
        slot_name: str | None = None,
        enabled: bool | None = None,
        connect: bool | None = None,
        two_phase: bool | None = None,
        streaming: bool | str | None = None,
        binary: bool | None = None,
        disable_on_error: bool | None = None,
        synchronous_commit: str | None = None,
        if_not_exists: bool = True,
    ) -> bool:
        """Create a subscription to ``publications``; returns False when it existed already.

        :param publisher_conn_id: Airflow connection of the publisher (or give ``conninfo``).
        :param conninfo: a libpq connection string for the publisher, as the subscriber sees it.
        :param slot_name: the remote slot (default: the subscription's name); ``"NONE"`` for none.
        Other options are PostgreSQL's ``CREATE SUBSCRIPTION … WITH (…)`` options; ``None`` keeps
        PostgreSQL's default.
        """
        info = self._publisher_conninfo(publisher_conn_id, conninfo)
        options = {
            "copy_data": copy_data, "create_slot": create_slot, "slot_name": slot_name, "enabled": enabled,
            "connect": connect, "two_phase": two_phase, "streaming": streaming, "binary": binary,
            "disable_on_error": disable_on_error, "synchronous_commit": synchronous_commit,
        }
        statement = subscriptions.create_subscription_sql(name, info, publications, options)

        def create() -> None:
            with self.autocommit_cursor() as cursor, subscriptions.statement_kept_out_of_logs(cursor, info, name):
                # The statement holds the publisher's password: log only the name, and keep the
                # server from logging it (a failed statement is logged whole by default).
                self.log.info("Creating subscription %s to publication(s) %s", name, ", ".join(publications))
                cursor.execute(statement)

        return self._create_unless_exists("Subscription", name, if_not_exists, create)

    def _publisher_conninfo(self, publisher_conn_id: str | None, conninfo: str | None) -> str:
        if bool(publisher_conn_id) == bool(conninfo):
            raise SubscriptionError("give exactly one of publisher_conn_id or conninfo for the publisher")
        if conninfo:
            return conninfo
        return subscriptions.conninfo_from(type(self)(postgres_conn_id=publisher_conn_id).connect_kwargs())

    def _alter_subscription(self, name: str, action: sql.Composable) -> None:
        self._execute(subscriptions.alter_subscription_sql(name, action))

    def enable_subscription(self, name: str) -> None:
        self._alter_subscription(name, sql.SQL("ENABLE"))

    def disable_subscription(self, name: str) -> None:
        self._alter_subscription(name, sql.SQL("DISABLE"))

    def refresh_subscription(self, name: str, copy_data: bool = True) -> None:
        """Pick up tables added to the publications since; ``copy_data`` copies their rows."""
        self._alter_subscription(
            name, sql.SQL("REFRESH PUBLICATION WITH (copy_data = {})").format(sql.SQL("true" if copy_data else "false"))
        )

    def set_subscription_publications(
        self, name: str, publications: Sequence[str], refresh: bool | None = None, copy_data: bool | None = None
    ) -> None:
        self._alter_subscription(name, subscriptions.publication_action("SET", publications, {"refresh": refresh, "copy_data": copy_data}))

    def add_subscription_publications(
        self, name: str, publications: Sequence[str], refresh: bool | None = None, copy_data: bool | None = None
    ) -> None:
        self._alter_subscription(name, subscriptions.publication_action("ADD", publications, {"refresh": refresh, "copy_data": copy_data}))

    def drop_subscription_publications(self, name: str, publications: Sequence[str], refresh: bool | None = None) -> None:
        self._alter_subscription(name, subscriptions.publication_action("DROP", publications, {"refresh": refresh}))

    def skip_subscription(self, name: str, lsn: Lsn | str) -> None:
        """Skip the remote transaction finishing at ``lsn`` (the one in the apply error's CONTEXT)."""
        self._alter_subscription(name, sql.SQL("SKIP (lsn = {})").format(sql.Literal(str(Lsn.parse(lsn)))))

    def set_subscription_connection(
        self, name: str, *, publisher_conn_id: str | None = None, conninfo: str | None = None
    ) -> None:
        info = self._publisher_conninfo(publisher_conn_id, conninfo)
        with self.autocommit_cursor() as cursor, subscriptions.statement_kept_out_of_logs(cursor, info, name):
            self.log.info("Changing the publisher connection of subscription %s", name)
            cursor.execute(subscriptions.alter_subscription_sql(name, sql.SQL("CONNECTION {}").format(sql.Literal(info))))

    def drop_subscription(self, name: str, keep_remote_slot: bool = False, missing_ok: bool = True) -> None:
        """Drop a subscription, also when the publisher is unreachable.

        With ``keep_remote_slot`` (or when the publisher cannot be reached) the subscription is
        disabled and detached from its slot first; the publisher's slot then stays and must be
        dropped there (it pins WAL until it is).
        """
        with self.autocommit_cursor() as cursor:
            status = subscriptions.subscription_status(cursor, name)
            if status is None:
                if missing_ok:
                    return
                raise SubscriptionError(f"subscription {name!r} does not exist")
            if not keep_remote_slot:
                try:
                    cursor.execute(subscriptions.drop_subscription_sql(name, missing_ok))
                    return
                except (psycopg2.errors.ConnectionFailure, psycopg2.OperationalError) as err:
                    self.log.warning(
                        "Publisher of subscription %s is unreachable (%s); detaching from its slot",
                        name, str(err).strip().splitlines()[0],
                    )
            self._detach_and_drop(cursor, name, status.slot_name, missing_ok)

    def _detach_and_drop(self, cursor, name: str, slot_name: str | None, missing_ok: bool) -> None:
        cursor.execute(subscriptions.alter_subscription_sql(name, sql.SQL("DISABLE")))
        cursor.execute(subscriptions.alter_subscription_sql(name, sql.SQL("SET (slot_name = NONE)")))
        cursor.execute(subscriptions.drop_subscription_sql(name, missing_ok))
        if slot_name:
            self.log.warning(
                "Replication slot %s of dropped subscription %s remains on the publisher and pins WAL there: "
                "drop it with pg_drop_replication_slot('%s') when the publisher is reachable",
                slot_name, name, slot_name,
            )

    def subscription_status(self, name: str) -> SubscriptionStatus | None:
        """Worker, received/latest LSNs, per-table sync state and error counts."""
        with self.autocommit_cursor() as cursor:
            return subscriptions.subscription_status(cursor, name)

    def subscription_health(self, name: str) -> dict:
        """The subscription classified (``missing``, ``waiting``, ``ready``) with each table's state."""
        return monitoring.subscription_health(self.subscription_status(name), name)
