"""Slot and subscription health, as plain data for sensors, triggers and the demo's summary."""

from __future__ import annotations

from airflow_provider_pglogical.management.slots import SlotInfo, invalidation_cause
from airflow_provider_pglogical.management.subscriptions import SubscriptionStatus

RECOVERY = (
    "docs/troubleshooting.md#invalidated-slot: drop the slot and re-snapshot (run the pipeline's initial "
    "sync again with a new slot, or PgBackfillOperator per table)"
)


def slot_health(slot: SlotInfo | None, name: str, max_retained_wal_bytes: int | None,
                max_lag_bytes: int | None) -> dict:
    """Classify a slot: ``missing``, ``invalidated``, ``breach``, ``busy`` (another consumer) or ``ok``."""
    if slot is None:
        return {"state": "missing", "slot": name,
                "message": f"replication slot {name!r} does not exist: run the initial sync to create it"}
    metrics = {
        "slot": name, "active": slot.active, "wal_status": slot.wal_status,
        "invalidation_reason": slot.invalidation_reason,
        "retained_wal_bytes": slot.retained_wal_bytes, "lag_bytes": slot.lag_bytes,
        "confirmed_flush_lsn": str(slot.confirmed_flush_lsn) if slot.confirmed_flush_lsn else None,
        "restart_lsn": str(slot.restart_lsn) if slot.restart_lsn else None,
    }
    if slot.invalidated:
        return {**metrics, "state": "invalidated",
                "message": f"replication slot {name!r} was invalidated ({invalidation_cause(slot)}). "
                           f"Changes are lost for it; recover with {RECOVERY}"}
    breaches = []
    if max_retained_wal_bytes is not None and (slot.retained_wal_bytes or 0) > max_retained_wal_bytes:
        breaches.append(f"retains {slot.retained_wal_bytes:,} bytes of WAL (limit {max_retained_wal_bytes:,})")
    if max_lag_bytes is not None and (slot.lag_bytes or 0) > max_lag_bytes:
        breaches.append(f"is {slot.lag_bytes:,} bytes behind (limit {max_lag_bytes:,})")
    if breaches:
        return {**metrics, "state": "breach",
                "message": f"replication slot {name!r} " + " and ".join(breaches) + ": pull more often or with "
                           "larger windows (max_changes); see docs/troubleshooting.md#slot-wal-growth"}
    if slot.active:
        return {**metrics, "state": "busy", "message": f"replication slot {name!r} is in use (pid {slot.active_pid})"}
    return {**metrics, "state": "ok", "message": f"replication slot {name!r} is healthy"}


def subscription_health(status: SubscriptionStatus | None, name: str) -> dict:
    """Classify a subscription: ``missing``, ``waiting`` (tables still syncing) or ``ready``."""
    if status is None:
        return {"state": "missing", "message": f"subscription {name!r} does not exist"}
    pending = [f"{t.table} ({t.state})" for t in status.tables if t.state != "r"]
    return {
        "state": "ready" if status.ready else "waiting", "subscription": name,
        "tables": {t.table: t.state for t in status.tables}, "pending": pending,
        "apply_error_count": status.apply_error_count, "sync_error_count": status.sync_error_count,
        "message": f"subscription {name!r}: " + ("every table is ready" if status.ready
                                                  else f"waiting for {', '.join(pending) or 'tables'}"),
    }


_HEADROOM = """
SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
       (SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = %s)
"""


def wal_headroom(cursor, slot: str) -> dict:
    """How much more WAL the slot may hold before PostgreSQL invalidates it.

    ``max_slot_wal_keep_size_bytes``: None when unlimited (-1); ``safe_wal_size_bytes``: WAL that can
    still be written before the slot is lost (PostgreSQL's ``safe_wal_size``; None when unlimited).
    """
    cursor.execute(_HEADROOM, (slot,))
    limit_mb, safe = cursor.fetchone()
    return {"max_slot_wal_keep_size_bytes": None if limit_mb is None or limit_mb < 0 else limit_mb * 1024 * 1024,
            "safe_wal_size_bytes": safe}
