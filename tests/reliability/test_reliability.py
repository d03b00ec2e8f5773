"""The reliability harness: short seeded mode in CI, the long mode on demand.

Short mode (default ``pytest`` run): a few thousand changes in two rounds that together hit
every kill point once (the chunked load's on the first newer server, whose set-up loads in chunks);
the seed is printed on failure. Long mode (deselected by default):
``pytest tests/reliability -m slow`` or ``python -m tests.reliability.harness --rounds N --changes M
--seed S``.
"""

from __future__ import annotations

import json
import os
import random
import uuid

import pytest

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from tests.conftest import test_server_versions
from tests.reliability.harness import (
    KILL_POINTS, NAMESPACE, SERVER_KILL_POINTS, SETUP_KILL_POINTS, Harness, ObjectStoreLakehouse, long_schedule,
    short_schedule,
)
from tests.support.databases import drop_database, new_database
from tests.support.object_store import start_s3_server

pytestmark = [pytest.mark.spark, pytest.mark.reliability]

SEED = int(os.environ.get("PGLOGICAL_RELIABILITY_SEED", "20261123"))


@pytest.fixture
def harness_spark(tmp_path):
    """The harness's in-process session: the applies nobody kills and verify's comparisons run in
    it, the killed applies are spark-submitted (their process is what gets killed)."""
    spark = Harness.session(tmp_path)
    yield spark
    spark.stop()


def test_short_mode_every_kill_point_then_equal(publisher, subscriber, tmp_path, harness_spark):
    harness = Harness(publisher, subscriber, tmp_path, SEED, spark=harness_spark)
    harness.reproduce = f"PGLOGICAL_RELIABILITY_SEED={SEED} pytest tests/reliability -q"
    harness.setup(initial_rows=200)
    for kills, truncate in short_schedule():
        harness.round(1500, kills, truncate=truncate)
    figures = harness.figures
    print(f"seed {SEED}: {figures.counts.changes} changes, kills {figures.kills}, missed {figures.missed}")
    missing = set(KILL_POINTS) - set(figures.kills) - {"chunked_load_mid_chunk"}  # the chunked set-up's: below
    assert not missing, f"[seed {SEED}] kill points not hit: {missing}; missed {figures.missed}"
    assert figures.verified_rounds == figures.rounds == len(short_schedule())
    assert harness.shapes.rounds == figures.rounds  # every round ran issue 33's DDL shapes, then verified equal
    assert harness.events.history, "no change to what the source publishes ran (issue 47's events)"
    print(f"seed {SEED}: issue 47 events {harness.events.history}")
    assert figures.linked_orphans > 0  # the adoption's kill before its commit came after its hard links
    assert figures.compared_tables >= 2 * figures.rounds and figures.differing_tables == 0
    # retention removed history along the way (every apply runs it at 0 hours), and still equal
    assert harness.removed_batches() > 0


NEWER_SERVERS = test_server_versions()[1:]  # the oldest runs every kill point above but the chunked load's
#: the newer server whose set-up is the chunked load (snapshot_mode="chunked"), killed mid-chunk
CHUNKED_SERVER = NEWER_SERVERS[0] if NEWER_SERVERS else None


@pytest.mark.parametrize("pg_version", NEWER_SERVERS, ids=[f"pg{v}" for v in NEWER_SERVERS])
def test_short_mode_server_kill_points_on_newer_servers(publisher, subscriber, tmp_path, harness_spark, pg_version):
    """The kill points whose outcome the server decides (a snapshot, a pull or a backfill killed
    mid-way, then resumed) on 16 and 18; the apply's kill points are the lakehouse's, run above.
    On :data:`CHUNKED_SERVER` the set-up is the chunked load, killed inside a chunk while the workload
    writes, resumed (its keyless tables loaded whole), then every round compared with the native
    subscriber as always; on the others the exported snapshot's copy is killed."""
    chunked = pg_version == CHUNKED_SERVER
    harness = Harness(publisher, subscriber, tmp_path, SEED + pg_version, spark=harness_spark)
    harness.reproduce = f"PGLOGICAL_RELIABILITY_SEED={SEED} pytest tests/reliability -q -k pg{pg_version}"
    harness.setup(initial_rows=200, adopt_kills=False, snapshot_mode="chunked" if chunked else "exported")
    harness.round(1500, set(SERVER_KILL_POINTS) - set(SETUP_KILL_POINTS), truncate=True)
    figures = harness.figures
    assert publisher.query("SELECT current_setting('server_version_num')::int / 10000")[0][0] == pg_version
    setup_kill = "chunked_load_mid_chunk" if chunked else "initial_sync_mid_copy"
    assert set(figures.kills) == set(SERVER_KILL_POINTS) - set(SETUP_KILL_POINTS) | {setup_kill}, \
        (figures.kills, figures.missed)
    if chunked:  # the keyless tables, loaded whole in snapshots of their own, and equal after the round
        assert {"public.audit", "public.bag"} <= set(figures.whole_tables), figures.whole_tables
    assert figures.verified_rounds == figures.rounds == 1 and figures.differing_tables == 0
    assert harness.removed_batches() > 0


#: the kill points whose outcome the lakehouse decides: the apply's and the adoption's
LAKEHOUSE_KILL_POINTS = ("adopt_before_commit", "adopt_after_commit", "apply_before_state", "apply_mid_merge")


def test_short_mode_lakehouse_kill_points_on_s3_with_a_jdbc_catalog(publisher, subscriber, publisher_cluster,
                                                                    tmp_path, monkeypatch):
    """The lakehouse's kill points once, in one round, on the production shape: staging and the
    warehouse on an S3 server (moto's, on loopback), Iceberg's JDBC catalog in a database of the
    publisher's cluster. Killed applies are spark-submits with the credentials in their private
    properties file; the others and verify run in the harness's session. The server's kill points
    do not depend on the lakehouse: the local-disk tests above run them."""
    secret = f"rel-secret-{uuid.uuid4().hex}"
    server = start_s3_server()
    catalog = new_database(publisher_cluster, "catalog", monkeypatch.setenv)
    spark = None
    try:
        bucket = f"rel-{uuid.uuid4().hex[:8]}"  # a bucket of its own: S3A's file systems outlive a session
        server.create_bucket(bucket)
        monkeypatch.setenv("AIRFLOW_CONN_REL_LAKE_S3", json.dumps(
            {"conn_type": "aws", "login": "rel-key", "password": secret, "extra": {"endpoint_url": server.endpoint}}))
        lakehouse = ObjectStoreLakehouse(f"s3://rel_lake_s3@{bucket}/staging", IcebergConfig(
            catalog_type="jdbc", catalog_conn_id=catalog.conn_id, warehouse=f"s3a://{bucket}/warehouse",
            storage_conn_id="rel_lake_s3", namespace=NAMESPACE))
        spark = Harness.session(tmp_path, lakehouse)
        harness = Harness(publisher, subscriber, tmp_path, SEED, spark=spark, lakehouse=lakehouse, shapes=False)
        harness.reproduce = f"PGLOGICAL_RELIABILITY_SEED={SEED} pytest tests/reliability -q -k s3"
        harness.setup(initial_rows=200, kill=False)  # both adoption kill points, then the first apply
        harness.round(500, {"apply_before_state", "apply_mid_merge"})
        figures = harness.figures
        print(f"seed {SEED} on S3 + JDBC: {figures.counts.changes} changes, kills {figures.kills}, "
              f"missed {figures.missed}, {figures.spark_submits} spark-submits, {figures.in_session} in session")
        assert set(figures.kills) == set(LAKEHOUSE_KILL_POINTS), (figures.kills, figures.missed)
        assert figures.verified_rounds == figures.rounds == 1
        assert figures.compared_tables >= 2 and figures.differing_tables == 0
        assert harness.removed_batches() > 0  # retention removed applied batches from the bucket
        # it all happened on the S3 server and in the JDBC catalog, not on the local disk
        assert any(key.startswith("warehouse/rel/") and "/data/" in key for key in server.keys(bucket, "warehouse/"))
        assert server.keys(bucket, "staging/rel/")
        assert not (tmp_path / "warehouse").exists() and not (tmp_path / "staging").exists()
        tables = {name for (name,) in catalog.query("SELECT table_name FROM iceberg_tables WHERE table_namespace = %s",
                                                    (NAMESPACE,))}
        assert "_pglogical_state" in tables and len(tables) > 2, tables
        # the killed applies' logs (spark-submit's whole output) hold neither secret
        logs = [path.read_text() for path in (tmp_path / "logs").glob("apply-*.log")]
        assert len(logs) == figures.spark_submits == len(LAKEHOUSE_KILL_POINTS)
        assert not [log for log in logs if secret in log or catalog.cluster.password in log]
    finally:
        if spark is not None:
            spark.stop()
        server.stop()
        drop_database(catalog)


@pytest.mark.slow  # deselected by default (pyproject addopts); run with -m slow
def test_long_mode(publisher, subscriber, tmp_path):
    rounds = int(os.environ.get("PGLOGICAL_RELIABILITY_ROUNDS", "10"))
    changes = int(os.environ.get("PGLOGICAL_RELIABILITY_CHANGES", "10000"))
    harness = Harness(publisher, subscriber, tmp_path, SEED)
    harness.reproduce = (f"PGLOGICAL_RELIABILITY_SEED={SEED} PGLOGICAL_RELIABILITY_ROUNDS="
                         f"{rounds} PGLOGICAL_RELIABILITY_CHANGES={changes} pytest tests/reliability -m slow")
    harness.setup(initial_rows=2000)
    schedule = long_schedule(rounds, random.Random(SEED))
    for kills, truncate in schedule:
        harness.round(changes, kills, truncate=truncate)
    figures = harness.figures
    assert figures.counts.changes >= rounds * changes
    # every round compared with the native subscriber and found no difference
    assert figures.verified_rounds == figures.rounds == rounds
    assert figures.compared_tables >= 2 * rounds and figures.differing_tables == 0
    # every kill the schedule asked for was attempted, and each kill point really killed at least once
    scheduled = [point for kills, _ in schedule for point in kills]
    for point in set(scheduled):
        attempts = figures.kills.get(point, 0) + figures.missed.get(point, 0)
        assert attempts >= scheduled.count(point), (point, figures.kills, figures.missed)
        assert figures.kills.get(point, 0) >= 1, f"[seed {SEED}] kill point {point} never hit: {figures.missed}"
