"""When a frequent sync DAG also runs its Iceberg housekeeping: once every N hours, decided per run.

Plain datetimes in, a boolean out (no Airflow import): the example DAG's short-circuit task calls
:func:`maintenance_due` with the run's data interval. Housekeeping runs in the DAG run whose
interval holds a multiple of ``every`` counted from midnight UTC, 1 January 1970 (with 6 hours:
00:00, 06:00, 12:00 and 18:00 UTC), so contiguous intervals pick exactly one run per period.
"""

from __future__ import annotations

import datetime as dt

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def maintenance_due(data_interval_start: dt.datetime | None, data_interval_end: dt.datetime | None,
                    every: dt.timedelta) -> bool:
    """True when a boundary ``k * every`` lies in the interval ``(start, end]``.

    The interval is open at its start so that the next run, which starts where this one ended, does
    not pick the same boundary again. An empty interval (a cron schedule without ``interval``:
    start = end) is due only when it sits on a boundary. A run without a data interval (a manual
    run in Airflow 3) is never due.

    :param every: the period; a positive duration.
    """
    if _micros(every) <= 0:
        raise ValueError(f"the maintenance period must be positive (got {every})")
    if data_interval_start is None or data_interval_end is None:
        return False
    start, end, period = _micros(data_interval_start - EPOCH), _micros(data_interval_end - EPOCH), _micros(every)
    if start == end:
        return end % period == 0
    return end // period > start // period


def _micros(delta: dt.timedelta) -> int:
    """Whole microseconds of a duration (pendulum's durations too), for exact integer arithmetic."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
