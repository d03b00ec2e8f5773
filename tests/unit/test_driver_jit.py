"""The driver JVM gets C1 only for small pending work, and never over a JIT choice of the user's."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.lakehouse.driver_jit import (
    QUICK_JIT_OPTIONS,
    quick_jit_options,
    standing_driver_jit_options,
    user_chose_jit,
)


@pytest.mark.parametrize(("pending", "limit", "expected"), [
    (0, 100, QUICK_JIT_OPTIONS),
    (100, 100, QUICK_JIT_OPTIONS),
    (101, 100, ()),  # more work than the limit: C2 pays off
    (None, 100, ()),  # unknown (no apply marker): the JVM's default
    (5, None, ()),  # turned off
])
def test_quick_jit_only_for_small_known_work(pending, limit, expected):
    assert quick_jit_options(pending, limit, {}) == expected


@pytest.mark.parametrize("given", [
    "-XX:TieredStopAtLevel=4", "-XX:-TieredCompilation", "-Xint", "-Xmx1g -XX:CICompilerCount=2",
])
def test_a_jit_option_of_the_users_stands(given):
    conf = {"spark.driver.extraJavaOptions": given}
    assert user_chose_jit(conf)
    assert quick_jit_options(1, 100, conf) == ()


def test_other_java_options_do_not_count_as_a_jit_choice():
    conf = {"spark.driver.extraJavaOptions": "-Xshare:on -XX:SharedArchiveFile=/tmp/a.jsa -Dfoo=bar"}
    assert not user_chose_jit(conf)
    assert quick_jit_options(1, 100, conf) == QUICK_JIT_OPTIONS


def test_a_standing_driver_compiles_with_c1_only_unless_turned_off_or_set_by_the_user():
    assert standing_driver_jit_options(100_000, {}) == QUICK_JIT_OPTIONS  # whatever the next tick's size
    assert standing_driver_jit_options(None, {}) == ()
    assert standing_driver_jit_options(100_000, {"spark.driver.extraJavaOptions": "-XX:CICompilerCount=4"}) == ()
