"""Replication slots: create, drop, list, advance, peek/get changes, and exported snapshots."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import psycopg2
import psycopg2.errors
import psycopg2.extras
from psycopg2 import sql

from airflow_provider_pglogical.exceptions import SlotError
from airflow_provider_pglogical.lsn import Lsn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotInfo:
    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    wal_status: str | None
    two_phase: bool
    #: WAL the slot keeps on the server: current LSN - restart_lsn
    retained_wal_bytes: int | None
    #: how far the consumer is behind: current LSN - confirmed_flush_lsn
    lag_bytes: int | None
    #: why PostgreSQL invalidated the slot (17+: ``wal_removed``, ``rows_removed``, ``wal_level_insufficient``;
    #: 18: ``idle_timeout``); None when valid or on 15/16, which do not say
    invalidation_reason: str | None = None
    #: 17+: the slot is synchronized to standbys (``CREATE_REPLICATION_SLOT ... (FAILOVER)``)
    failover: bool = False
    #: 17+: the slot was synchronized from a primary (on a standby, or left by a promoted one)
    synced: bool = False

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost" or self.invalidation_reason is not None


# invalidation_reason, failover and synced came with 17: read through to_jsonb so one query fits 15 to 18.
# On a standby pg_current_wal_lsn() is not available: the lag columns use the last replayed LSN there.
_LIST_SLOTS = """
SELECT slot_name, plugin, slot_type, database, temporary, active, active_pid,
       restart_lsn::text, confirmed_flush_lsn::text, wal_status, two_phase,
       pg_wal_lsn_diff(here.lsn, restart_lsn)::bigint,
       pg_wal_lsn_diff(here.lsn, confirmed_flush_lsn)::bigint,
       to_jsonb(s) ->> 'invalidation_reason',
       coalesce((to_jsonb(s) ->> 'failover')::bool, false),
       coalesce((to_jsonb(s) ->> 'synced')::bool, false)
  FROM pg_replication_slots s,
       LATERAL (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                            ELSE pg_current_wal_lsn() END AS lsn) here
"""


def _lsn(text: str | None) -> Lsn | None:
    return Lsn.parse(text) if text else None


def _end_failed_transaction(cursor) -> None:
    """After a caught error outside autocommit, the transaction must be rolled back to go on."""
    if not cursor.connection.autocommit:
        cursor.connection.rollback()


def list_slots(cursor, name: str | None = None) -> list[SlotInfo]:
    query = _LIST_SLOTS + (" WHERE slot_name = %s" if name else "") + " ORDER BY slot_name"
    cursor.execute(query, (name,) if name else None)
    return [
        SlotInfo(r[0], r[1], r[2], r[3], r[4], r[5], r[6], _lsn(r[7]), _lsn(r[8]), r[9], r[10], r[11], r[12],
                 r[13], r[14], r[15])
        for r in cursor.fetchall()
    ]


def get_slot(cursor, name: str) -> SlotInfo | None:
    found = list_slots(cursor, name)
    return found[0] if found else None


def create_slot(
    cursor, name: str, plugin: str = "pgoutput", temporary: bool = False, two_phase: bool = False,
    if_not_exists: bool = True,
) -> Lsn | None:
    """Create a logical slot; returns its consistent LSN, or None when it existed already."""
    try:
        cursor.execute(
            "SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s, %s, %s)",
            (name, plugin, temporary, two_phase),
        )
    except psycopg2.errors.DuplicateObject:
        if not if_not_exists:
            raise
        _end_failed_transaction(cursor)
        existing = get_slot(cursor, name)
        if existing and existing.plugin != plugin:
            raise SlotError(
                f"replication slot {name!r} exists with plugin {existing.plugin!r}, not {plugin!r}: "
                "drop it (drop_slot) or choose another slot name", permanent=True,
            )
        return None
    return Lsn.parse(cursor.fetchone()[0])


def drop_slot(cursor, name: str, missing_ok: bool = True) -> bool:
    """Drop a slot; returns False when it did not exist (and ``missing_ok``)."""
    try:
        cursor.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except psycopg2.errors.UndefinedObject:
        if not missing_ok:
            raise
        _end_failed_transaction(cursor)
        return False
    except psycopg2.errors.ObjectInUse as err:
        raise SlotError(
            f"replication slot {name!r} is in use by an active consumer ({err.pgerror.strip()}); "
            "stop that consumer (or its subscription) first"
        ) from err
    return True


def advance_slot(cursor, name: str, lsn: Lsn | str) -> Lsn:
    """Move the slot's confirmed position forward to ``lsn``; returns where it ended up."""
    cursor.execute(
        "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)", (name, str(Lsn.parse(lsn)))
    )
    return Lsn.parse(cursor.fetchone()[0])


def plugin_options(options: Mapping[str, Any] | None) -> list[str]:
    """Flatten plugin options into the variadic text arguments the SQL functions take."""
    flat: list[str] = []
    for key, value in (options or {}).items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            value = ",".join(value)
        flat += [key, str(value)]
    return flat


#: the decoding function for (consume, binary)
_CHANGE_FUNCTIONS = {
    (False, False): "pg_logical_slot_peek_changes",
    (False, True): "pg_logical_slot_peek_binary_changes",
    (True, False): "pg_logical_slot_get_changes",
    (True, True): "pg_logical_slot_get_binary_changes",
}


def changes_sql(
    name: str, *, binary: bool, consume: bool, upto_lsn: Lsn | str | None, upto_nchanges: int | None,
    options: Mapping[str, Any] | None, columns: Sequence[str] = ("lsn::text", "xid::text::bigint", "data"),
) -> tuple[sql.Composed, list]:
    """``SELECT lsn, xid, data FROM pg_logical_slot_{peek,get}[_binary]_changes(...)``."""
    func = _CHANGE_FUNCTIONS[consume, binary]
    flat = plugin_options(options)
    args = [name, str(Lsn.parse(upto_lsn)) if upto_lsn is not None else None, upto_nchanges, *flat]
    placeholders = sql.SQL(", ").join([sql.SQL("%s"), sql.SQL("%s::pg_lsn"), sql.SQL("%s::int")] + [sql.SQL("%s")] * len(flat))
    query = sql.SQL("SELECT {} FROM {}({})").format(sql.SQL(", ").join(map(sql.SQL, columns)), sql.Identifier(func), placeholders)
    return query, args


def read_changes(
    cursor, name: str, *, binary: bool = True, consume: bool = False, upto_lsn: Lsn | str | None = None,
    upto_nchanges: int | None = None, options: Mapping[str, Any] | None = None,
) -> list[tuple[Lsn, int, Any]]:
    """Peek (or get) decoded changes. Bound the window: never ``NULL, NULL`` on a large backlog."""
    query, args = changes_sql(
        name, binary=binary, consume=consume, upto_lsn=upto_lsn, upto_nchanges=upto_nchanges, options=options
    )
    cursor.execute(query, args)
    return [(Lsn.parse(lsn), xid, data) for lsn, xid, data in cursor.fetchall()]


@dataclass(frozen=True)
class ExportedSnapshot:
    """A slot's consistent point and the snapshot that sees exactly the rows committed before it."""

    slot: str
    consistent_lsn: Lsn
    snapshot_name: str
    plugin: str


@contextlib.contextmanager
def exported_snapshot(
    connect_kwargs: Mapping[str, Any], slot: str, plugin: str = "pgoutput", temporary: bool = False,
    two_phase: bool = False, failover: bool = False,
) -> Iterator[ExportedSnapshot]:
    """Create ``slot`` over a replication connection with an exported snapshot.

    The snapshot stays importable (``SET TRANSACTION SNAPSHOT``) until the block ends; the
    replication connection is idle meanwhile, as PostgreSQL requires. A temporary slot is
    dropped when the block ends. ``failover`` (17+) makes the standbys that sync slots keep a copy,
    so the slot survives a promotion; the caller checks the server version first.
    """
    conn = psycopg2.connect(
        connection_factory=psycopg2.extras.LogicalReplicationConnection, **connect_kwargs
    )
    try:
        cursor = conn.cursor()
        parts = [sql.SQL("CREATE_REPLICATION_SLOT"), sql.Identifier(slot)]
        if temporary:
            parts.append(sql.SQL("TEMPORARY"))
        parts += [sql.SQL("LOGICAL"), sql.Identifier(plugin)]
        options = [sql.SQL("SNAPSHOT 'export'")]
        if two_phase:
            options.append(sql.SQL("TWO_PHASE"))
        if failover:
            options.append(sql.SQL("FAILOVER true"))
        parts.append(sql.SQL("({})").format(sql.SQL(", ").join(options)))
        try:
            cursor.execute(sql.SQL(" ").join(parts))
        except psycopg2.errors.DuplicateObject as err:
            raise SlotError(
                f"replication slot {slot!r} already exists: an initial sync needs a new slot. Drop it "
                "(PgLogicalHook.drop_slot) to re-snapshot from scratch, or use a backfill.", permanent=True,
            ) from err
        slot_name, consistent_point, snapshot_name, output_plugin = cursor.fetchone()
        log.info("created slot %s at consistent point %s (snapshot %s)", slot_name, consistent_point, snapshot_name)
        yield ExportedSnapshot(slot_name, Lsn.parse(consistent_point), snapshot_name, output_plugin)
    finally:
        conn.close()


def assert_slot_usable(cursor, name: str) -> SlotInfo:
    """The slot exists, is logical, is not invalidated and nobody else consumes it."""
    slot = get_slot(cursor, name)
    if slot is None:
        raise SlotError(f"replication slot {name!r} does not exist: run the initial sync first (it creates it)",
                        permanent=True)
    if slot.slot_type != "logical":
        raise SlotError(f"replication slot {name!r} is a {slot.slot_type} slot; a logical slot is needed",
                        permanent=True)
    if slot.invalidated:
        raise SlotError(
            f"replication slot {name!r} was invalidated ({invalidation_cause(slot)}). "
            "Drop it and re-snapshot (initial sync) to recover.", permanent=True,
        )
    if slot.active:
        raise SlotError(
            f"replication slot {name!r} is in use by another consumer (pid {slot.active_pid}); "
            "stop that consumer or use another slot"
        )
    return slot


def invalidation_cause(slot: SlotInfo) -> str:
    """Why ``slot`` was invalidated and what keeps it from happening again, in the user's words."""
    if slot.invalidation_reason == "idle_timeout":
        return ("invalidation_reason = idle_timeout: nothing consumed it for longer than "
                "idle_replication_slot_timeout; pull more often than that timeout, or raise it (0 disables it)")
    if slot.invalidation_reason in (None, "wal_removed"):
        return ("wal_status = lost: the WAL it needed was removed, see max_slot_wal_keep_size; pull more often, "
                "or raise max_slot_wal_keep_size (-1: no limit)")
    return f"invalidation_reason = {slot.invalidation_reason}"


def require_logical_wal(cursor) -> None:
    """Without ``wal_level = logical`` no slot can decode: say so, not "the slot does not exist"."""
    cursor.execute("SELECT current_setting('wal_level')")
    level = cursor.fetchone()[0]
    if level != "logical":
        raise SlotError(
            f"the publisher runs with wal_level = {level}, so no logical slot can exist or decode: set "
            "wal_level = logical (ALTER SYSTEM SET wal_level = logical) and restart the server, then run the "
            "initial sync again. Nothing was changed", permanent=True,
        )
