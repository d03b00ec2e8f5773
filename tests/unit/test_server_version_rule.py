"""The publisher's version rule: 15 or later (row filters and column lists), failover slots 17 or later.

No server older than 15 is installed here, so the rule is checked on ``server_version_num`` values.
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.management import health


@pytest.mark.parametrize("version_num, shown", [(140013, "14.13"), (130000, "13.0"), (90624, "9.6")])
def test_a_server_below_15_is_refused_with_the_fix(version_num, shown):
    problem = health.version_problem(version_num)
    assert problem.startswith(f"the publisher runs PostgreSQL {shown}: the provider needs PostgreSQL 15 or later")
    assert "row filters and column lists" in problem and "upgrade the server" in problem


@pytest.mark.parametrize("version_num", [150000, 150008, 160002, 170000, 180001])
def test_15_and_later_pass(version_num):
    assert health.version_problem(version_num) is None



def test_the_idle_timeout_warns_under_a_day_or_under_three_pull_intervals_and_names_the_fix():
    from airflow_provider_pglogical.management.health import idle_timeout_warnings

    assert idle_timeout_warnings(0, "s") == []  # disabled
    assert idle_timeout_warnings(2 * 86400, "s") == []
    assert idle_timeout_warnings(2 * 86400, "s", pull_every=600) == []  # a pull every 10 minutes
    (short,) = idle_timeout_warnings(30, "min")
    assert short.startswith("idle_replication_slot_timeout is 30min, under a day:")
    assert "raise it to 1 day or more (ALTER SYSTEM SET idle_replication_slot_timeout = '1d')" in short
    # a daily DAG: two days is one late run away from losing the slot
    (daily,) = idle_timeout_warnings(2 * 86400, "s", pull_every=86400)
    assert "is 172800s, under 3 of the DAG's pull intervals (1 day each)" in daily
    assert "raise it to 3 days or more (ALTER SYSTEM SET idle_replication_slot_timeout = '3d')" in daily
    (odd,) = idle_timeout_warnings(86400, "s", pull_every=12 * 3600 + 60)
    assert "(ALTER SYSTEM SET idle_replication_slot_timeout = '2163min')" in odd


def test_the_schedule_interval_comes_from_the_runs_data_interval():
    import pendulum

    from airflow_provider_pglogical.operators.publication import schedule_interval_seconds

    start = pendulum.datetime(2026, 1, 1, tz="UTC")
    assert schedule_interval_seconds({"data_interval_start": start, "data_interval_end": start.add(hours=6)}) == 21600
    assert schedule_interval_seconds({"data_interval_start": start, "data_interval_end": start}) is None  # manual
    assert schedule_interval_seconds({}) is None
