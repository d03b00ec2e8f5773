"""How many requests the apply makes of a REST catalog, counted by the real catalog (issue 48).

Each request to a REST catalog is a round trip to a service, tens of milliseconds on a real one,
and the loopback fixture's request log (Jetty's, ``RestCatalogOnLoopback.java``) counts them by
route. A round of the apply reads the state table, commits each table's step and then the state,
under the lease; a window polls staging for new batches between rounds. What is done needlessly is
bounded here: the metrics reports Iceberg's
REST client POSTs after every scan and commit (off by default: ``CatalogSpec.defaults``), a second
load of the table after each driver commit only to learn its snapshot id (``committed_snapshot``),
the lease's read-back after a fenced take, a read of the state at the snapshot the run wrote itself,
and a HEAD of every batch's manifest at each listing of staging (S3A). The REST fixture, moto's S3,
S3A and Spark's Iceberg are real; nothing is mocked.
"""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_provider_pglogical.embedded.request_logs import RequestLog, counted, rest_route, s3_kind
from airflow_provider_pglogical.lakehouse.catalog_kinds import CatalogKind
from airflow_provider_pglogical.lakehouse.lakehouse_access import job_access
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.apply.lease import ApplyLease
from airflow_provider_pglogical.spark.apply.plan import TableState
from airflow_provider_pglogical.spark.common.hadoop_files import Staging
from airflow_provider_pglogical.spark.row_delta.driver_commits import committed_snapshot
from tests.support.catalogs import lakehouse_on, start_test_rest_catalog
from tests.support.object_store import start_s3_server
from tests.support.spark_jobs import applying_session

pytestmark = pytest.mark.spark

LOAD = "GET /v1/namespaces/{ns}/tables/{table}"
COMMIT = "POST /v1/namespaces/{ns}/tables/{table}"
METRICS = "POST /v1/namespaces/{ns}/tables/{table}/metrics"


@pytest.fixture(scope="module")
def counted_lake(tmp_path_factory):
    """A Spark session whose catalog ``lake`` is the REST fixture (warehouse on moto's S3 through
    S3FileIO), configured as the apply job's (``job_access``), the fixture's request log and moto's."""
    with pytest.MonkeyPatch.context() as patch:
        s3 = start_s3_server(log_path=tmp_path_factory.mktemp("s3") / "requests.log")
        rest = start_test_rest_catalog(s3, "lake-requests")
        try:
            under = lakehouse_on(CatalogKind.REST, s3, patch.setenv, namespace="counted", bucket="lake-requests",
                                 rest=rest)
            session = applying_session(None, "test-rest-requests", access=job_access(under.iceberg))
            # the apply job's catalog caches its tables (Spark's default); a session an earlier test
            # built in this process may have switched that off (PySpark's builder keeps options)
            session.conf.set("spark.sql.catalog.lake.cache-enabled", "true")
            lakehouse = Lakehouse(session, "lake", "counted", "merge-on-read", None)
            lakehouse.state.read_state("p")  # creates the state table and loads it: what every run does first
            yield (lakehouse, Settled(RequestLog(rest.server.log_path, fixture=True), rest.server.uri),
                   Settled(RequestLog(s3.log_path, fixture=False), s3.endpoint), s3)
            session.stop()
        finally:
            rest.server.stop()
            rest.server.log_path.unlink(missing_ok=True)
            s3.stop()


class Settled:
    """A server's request log, counted once the server logged every request answered before."""

    def __init__(self, log: RequestLog, server: str) -> None:
        self.log, self.server = log, server

    def mark(self) -> None:
        self.log.mark(self.server)

    def since_mark(self):
        return self.log.since_mark(self.server)


def requests_of(log: Settled, action) -> Counter:
    """The REST requests ``action()`` made, by route."""
    log.mark()
    action()
    return counted(log.since_mark(), rest_route)


def test_a_rounds_state_read_and_commit_make_one_commit_two_loads_and_no_metrics_report(counted_lake):
    lakehouse, log, _, _ = counted_lake

    def state_round() -> None:
        states = lakehouse.state.read_state("p")
        states["public.t"] = TableState("t", 16, set(), "b1")
        lakehouse.state.write_state("p", states)

    made = requests_of(log, state_round)
    # the commit's own load of the table (Iceberg's optimistic commit) and the one its listeners
    # make afterwards; before: a metrics report after the read and the commit, and a third load
    assert made[COMMIT] == 1 and made[LOAD] <= 2 and METRICS not in made, made
    assert sum(made.values()) <= 3, made
    table = lakehouse.state.state_table()
    assert lakehouse.state._state_snapshots["p"] == table.currentSnapshot().snapshotId()  # the commit's own


def test_the_lease_taken_and_released_makes_a_load_and_a_commit_each(counted_lake):
    lakehouse, log, _, _ = counted_lake

    def lease() -> None:
        with ApplyLease(lakehouse.spark, lakehouse, "p", 60, holder="counted"):
            pass

    log.mark()
    lease()
    served = log.since_mark()
    made = counted(served, rest_route)
    # each fenced lease change: the fence's load of the table, then the commit; no read-back of the take
    assert made == Counter({LOAD: 2, COMMIT: 2}), served


def test_the_snapshot_a_commit_made_is_the_one_iceberg_reports_for_it(counted_lake):
    lakehouse, _, _, _ = counted_lake
    spark = lakehouse.spark
    table = lakehouse.state.state_table()
    update = table.newFastAppend().set("pglogical.test", "committed-snapshot")
    update.commit()
    found = committed_snapshot(spark, update)
    assert found == table.currentSnapshot().snapshotId() == update.updateEvent().snapshotId()
    assert table.snapshot(found).summary().get("pglogical.test") == "committed-snapshot"


def test_a_windows_next_state_read_at_the_snapshot_it_wrote_or_a_fence_after_it_reads_nothing_from_storage(counted_lake):
    lakehouse, log, s3_log, _ = counted_lake
    states = lakehouse.state.read_state("p")
    states["public.w"] = TableState("w", 32, {"s1"}, "b2")
    lakehouse.state.write_state("p", states)
    with ApplyLease(lakehouse.spark, lakehouse, "p", 60, holder="a window"):  # its fences: empty snapshots
        pass
    s3_log.mark()
    made = requests_of(log, lambda: lakehouse.state.read_state("p"))
    assert not made and not s3_log.since_mark(), made  # before: a scan of the state table, six S3 requests
    assert lakehouse.state.read_state("p") == states
    table = lakehouse.state.state_table()  # another commit of the table: its rows are read again
    table.newFastAppend().set("pglogical.test", "another-commit").commit()
    s3_log.mark()
    assert lakehouse.state.read_state("p") == states
    assert counted(s3_log.since_mark(), s3_kind)["GET warehouse parquet"] >= 1


def test_a_listing_of_staging_asks_only_for_the_manifests_of_batches_it_does_not_know_committed(counted_lake):
    lakehouse, _, s3_log, s3 = counted_lake
    client = s3.client()
    names = [f"{start:016X}-{start + 16:016X}-changes" for start in range(0x100, 0x160, 0x20)]
    for name in names:
        client.put_object(Bucket="lake-requests", Key=f"listed/p/{name}/table0000-part00000.parquet", Body=b"x")
        client.put_object(Bucket="lake-requests", Key=f"listed/p/{name}/_manifest.json", Body=b"{}")
    writing = f"{0x200:016X}-{0x210:016X}-changes"  # a pull writing it: no manifest yet
    client.put_object(Bucket="lake-requests", Key=f"listed/p/{writing}/table0000-part00000.parquet", Body=b"x")
    client.put_object(Bucket="lake-requests", Key="listed/p/_archive/old/_manifest.json", Body=b"{}")
    staging = Staging(lakehouse.spark, "s3a://lake-requests/listed", "p")
    assert [batch.name for batch in staging.committed()] == names
    s3_log.mark()
    assert [batch.name for batch in staging.committed()] == names  # a window's next poll
    asked = [served.path for served in s3_log.since_mark() if "/listed/p/" in served.path]
    assert asked and all(writing in path for path in asked), asked  # before: a HEAD of every batch's manifest
    client.put_object(Bucket="lake-requests", Key=f"listed/p/{writing}/_manifest.json", Body=b"{}")
    assert [batch.name for batch in staging.committed()] == [*names, writing]
    staging.remove_batch(names[0])
    assert [batch.name for batch in staging.committed()] == [*names[1:], writing]
