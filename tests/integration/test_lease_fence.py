"""The apply lease on a catalog whose commit does not compare the base metadata (issue 48).

A REST server checks only the requirements an update carries, and a change of table properties
alone carries none. Two applies taking the lease at the same instant both succeeded: the later
replaced the earlier's lease while the earlier went on, and only Iceberg's validation of their data
commits stopped one of them. Each lease commit on such a catalog now carries a fence (an empty
snapshot of main, which requires main unchanged: ``lease.ApplyLease._fence``). The race is made
exact here: apply A reads the lease, apply B takes it whole, then A commits what it read. A real
REST catalog server and object store on loopback, and Spark's Iceberg in this process.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from airflow_provider_pglogical.lakehouse.catalog_kinds import CatalogKind
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.lakehouse_access import job_access
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.common.identifiers import qualified
from airflow_provider_pglogical.spark.apply.lease import FENCE_SUMMARY_PROPERTY, ApplyLease, ApplyLeaseHeld
from airflow_provider_pglogical.staging.contract import APPLY_LEASE_PROPERTY_PREFIX, STATE_TABLE
from tests.support.catalogs import lakehouse_on, start_test_rest_catalog
from tests.support.object_store import start_s3_server
from tests.support.spark_jobs import applying_session

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def lakehouses(tmp_path_factory):
    """One Spark session with two Iceberg catalogs: ``lease_rest`` (a REST server, its warehouse
    on S3) and ``lease_hadoop`` (a Hadoop catalog in a directory, whose commit is a compare-and-swap)."""
    with pytest.MonkeyPatch.context() as patch:
        s3 = start_s3_server()
        rest = start_test_rest_catalog(s3, "lake-lease")
        try:
            under = lakehouse_on(CatalogKind.REST, s3, patch.setenv, namespace="leases", bucket="lake-lease", rest=rest)
            access = job_access(dataclasses.replace(under.iceberg, catalog="lease_rest"))
            hadoop = IcebergConfig(warehouse=tmp_path_factory.mktemp("warehouse").as_uri(), catalog="lease_hadoop")
            access.public.update(hadoop.spark_conf())
            session = applying_session(None, "test-lease-fence", access=access)
            yield session
            session.stop()
        finally:
            rest.server.stop()
            rest.server.log_path.unlink(missing_ok=True)
            s3.stop()


def lease_of(lakehouse: Lakehouse, pipeline: str) -> dict | None:
    value = lakehouse.state.state_table().properties().get(APPLY_LEASE_PROPERTY_PREFIX + pipeline)
    return json.loads(value) if value else None


def state_snapshots(lakehouse: Lakehouse) -> list[dict]:
    """The state table's snapshots' summaries, oldest first."""
    table = lakehouse.state.state_table()
    return [dict(snapshot.summary()) for snapshot in table.snapshots()]


@pytest.mark.parametrize("catalog", ["lease_rest", "lease_hadoop"])
def test_a_lease_taken_between_anothers_read_and_commit_refuses_that_commit(lakehouses, catalog):
    lakehouse = Lakehouse(lakehouses, catalog, "leases", "merge-on-read", None)
    lakehouse.state.state_table()  # created before the race, as the job's read of the state does
    before = state_snapshots(lakehouse)
    first = ApplyLease(lakehouses, lakehouse, "p", 60, holder="apply A")
    second = ApplyLease(lakehouses, lakehouse, "p", 60, holder="apply B")
    take = first._take

    def take_while_the_other_takes_it(lease: dict | None):
        wanted = take(lease)  # A decided on what it read: no lease, so it takes one
        if second.expires_at == 0:  # B takes the lease whole before A commits (once)
            second.acquire()
        return wanted

    first._take = take_while_the_other_takes_it
    with pytest.raises(ApplyLeaseHeld, match="apply B"):
        first.acquire()
    try:
        assert lease_of(lakehouse, "p")["id"] == second.id  # B's lease stands: A's commit was refused
    finally:
        second.release()
    assert lease_of(lakehouse, "p") is None
    after = state_snapshots(lakehouse)
    if catalog == "lease_rest":
        # B's take and release, each fenced by an empty snapshot of main; A's refused fence is no snapshot
        assert [s.get(FENCE_SUMMARY_PROPERTY) for s in after[len(before):]] == ["take", "release"]
        assert all(s.get("added-data-files", "0") == "0" and s["total-records"] == "0" for s in after)
    else:  # the catalog's commit compares the base itself: no fence, no snapshot
        assert after == before


def test_a_fence_changes_no_rows_of_the_state_table(lakehouses):
    lakehouse = Lakehouse(lakehouses, "lease_rest", "rows", "merge-on-read", None)
    table = qualified("lease_rest", "rows", STATE_TABLE)
    lakehouse.state.state_table()
    lakehouses.sql(f"INSERT INTO {table} VALUES ('p', 'public.t', 't', '0000000000000010', array('s1'), 'b1', "
                   "current_timestamp())")
    rows = sorted(tuple(r) for r in lakehouses.table(table).select("pipeline", "source_table", "position").collect())
    with ApplyLease(lakehouses, lakehouse, "p", 60, holder="apply A") as lease:
        lease.promise(30)
        assert lease_of(lakehouse, "p")["id"] == lease.id
    assert sorted(tuple(r) for r in lakehouses.table(table).select("pipeline", "source_table", "position").collect()) == rows
    assert [s.get(FENCE_SUMMARY_PROPERTY) for s in state_snapshots(lakehouse)][-3:] == ["take", "promise", "release"]
