"""Slot and subscription health, as plain data for sensors, triggers and the demo's summary."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_pglogical.management.slots import SlotInfo, get_slot, invalidation_cause
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


#: the share of a limit (``max_slot_wal_keep_size``, ``idle_replication_slot_timeout``) a slot may use
#: before the pipeline warns that PostgreSQL will invalidate it: the warning comes while a pull still saves it
LOSS_WARNING_SHARE = 0.8

# One row per slot: the WAL limit (MB, -1 = unlimited), PostgreSQL's safe_wal_size, 18's idle timeout in
# seconds (0 = off; the unit changed during 18's betas, so it is read with pg_settings' unit), and how long
# the slot has been idle (17+: inactive_since; NULL while a consumer holds it, and on 15/16).
_LIMITS = """
SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
       s.safe_wal_size,
       (SELECT setting::float8 * CASE unit WHEN 'min' THEN 60 WHEN 'h' THEN 3600 WHEN 'ms' THEN 0.001 ELSE 1 END
          FROM pg_settings WHERE name = 'idle_replication_slot_timeout'),
       extract(epoch FROM now() - (to_jsonb(s) ->> 'inactive_since')::timestamptz)::float8
  FROM pg_replication_slots s
 WHERE slot_name = %s
"""


@dataclass(frozen=True)
class LossLimits:
    """How close PostgreSQL is to invalidating a slot: its WAL limit and its idle timeout."""

    #: ``max_slot_wal_keep_size`` in bytes; None when unlimited (-1)
    max_slot_wal_keep_size_bytes: int | None
    #: WAL that can still be written before the slot is lost (``safe_wal_size``); None when unlimited
    safe_wal_size_bytes: int | None
    #: ``idle_replication_slot_timeout`` (18) in seconds; None when off or before 18
    idle_timeout_seconds: float | None
    #: seconds since a consumer last released the slot (17+); None while one holds it
    idle_seconds: float | None


def loss_limits(cursor, slot: str) -> LossLimits:
    """The publisher's limits on ``slot`` (which must exist)."""
    cursor.execute(_LIMITS, (slot,))
    row = cursor.fetchone()
    limit_mb, safe, timeout, idle = row if row else (None, None, None, None)
    return LossLimits(None if limit_mb is None or limit_mb < 0 else limit_mb * 1024 * 1024, safe,
                      timeout or None, idle)


def wal_keep_share(slot: SlotInfo, limits: LossLimits) -> float | None:
    """The share of ``max_slot_wal_keep_size`` the slot has used: its retained WAL, or what
    ``safe_wal_size`` says is gone, whichever is more (WAL is removed by whole segments, so a slot
    can be closer to the limit than its retained bytes say). None when the WAL is unlimited."""
    keep = limits.max_slot_wal_keep_size_bytes
    if not keep:
        return None
    used = [(slot.retained_wal_bytes or 0) / keep]
    if limits.safe_wal_size_bytes is not None:
        used.append(1 - limits.safe_wal_size_bytes / keep)
    return round(min(1.0, max(0.0, *used)), 4)


def idle_share(limits: LossLimits, until_next_pull: float | None) -> float | None:
    """How much of ``idle_replication_slot_timeout`` the slot will have spent idle at the next pull
    (``until_next_pull`` seconds from now; None: now). None when there is no timeout."""
    if not limits.idle_timeout_seconds:
        return None
    idle = (limits.idle_seconds or 0.0) + (until_next_pull or 0.0)
    return round(idle / limits.idle_timeout_seconds, 4)


def loss_warnings(name: str, slot: SlotInfo, limits: LossLimits, until_next_pull: float | None = None,
                  share: float = LOSS_WARNING_SHARE) -> list[str]:
    """What will invalidate the slot unless someone acts, each with its fix; empty when safe.

    :param until_next_pull: seconds until the pipeline's next scheduled pull, when known.
    :param share: warn once this share of a limit is used (:data:`LOSS_WARNING_SHARE`).
    """
    warnings = []
    wal = wal_keep_share(slot, limits)
    if wal is not None and wal >= share:
        safe = limits.safe_wal_size_bytes
        warnings.append(
            f"replication slot {name!r} has used {wal:.0%} of max_slot_wal_keep_size "
            f"({limits.max_slot_wal_keep_size_bytes:,} bytes; it retains {slot.retained_wal_bytes or 0:,} bytes of WAL"
            + (f", {max(safe, 0):,} more bytes of WAL and it is lost" if safe is not None else "")
            + "): PostgreSQL invalidates it at a checkpoint past the limit and the pipeline then needs a resync. "
            "Fix: pull now (run the pull task), then pull more often or with larger windows (max_changes), or "
            "raise the limit (ALTER SYSTEM SET max_slot_wal_keep_size = '<more>'; SELECT pg_reload_conf()); "
            "see docs/metrics.md#before-the-slot-is-lost")
    idle = idle_share(limits, until_next_pull)
    if idle is not None and idle >= share:
        timeout = limits.idle_timeout_seconds
        when = ("before the next scheduled pull" if until_next_pull else "soon")
        warnings.append(
            f"replication slot {name!r} has been idle for {limits.idle_seconds or 0:.0f} s and reaches "
            f"idle_replication_slot_timeout ({timeout:g} s) {when}"
            + (f" (in {until_next_pull:.0f} s)" if until_next_pull else "")
            + ": PostgreSQL invalidates it at the next checkpoint after that and the pipeline then needs a resync. "
            "Fix: pull now (run the pull task), schedule pulls more often than the timeout, or raise it "
            "(ALTER SYSTEM SET idle_replication_slot_timeout = '<more>'; SELECT pg_reload_conf(); 0 turns it off); "
            "see docs/metrics.md#before-the-slot-is-lost")
    return warnings


def slot_status(cursor, name: str, max_retained_wal_bytes: int | None = None, max_lag_bytes: int | None = None,
                until_next_pull: float | None = None, share: float = LOSS_WARNING_SHARE) -> dict:
    """The slot's health (:func:`slot_health`), its limits and the warnings before its loss: what
    the sensor, the pipeline view and the metrics all read, computed here once.

    Adds ``max_slot_wal_keep_size_bytes``, ``safe_wal_size_bytes``, ``idle_timeout_seconds``,
    ``idle_seconds``, ``wal_keep_share``, ``idle_share`` and ``warnings`` (a list, each naming its fix)
    to a slot that exists.
    """
    info = get_slot(cursor, name)
    status = slot_health(info, name, max_retained_wal_bytes, max_lag_bytes)
    if info is None:
        return status
    limits = loss_limits(cursor, name)
    status.update({
        "max_slot_wal_keep_size_bytes": limits.max_slot_wal_keep_size_bytes,
        "safe_wal_size_bytes": limits.safe_wal_size_bytes, "idle_timeout_seconds": limits.idle_timeout_seconds,
        "idle_seconds": limits.idle_seconds, "wal_keep_share": wal_keep_share(info, limits),
        "idle_share": idle_share(limits, until_next_pull),
        "warnings": [] if info.invalidated else loss_warnings(name, info, limits, until_next_pull, share),
    })
    return status
