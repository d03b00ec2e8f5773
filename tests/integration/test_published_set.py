"""What the publications publish, as the server's own subscriber takes it (issue 47).

A partition published directly by one publication while another publishes its root with
``publish_via_partition_root``: PostgreSQL 16+ copies and replicates its rows once, under the
root (its subscriber leaves the partition's own table empty: the TAP tests 013_partition "inserts
into tab4_1 replicated" and 028_row_filter "check initial data copy from tab_rowfilter_child_sync");
15 also copies the partition into its own table. The judge is PostgreSQL's native subscriber of the
same publications, table by table; the pipeline's rows are those its batches stage.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest
from airflow.sdk import ObjectStoragePath
from airflow.sdk.execution_time.context import OutletEventAccessors

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.exceptions import PublicationError, StagingFullError
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator
from airflow_provider_pglogical.operators.sync import PgInitialSyncOperator
from airflow_provider_pglogical.operators.verify import PgVerifyOperator
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.staging.batches import read_table

TABLES = """
CREATE TABLE parent_sync(a int PRIMARY KEY) PARTITION BY RANGE (a);
CREATE TABLE child_sync PARTITION OF parent_sync FOR VALUES FROM (0) TO (100);
"""


def staged_rows(storage) -> dict[str, Counter]:
    """Per table, the values the pipeline's batches hold (inserts; this workload has no others)."""
    rows: dict[str, Counter] = {}
    for name, _start, _end, _kind in layout.committed_batches(storage, "p"):
        manifest = layout.read_manifest(storage, "p", name)
        for qualified, table in manifest.tables.items():
            data = read_table(storage, "p", name, table)
            rows.setdefault(qualified, Counter()).update(data.column("a").to_pylist() if data.num_rows else [])
    return {name: counter for name, counter in rows.items() if counter}


def test_a_partition_published_directly_and_through_its_root_replicates_as_the_server_says(
        publisher, subscriber, publisher_hook, subscriber_hook, pg_version, tmp_path):
    publisher.execute(TABLES + "INSERT INTO parent_sync SELECT g FROM generate_series(1, 30, 2) g;"
                      "CREATE PUBLICATION pub_parent FOR TABLE parent_sync WHERE (a > 15) "
                      "WITH (publish_via_partition_root);"
                      "CREATE PUBLICATION pub_child FOR TABLE child_sync WHERE (a < 15)")
    # the subscriber's tables are plain ones, so each shows what landed under its own name
    subscriber.execute("CREATE TABLE parent_sync(a int PRIMARY KEY); CREATE TABLE child_sync(a int PRIMARY KEY)")
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["pub_parent", "pub_child"], root=storage, pipeline="p")
    subscriber_hook.create_subscription("native", ["pub_parent", "pub_child"], publisher_conn_id=publisher.conn_id)
    wait_until(lambda: (s := subscriber_hook.subscription_status("native")) and s.ready, timeout=60,
               message="the native subscriber to be ready")
    publisher.execute("INSERT INTO parent_sync VALUES (4), (50), (60); INSERT INTO child_sync VALUES (8), (70)")
    run_pull(publisher_hook, slot="s1", publications=["pub_parent", "pub_child"], root=storage, pipeline="p")
    wait_until(lambda: subscriber.query("SELECT 70 IN (SELECT a FROM parent_sync)")[0][0], timeout=30,
               message="the native subscriber to catch up")

    native = {name: Counter(a for (a,) in subscriber.query(f"SELECT a FROM {name.split('.')[1]}"))
              for name in ("public.parent_sync", "public.child_sync")}
    native = {name: rows for name, rows in native.items() if rows}
    assert staged_rows(storage) == native
    # the server decides: 16 and later copy the partition once, under its root; 15 twice
    assert ("public.child_sync" in native) == (pg_version == 15), native


def slot_position(publisher) -> list[tuple]:
    return publisher.query("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's1'")


def test_a_dropped_publication_stops_the_pull_naming_the_fix(publisher, publisher_hook, tmp_path):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); INSERT INTO t VALUES (1);"
                      "CREATE PUBLICATION kept FOR TABLE t; CREATE TABLE u(id int PRIMARY KEY);"
                      "CREATE PUBLICATION dropped FOR TABLE u")
    storage = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["kept", "dropped"], root=storage, pipeline="p")
    publisher.execute("DROP PUBLICATION dropped; INSERT INTO t VALUES (2); INSERT INTO u VALUES (2)")
    before = (layout.committed_batches(storage, "p"), slot_position(publisher))
    for _retry in range(2):  # the same clear error on every retry, never the driver's UndefinedObject
        with pytest.raises(PublicationError) as error:
            run_pull(publisher_hook, slot="s1", publications=["kept", "dropped"], root=storage, pipeline="p")
        assert error.value.permanent
        message = str(error.value)
        assert "publication(s) dropped of pipeline 'p' no longer exist" in message
        assert "on_slot_lost='resync'" in message and "Nothing was changed" in message
        assert (layout.committed_batches(storage, "p"), slot_position(publisher)) == before


@pytest.mark.one_server  # the file system decides, not the server
def test_a_full_staging_names_its_path_and_free_space_and_loses_nothing(publisher, publisher_hook, tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a');"
                          "CREATE PUBLICATION pub FOR TABLE t")
        storage = ObjectStoragePath(mount.as_uri())
        run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=storage, pipeline="p")
        # 4 MB of values that do not compress: more than the staging file system holds
        publisher.execute("INSERT INTO t SELECT g, string_agg(md5(g::text || i::text), '') FROM "
                          "generate_series(2, 1001) g, generate_series(1, 128) i GROUP BY g")
        before = (layout.committed_batches(storage, "p"), slot_position(publisher))
        with pytest.raises(StagingFullError) as error:
            run_pull(publisher_hook, slot="s1", publications=["pub"], root=storage, pipeline="p")
        assert f"no space left on the staging file system at {mount}/p (" in str(error.value)
        assert error.value.free_bytes is not None and f"{error.value.free_bytes:,} bytes free" in str(error.value)
        assert not error.value.permanent and "nothing was lost" in str(error.value)
        assert (layout.committed_batches(storage, "p"), slot_position(publisher)) == before
        assert sorted(p.name for p in (mount / "p").iterdir() if not p.name.startswith("_")) == \
            [name for name, *_ in before[0]]  # the unfinished batch is gone

        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        result = run_pull(publisher_hook, slot="s1", publications=["pub"], root=storage, pipeline="p")
        assert result["tables"] == {"public.t": 1000}
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.one_server
@pytest.mark.spark
def test_an_apply_whose_result_cannot_be_written_is_reported_applied(publisher, publisher_hook, tmp_path, monkeypatch):
    """Staging full when the apply job writes its result file: its commits landed, so the task
    succeeds (without its figures), and verify, once there is room for its own result, finds the
    lakehouse equal to the source."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        publisher.execute("CREATE TABLE t(id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' || g FROM "
                          "generate_series(1, 50) g; CREATE PUBLICATION pub FOR TABLE t")
        staging = mount.as_uri()
        iceberg = IcebergConfig(warehouse=(tmp_path / "warehouse").as_uri(), namespace="full")
        common = {"postgres_conn_id": publisher.conn_id, "staging_root": staging, "pipeline": "p"}
        PgInitialSyncOperator(task_id="sync", slot="s1", publications=["pub"], **common).execute({})
        filler = mount / "filler"
        with open(filler, "wb") as fh:  # every byte the file system has left
            with pytest.raises(OSError):
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
        applied = IcebergApplyOperator(
            task_id="apply", staging_root=staging, pipeline="p", iceberg=iceberg, staging_retention=None,
            conf={"spark.ui.enabled": "false"}, env_vars={"SPARK_LOCAL_IP": "127.0.0.1"},
        ).execute({"outlet_events": OutletEventAccessors()})
        assert applied["steps"] == 0  # its figures were in the result file that could not be written
        filler.unlink()
        verified = PgVerifyOperator(task_id="verify", publications=["pub"], iceberg=iceberg, **common).execute({})
        assert verified["equal"] is True and verified["tables"] == {"public.t": 50}
    finally:
        subprocess.run(["umount", str(mount)], check=True)
