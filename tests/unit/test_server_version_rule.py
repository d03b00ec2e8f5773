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

