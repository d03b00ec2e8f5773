"""The driver JVM gets C1 only for small pending work, and never over a JIT choice of the user's."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from airflow_provider_pglogical.lakehouse.driver_jit import (
    QUICK_JIT_OPTIONS,
    quick_jit_options,
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
    "-XX:ReservedCodeCacheSize=64m",
])
def test_a_jit_option_of_the_users_stands(given):
    conf = {"spark.driver.extraJavaOptions": given}
    assert user_chose_jit(conf)
    assert quick_jit_options(1, 100, conf) == ()


def test_other_java_options_do_not_count_as_a_jit_choice():
    conf = {"spark.driver.extraJavaOptions": "-Xshare:on -XX:SharedArchiveFile=/tmp/a.jsa -Dfoo=bar"}
    assert not user_chose_jit(conf)
    assert quick_jit_options(1, 100, conf) == QUICK_JIT_OPTIONS


def _code_cache_bytes(options: tuple[str, ...]) -> int:
    flags = subprocess.run([shutil.which("java"), *options, "-XX:+PrintFlagsFinal", "-version"],
                           capture_output=True, text=True, check=True).stdout
    return int(re.search(r"\bReservedCodeCacheSize\s*=\s*(\d+)", flags).group(1))


def test_c1_only_keeps_the_code_cache_of_tiered_compilation():
    # the JVM itself says: stopped at level 1 alone it reserves 48 MB, which a long-lived JVM
    # (a long test session) fills, and then fails; the options keep tiered compilation's size
    assert _code_cache_bytes(("-XX:TieredStopAtLevel=1",)) < 64 * 2**20
    assert _code_cache_bytes(QUICK_JIT_OPTIONS) >= _code_cache_bytes(()) >= 240 * 2**20
