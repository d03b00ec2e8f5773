"""Iceberg format versions: v2 by default, v3 on request, an upgrade only when asked, never a
downgrade, and a mismatch refused before anything is written (the message, and nothing changed).
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.embedded.postgres import available_servers
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging.contract import STATE_TABLE
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import pull, synced
from tests.support.databases import drop_database, new_database
from tests.support.spark_jobs import reading_session

SOURCE = """
CREATE TABLE orders (id int PRIMARY KEY, status text);
CREATE TABLE notes (body text);
ALTER TABLE notes REPLICA IDENTITY FULL;
INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 5) g;
INSERT INTO notes VALUES ('a'), ('a');
"""


def versions(lakehouse: Lakehouse) -> dict[str, int]:
    return {name: lakehouse.iceberg_table(name).operations().current().formatVersion()
            for name in ("public__orders", "public__notes", STATE_TABLE)}


def snapshots(lakehouse: Lakehouse) -> dict[str, int]:
    return {name: lakehouse.iceberg_table(name).currentSnapshot().snapshotId()
            for name in ("public__orders", "public__notes", STATE_TABLE)}


@pytest.fixture()
def source(cluster_pool, tmp_path, monkeypatch):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    publisher = new_database(cluster_pool.get("publisher", next(iter(available_servers()))), "publisher",
                             monkeypatch.setenv)
    hook = PgLogicalHook(postgres_conn_id=publisher.conn_id)
    storage = synced(publisher, hook, tmp_path / "staging", SOURCE, ["public.orders", "public.notes"])
    spark = reading_session(tmp_path / "warehouse", "test-format-versions")
    try:
        yield publisher, hook, storage, spark, (tmp_path / "staging").as_uri()
    finally:
        spark.stop()
        drop_database(publisher)


@pytest.mark.spark
def test_tables_are_v2_by_default_and_a_v3_apply_refuses_them_until_the_upgrade_is_asked_for(source):
    publisher, hook, storage, spark, root = source
    apply_changes.run(spark, ApplyOptions(root, "p", "lake", "fv"))
    lakehouse = Lakehouse(spark, "lake", "fv", "merge-on-read", None)
    assert versions(lakehouse) == {"public__orders": 2, "public__notes": 2, STATE_TABLE: 2}

    publisher.execute("UPDATE orders SET status = 'paid' WHERE id = 1; INSERT INTO notes VALUES ('b')")
    pull(hook, storage)
    before = snapshots(lakehouse)
    with pytest.raises(ApplyError) as refused:
        apply_changes.run(spark, ApplyOptions(root, "p", "lake", "fv", format_version=3))
    message = str(refused.value)
    for table in ("public__orders", "public__notes"):
        assert f"Iceberg table `lake`.`fv`.`{table}` is format v2, but the apply is configured for v3" in message
    assert "upgrade_format_version=True" in message and "format_version=2" in message
    assert message.endswith("Nothing was applied")
    assert snapshots(lakehouse) == before and versions(lakehouse)[STATE_TABLE] == 2  # nothing changed
    assert spark.table("lake.fv.public__orders").where("status = 'paid'").count() == 0

    # asked for: upgraded, then applied
    apply_changes.run(spark, ApplyOptions(root, "p", "lake", "fv", format_version=3,
                                              upgrade_format_version=True))
    assert versions(lakehouse) == {"public__orders": 3, "public__notes": 3, STATE_TABLE: 2}
    assert spark.table("lake.fv.public__orders").where("status = 'paid'").count() == 1
    assert spark.table("lake.fv.public__notes").where("body = 'b'").count() == 1

    # never a downgrade: a v2 apply is refused, naming the fix
    publisher.execute("UPDATE orders SET status = 'sent' WHERE id = 1")
    pull(hook, storage)
    before = snapshots(lakehouse)
    with pytest.raises(ApplyError, match=r"`lake`\.`fv`\.`public__orders` is format v3, but the apply is configured "
                                         r"for v2, "
                                         r"and Iceberg cannot downgrade a table\. Set IcebergConfig\(format_version=3\)"):
        apply_changes.run(spark, ApplyOptions(root, "p", "lake", "fv"))
    assert snapshots(lakehouse) == before
    assert spark.table("lake.fv.public__orders").where("status = 'sent'").count() == 0
