"""The warning before PostgreSQL invalidates a slot (management/monitoring.py), on its figures alone,
the metric names the figures are exported under (ui/metrics.py), and the staged-batches asset's
checks (triggers/staged_batches.py)."""

from __future__ import annotations

from airflow_provider_pglogical.management.monitoring import LossLimits, idle_share, loss_warnings, wal_keep_share
from airflow_provider_pglogical.management.slots import SlotInfo
from airflow_provider_pglogical.ui.metrics import _legacy

MB = 1024 * 1024


def slot(retained: int, active: bool = False) -> SlotInfo:
    return SlotInfo("s1", "pgoutput", "logical", "db", False, active, None, None, None, "reserved", False,
                    retained, 0)


def test_the_wal_share_is_the_retained_wal_or_what_safe_wal_size_says_is_gone_whichever_is_more():
    limits = LossLimits(10 * MB, 9 * MB, None, None)
    assert wal_keep_share(slot(1 * MB), limits) == 0.1
    # WAL goes a segment at a time: safe_wal_size can say the slot is closer than its retained bytes
    assert wal_keep_share(slot(1 * MB), LossLimits(10 * MB, 1 * MB, None, None)) == 0.9
    assert wal_keep_share(slot(12 * MB), LossLimits(10 * MB, -2 * MB, None, None)) == 1.0
    assert wal_keep_share(slot(12 * MB), LossLimits(None, None, None, None)) is None  # unlimited


def test_a_slot_near_its_wal_limit_is_warned_of_with_the_fix():
    assert loss_warnings("s1", slot(7 * MB), LossLimits(10 * MB, 3 * MB, None, None)) == []
    [warning] = loss_warnings("s1", slot(8 * MB), LossLimits(10 * MB, 2 * MB, None, None))
    assert warning.startswith("replication slot 's1' has used 80% of max_slot_wal_keep_size (10,485,760 bytes; "
                              "it retains 8,388,608 bytes of WAL, 2,097,152 more bytes of WAL and it is lost)")
    assert "Fix: pull now" in warning and "ALTER SYSTEM SET max_slot_wal_keep_size" in warning


def test_an_idle_slot_is_judged_at_the_next_scheduled_pull():
    hour = 3600.0
    # idle for 10 minutes, the next pull in 40: 50 of a 60-minute timeout is under 80%
    limits = LossLimits(None, None, hour, 600.0)
    assert idle_share(limits, 2400.0) == 0.8333 and idle_share(limits, None) == 0.1667
    assert loss_warnings("s1", slot(0), limits, until_next_pull=1800.0) == []
    [warning] = loss_warnings("s1", slot(0), limits, until_next_pull=2400.0)
    assert "has been idle for 600 s and reaches idle_replication_slot_timeout (3600 s) before the next " \
           "scheduled pull (in 2400 s)" in warning
    assert "ALTER SYSTEM SET idle_replication_slot_timeout" in warning and "Fix: pull now" in warning
    assert idle_share(LossLimits(None, None, None, 600.0), 2400.0) is None  # no timeout (before 18, or 0)


def test_metric_names_carry_the_tags_for_a_statsd_that_drops_them():
    assert _legacy("pglogical.table.freshness_seconds", {"pipeline": "shop", "table": "public.orders"}) == \
        "pglogical.table.freshness_seconds.shop.public__orders"
    assert _legacy("pglogical.slot.lag_bytes", {"pipeline": "odd name/1"}) == "pglogical.slot.lag_bytes.odd_name_1"


def test_the_staged_batches_asset_refuses_a_pipeline_or_root_it_could_not_watch():
    import pytest

    from airflow_provider_pglogical.exceptions import InvalidInputError
    from airflow_provider_pglogical.triggers.staged_batches import staged_batches_asset

    asset = staged_batches_asset("file:///data/staging", "shop", poll_interval=5)
    assert asset.name == "pglogical_staged_batches_shop" and asset.watchers[0].trigger.poll_interval == 5
    with pytest.raises(InvalidInputError, match=r"pipeline name '\.\./shop' is not a plain directory name"):
        staged_batches_asset("file:///data/staging", "../shop")
    with pytest.raises(InvalidInputError, match="staging"):
        staged_batches_asset("data/staging", "shop")
    with pytest.raises(InvalidInputError, match="poll_interval"):
        staged_batches_asset("file:///data/staging", "shop", poll_interval=0)
