"""The server matrix itself: the suite runs on the versions it says it runs on."""

from __future__ import annotations

import os

from tests.conftest import test_server_versions


def test_the_cluster_runs_the_version_the_test_is_named_for(publisher, pg_version):
    (version_num,) = publisher.query("SELECT current_setting('server_version_num')::int")[0]
    assert version_num // 10000 == pg_version
    assert publisher.query("SHOW wal_level") == [("logical",)]


def test_the_set_up_installs_every_supported_server():
    """15 from Debian, 16 and 18 from registry wheels: a missing install step must fail here, not
    shrink the matrix silently."""
    if os.environ.get("PGLOGICAL_TEST_PG_VERSIONS"):
        return  # a developer chose fewer versions on purpose
    assert {15, 16, 18} <= set(test_server_versions())
