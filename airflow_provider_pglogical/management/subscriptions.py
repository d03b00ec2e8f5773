"""Subscriptions on a subscriber cluster: SQL builders (pure), status read-outs, and the session
settings that keep a publisher's password out of the subscriber's server log."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import psycopg2.errors
import psycopg2.extensions
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import SubscriptionError
from airflow_provider_pglogical.lsn import Lsn

#: CREATE SUBSCRIPTION ... WITH options PostgreSQL 15 accepts, and how each value is written
SUBSCRIPTION_OPTIONS = {
    "copy_data": bool, "create_slot": bool, "enabled": bool, "connect": bool, "two_phase": bool,
    "binary": bool, "disable_on_error": bool, "slot_name": "slot", "streaming": "streaming",
    "synchronous_commit": str, "origin": str, "run_as_owner": bool, "password_required": bool,
}


def _option_value(key: str, value: Any) -> sql.Composable:
    kind = SUBSCRIPTION_OPTIONS.get(key)
    if kind is None:
        raise SubscriptionError(
            f"unknown subscription option {key!r}; PostgreSQL accepts {', '.join(sorted(SUBSCRIPTION_OPTIONS))}"
        )
    if kind == "slot" and value == "NONE":
        # Slot names are lower case, so upper-case NONE can only mean "no slot".
        return sql.SQL("NONE")
    if kind == "streaming" and isinstance(value, str):
        return sql.Literal(value)
    if isinstance(value, bool):
        return sql.SQL("true" if value else "false")
    return sql.Literal(str(value))


def options_clause(options: Mapping[str, Any], keyword: str = " WITH") -> sql.Composable:
    present = {k: v for k, v in options.items() if v is not None}
    if not present:
        return sql.SQL("")
    items = [sql.SQL("{} = {}").format(sql.SQL(k), _option_value(k, v)) for k, v in present.items()]
    return sql.SQL("{} ({})").format(sql.SQL(keyword), sql.SQL(", ").join(items))


def create_subscription_sql(
    name: str, conninfo: str, publications: Sequence[str], options: Mapping[str, Any]
) -> sql.Composed:
    if not publications:
        raise SubscriptionError(f"subscription {name!r}: name at least one publication")
    return sql.SQL("CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {}{}").format(
        sql.Identifier(name), sql.Literal(conninfo), sql.SQL(", ").join(map(sql.Identifier, publications)),
        options_clause(options),
    )


def alter_subscription_sql(name: str, action: sql.Composable) -> sql.Composed:
    return sql.SQL("ALTER SUBSCRIPTION {} {}").format(sql.Identifier(name), action)


def publication_action(verb: str, publications: Sequence[str], options: Mapping[str, Any]) -> sql.Composed:
    """``SET | ADD | DROP PUBLICATION p1, p2 [WITH (refresh = ..., copy_data = ...)]``."""
    pubs = sql.SQL(", ").join(map(sql.Identifier, publications))
    opts = {k: v for k, v in options.items() if v is not None}
    with_clause = sql.SQL("")
    if opts:
        with_clause = sql.SQL(" WITH ({})").format(
            sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.SQL(k), sql.SQL("true" if v else "false")) for k, v in opts.items())
        )
    return sql.SQL("{} PUBLICATION {}{}").format(sql.SQL(verb), pubs, with_clause)


def drop_subscription_sql(name: str, missing_ok: bool = True) -> sql.Composed:
    return sql.SQL("DROP SUBSCRIPTION {}{}").format(
        sql.SQL("IF EXISTS ") if missing_ok else sql.SQL(""), sql.Identifier(name)
    )


def conninfo_from(params: Mapping[str, Any]) -> str:
    """A libpq keyword/value string; values are quoted as libpq requires."""

    def quote(value: Any) -> str:
        text = str(value)
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{key}={quote(value)}" for key, value in params.items() if value not in (None, ""))


#: the settings under which the server writes a statement's text somewhere others read it: logged
#: before it runs, when it is slow, when it fails (the default, ``error``: a failed CREATE
#: SUBSCRIPTION would log its CONNECTION string), and pg_stat_statements' query texts
QUIET_STATEMENT_SETTINGS = (
    ("log_statement", "none"),
    ("log_min_duration_statement", "-1"),
    ("log_min_error_statement", "panic"),
    ("pg_stat_statements.track_utility", "off"),
)


def has_password(conninfo: str) -> bool:
    """Whether a libpq connection string (keywords or URI) carries a password."""
    try:
        return bool(psycopg2.extensions.parse_dsn(conninfo).get("password"))
    except psycopg2.ProgrammingError:  # PostgreSQL says what is wrong with it; assume the worst
        return True


@contextlib.contextmanager
def statement_kept_out_of_logs(cursor, conninfo: str, subscription: str) -> Iterator[None]:
    """Run the block with this session's statements kept out of the server's log, when ``conninfo``
    holds a password: PostgreSQL writes a failing statement into its log, CONNECTION string and all.

    The settings are superuser-only; CREATE SUBSCRIPTION needs a superuser on PostgreSQL 15, so the
    role has them. A role that may not set them (PostgreSQL 16+ ``pg_create_subscription``) gets a
    :class:`SubscriptionError` before anything is sent with the password.
    """
    if not has_password(conninfo):
        yield
        return
    changed = []
    for name, value in QUIET_STATEMENT_SETTINGS:
        cursor.execute("SELECT current_setting(%s, true)", (name,))
        if cursor.fetchone()[0] is None:  # an extension's setting, and the extension is not loaded
            continue
        try:
            cursor.execute("SELECT set_config(%s, %s, false)", (name, value))
        except psycopg2.errors.InsufficientPrivilege as err:
            raise SubscriptionError(
                f"subscription {subscription!r}: the publisher's password would be written into the "
                f"subscriber's server log if the statement failed, and this role may not turn that off "
                f"({str(err).strip()}). Fix: GRANT SET ON PARAMETER {', '.join(n for n, _ in QUIET_STATEMENT_SETTINGS[:3])} "
                "to this role, or give a conninfo without a password (passfile=<file on the subscriber "
                "host, mode 0600, owned by the server's OS user>)"
            ) from None
        changed.append(name)
    try:
        yield
    finally:
        for name in changed:
            cursor.execute(sql.SQL("RESET {}").format(sql.Identifier(*name.split("."))))


@dataclass
class SubscriptionTableState:
    table: str
    state: str  # i = initialize, d = data copy, f = finished copy, s = synchronized, r = ready
    lsn: Lsn | None


@dataclass
class SubscriptionStatus:
    name: str
    enabled: bool
    slot_name: str | None
    publications: list[str]
    worker_pid: int | None
    received_lsn: Lsn | None
    latest_end_lsn: Lsn | None
    last_msg_receipt_time: Any
    apply_error_count: int
    sync_error_count: int
    tables: list[SubscriptionTableState] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """Every table finished its initial copy and is streaming (state ``r``)."""
        return bool(self.tables) and all(t.state == "r" for t in self.tables)


_STATUS = """
SELECT s.subname, s.subenabled, s.subslotname, s.subpublications,
       w.pid, w.received_lsn::text, w.latest_end_lsn::text, w.last_msg_receipt_time,
       coalesce(st.apply_error_count, 0), coalesce(st.sync_error_count, 0)
  FROM pg_subscription s
  LEFT JOIN pg_stat_subscription w ON w.subid = s.oid AND w.relid IS NULL
  LEFT JOIN pg_stat_subscription_stats st ON st.subid = s.oid
 WHERE s.subname = %s AND s.subdbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""

_TABLES = """
SELECT format('%%I.%%I', n.nspname, c.relname), sr.srsubstate, sr.srsublsn::text
  FROM pg_subscription_rel sr
  JOIN pg_subscription s ON s.oid = sr.srsubid
  JOIN pg_class c ON c.oid = sr.srrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE s.subname = %s ORDER BY 1
"""


def subscription_status(cursor, name: str) -> SubscriptionStatus | None:
    cursor.execute(_STATUS, (name,))
    row = cursor.fetchone()
    if row is None:
        return None
    status = SubscriptionStatus(
        row[0], row[1], row[2], list(row[3]), row[4],
        Lsn.parse(row[5]) if row[5] else None, Lsn.parse(row[6]) if row[6] else None, row[7], row[8], row[9],
    )
    cursor.execute(_TABLES, (name,))
    status.tables = [SubscriptionTableState(t, s, Lsn.parse(l) if l else None) for t, s, l in cursor.fetchall()]
    return status
