"""When the sync DAG runs its housekeeping: once per period, decided from the run's data interval."""

from __future__ import annotations

import datetime as dt

import pendulum
import pytest

from airflow_provider_pglogical.lakehouse.maintenance_window import maintenance_due

SIX_HOURS = dt.timedelta(hours=6)
UTC = dt.timezone.utc


@pytest.mark.parametrize("start, end, due", [
    # the tick that ends on a boundary runs it; the one that starts there does not
    (dt.datetime(2026, 1, 1, 5, 50, tzinfo=UTC), dt.datetime(2026, 1, 1, 6, 0, tzinfo=UTC), True),
    (dt.datetime(2026, 1, 1, 6, 0, tzinfo=UTC), dt.datetime(2026, 1, 1, 6, 10, tzinfo=UTC), False),
    (dt.datetime(2026, 1, 1, 6, 10, tzinfo=UTC), dt.datetime(2026, 1, 1, 6, 20, tzinfo=UTC), False),
    (dt.datetime(2026, 1, 1, 23, 50, tzinfo=UTC), dt.datetime(2026, 1, 2, 0, 0, tzinfo=UTC), True),
    # a boundary inside the interval (ticks not aligned with it), in another time zone
    (pendulum.datetime(2026, 1, 1, 12, 57, tz="Europe/Paris"), pendulum.datetime(2026, 1, 1, 13, 7, tz="Europe/Paris"),
     True),
    # a long interval (the scheduler was down) still runs it once
    (dt.datetime(2026, 1, 1, 1, 0, tzinfo=UTC), dt.datetime(2026, 1, 1, 19, 0, tzinfo=UTC), True),
    # an empty interval (cron without interval) runs it only on the boundary
    (dt.datetime(2026, 1, 1, 18, 0, tzinfo=UTC), dt.datetime(2026, 1, 1, 18, 0, tzinfo=UTC), True),
    (dt.datetime(2026, 1, 1, 18, 7, tzinfo=UTC), dt.datetime(2026, 1, 1, 18, 7, tzinfo=UTC), False),
    # a manual run in Airflow 3 has no data interval
    (None, None, False),
])
def test_maintenance_is_due_once_per_period(start, end, due):
    assert maintenance_due(start, end, SIX_HOURS) is due


def test_contiguous_ticks_pick_exactly_one_run_per_period():
    tick = dt.timedelta(minutes=10)
    ends = [dt.datetime(2026, 1, 1, tzinfo=UTC) + tick * n for n in range(1, 6 * 24 * 2 + 1)]  # two days
    due = [end for end in ends if maintenance_due(end - tick, end, SIX_HOURS)]
    assert [end.strftime("%d %H:%M") for end in due] == [
        "01 06:00", "01 12:00", "01 18:00", "02 00:00", "02 06:00", "02 12:00", "02 18:00", "03 00:00"]
    with pytest.raises(ValueError, match="must be positive"):
        maintenance_due(ends[0], ends[1], dt.timedelta(0))
