"""Issue 8 / invariant 5: rows entering a row filter keep their TOASTed values in the lakehouse.

PostgreSQL 15 sends an UPDATE that moves a row into a row filter as an INSERT whose untouched
out-of-line columns are marked unchanged with no value; its own subscriber then stores NULL.
The pipeline fetches those values from the publisher, so the lakehouse equals the publisher.
"""

from __future__ import annotations

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.verification.witness import compare_in_session, verify_pipeline
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import applying_session

DDL = """
CREATE TABLE orders(id int NOT NULL, region text NOT NULL, n int, note text, blob bytea);
CREATE UNIQUE INDEX orders_id_region ON orders(id, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_id_region;
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
ALTER TABLE orders ALTER COLUMN blob SET STORAGE EXTERNAL;
"""


@pytest.fixture
def spark(tmp_path):
    """The apply and verify's comparisons in one in-process session on the test's warehouse (a
    spark-submit each would pay a JVM start per server version)."""
    session = applying_session(tmp_path / "warehouse", "test-toast-filter-crossing")
    yield session
    session.stop()


@pytest.mark.spark
def test_rows_entering_the_filter_keep_their_toast_values(
    publisher, subscriber, publisher_hook, subscriber_hook, tmp_path, spark
):
    publisher.execute(DDL)
    subscriber.execute(DDL)
    # Rows 1..8 start outside the filter, with out-of-line text and bytea (> 2 kB, stored EXTERNAL).
    publisher.execute(
        "INSERT INTO orders SELECT g, 'US', 0, repeat(md5(g::text), 100), decode(repeat(md5(g::text), 300), 'hex')"
        "  FROM generate_series(1, 8) g;"
        "INSERT INTO orders SELECT g, 'EU', 0, 'small ' || g, '\\x00'::bytea FROM generate_series(100, 104) g"
    )
    publisher_hook.create_publication("pub", [PublishedTable("orders", where="region = 'EU'")])
    root = tmp_path / "staging"
    warehouse = tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=storage, pipeline="p")
    subscriber_hook.create_subscription("native", ["pub"], publisher_conn_id=publisher.conn_id)
    wait_until(lambda: (s := subscriber_hook.subscription_status("native")) and s.ready, timeout=60,
               message="the native subscriber to be ready")

    # Move 1..6 into the filter without touching note/blob: INSERTs with unchanged TOAST.
    publisher.execute("UPDATE orders SET region = 'EU', n = 1 WHERE id <= 6")
    publisher.execute("UPDATE orders SET n = 2 WHERE id = 100")  # an ordinary update, TOAST untouched
    publisher.execute("DELETE FROM orders WHERE id = 4")  # deleted before the pull's fetch
    first = run_pull(publisher_hook, slot="s1", publications=["pub"], root=storage, pipeline="p")
    manifest = layout.read_manifest(storage, "p", first["batch"].rsplit("/", 1)[1])
    fetch = manifest.tables["public.orders"].details["toast_fetch"]
    assert (fetch["rows"], fetch["filled"], fetch["missing"], fetch["columns"]) == (6, 5, 1, ["blob", "note"])
    assert fetch["at_lsn"]
    # Row 3 changes again later: the later value wins over the fetched one.
    publisher.execute("UPDATE orders SET note = 'changed later' WHERE id = 3")
    run_pull(publisher_hook, slot="s1", publications=["pub"], root=storage, pipeline="p")
    apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "toast"))

    wait_until(lambda: subscriber.query("SELECT note FROM orders WHERE id = 3") == [("changed later",)],
               timeout=30, message="the native subscriber to catch up")
    # The native subscriber lost the values of the rows that entered the filter …
    assert subscriber.query("SELECT id FROM orders WHERE note IS NULL ORDER BY id") == [(1,), (2,), (5,), (6,)]
    assert subscriber.query("SELECT id FROM orders WHERE blob IS NULL ORDER BY id") == [(1,), (2,), (3,), (5,), (6,)]
    iceberg = IcebergConfig(warehouse=warehouse.as_uri(), namespace="toast")
    common = dict(postgres_conn_id=publisher.conn_id, publications=["pub"], staging_path=root.as_uri(),
                  pipeline="p", iceberg=iceberg, report=lambda m: None, compare=compare_in_session(spark))
    # … the lakehouse equals the publisher's projection, every cell …
    against_publisher = verify_pipeline(**common)
    assert against_publisher["equal"], against_publisher["summary"]
    assert against_publisher["tables"][0]["source_rows"] == 10
    # … and differs from the native subscriber exactly in those rows (both agree on every other cell).
    against_native = verify_pipeline(**common, source_conn_id=subscriber.conn_id)
    (table,) = against_native["tables"]
    assert not table["equal"]
    assert sorted(k[0] for k in table["first_differing_keys"]) == [1, 2, 3, 5, 6]
    native_rows = {r["id"]: r for r in table["only_in_source"]}
    lake_rows = {r["id"]: r for r in table["only_in_target"]}
    for key in (1, 2, 5, 6):
        assert native_rows[key]["note"] is None and lake_rows[key]["note"] is not None
        same = {c: v for c, v in native_rows[key].items() if c not in ("note", "blob")}
        assert same == {c: v for c, v in lake_rows[key].items() if c not in ("note", "blob")}
    assert lake_rows[3]["note"] == "changed later" and lake_rows[3]["blob"] is not None
