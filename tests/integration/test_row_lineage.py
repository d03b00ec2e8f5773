"""Format v3 (``IcebergConfig(format_version=3)``): an updated row keeps its ``_row_id`` and its
``_last_updated_sequence_number`` moves (row lineage, so a downstream incremental reader sees an
update, not a delete and an insert); deletes are deletion vectors; and the consistent cut holds,
read by pyiceberg, at every batch end.

Every apply path that can update a keyed row is taken: a change batch the driver commits as a
row delta (a deletion vector, and the new row carrying the old one's ``_row_id``) and a MERGE.
"""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_provider_pglogical.embedded.postgres import available_servers
from airflow_provider_pglogical.lakehouse.consistent_cut import consistent_cut
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.iceberg_readers import load_tables
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging.contract import parse_batch_name
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import pull, synced
from tests.support.databases import drop_database, new_database
from tests.support.spark_jobs import reading_session

SOURCE = """
CREATE TABLE orders (id int PRIMARY KEY, status text);
INSERT INTO orders SELECT g, 'new' FROM generate_series(1, 6) g;
"""
ORDERS = "lake.lineage.public__orders"


def lineage(spark) -> dict[int, tuple[int, int, str]]:
    """id -> (_row_id, _last_updated_sequence_number, status), as Spark reads the table's metadata columns."""
    rows = spark.sql(f"SELECT id, _row_id, _last_updated_sequence_number, status FROM {ORDERS}").collect()
    return {row.id: (row._row_id, row._last_updated_sequence_number, row.status) for row in rows}


@pytest.mark.spark
def test_an_updated_row_keeps_its_row_id_on_v3_through_every_apply_path(cluster_pool, tmp_path, monkeypatch):
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    publisher = new_database(cluster_pool.get("publisher", next(iter(available_servers()))), "publisher",
                             monkeypatch.setenv)
    hook = PgLogicalHook(postgres_conn_id=publisher.conn_id)
    root = tmp_path / "staging"
    spark = reading_session(tmp_path / "warehouse", "test-row-lineage")
    config = IcebergConfig(warehouse=(tmp_path / "warehouse").as_uri(), namespace="lineage", format_version=3)
    try:
        storage = synced(publisher, hook, root, SOURCE, ["public.orders"])
        positions = [parse_batch_name(next(p.name for p in (root / "p").iterdir() if p.name.endswith("-snapshot")))[0]]
        expected = {positions[0]: Counter(publisher.query("SELECT id, status FROM orders"))}

        def apply(**options) -> list[dict]:
            result = apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "lineage", format_version=3,
                                                           **options))
            return [step for step in result["steps"] if step["kind"] == "changes"]

        apply()
        assert spark.sql(f"SELECT * FROM {ORDERS}").count() == 6
        assert load_tables(config)("public__orders").metadata.format_version == 3
        first = lineage(spark)
        assert sorted(row_id for row_id, _, _ in first.values()) == list(range(6))  # one id per row

        for statement, options in (("UPDATE orders SET status = 'paid' WHERE id = 2", {}),  # a row delta's batch
                                    ("UPDATE orders SET status = 'sent' WHERE id IN (2, 3); DELETE FROM orders "
                                     "WHERE id = 6; INSERT INTO orders VALUES (7, 'new')", {"row_deltas": False})):
            before = lineage(spark)
            publisher.execute(statement)
            positions.append(parse_batch_name(pull(hook, storage))[1])
            expected[positions[-1]] = Counter(publisher.query("SELECT id, status FROM orders"))
            steps = apply(**options)
            assert [step["row_delta"] for step in steps] == [not options], steps  # the driver's, then a MERGE
            after = lineage(spark)
            changed = {key for key in after if key in before and after[key][2] != before[key][2]}
            assert changed, statement
            for key in changed:  # the same row: its id kept, its sequence number moved
                assert after[key][0] == before[key][0], (key, before[key], after[key])
                assert after[key][1] > before[key][1], (key, before[key], after[key])
            for key in set(after) & set(before) - changed:  # untouched rows: untouched lineage
                assert after[key][:2] == before[key][:2]
            assert all(after[key][0] not in {row_id for row_id, _, _ in before.values()}
                       for key in set(after) - set(before))  # a new row gets a new id

        # merge-on-read on v3 deletes by deletion vectors (Puffin files), never a position delete file
        formats = {row.file_format for row in spark.sql(f"SELECT file_format FROM {ORDERS}.delete_files").collect()}
        assert formats == {"PUFFIN"}
        # and the cut holds on v3, read by pyiceberg
        for position, rows in expected.items():
            cut = consistent_cut("p", config, lsn=Lsn(position))
            snapshot = cut.tables["public.orders"].snapshot_id
            read = load_tables(config)("public__orders").scan(snapshot_id=snapshot, selected_fields=("id", "status"))
            assert Counter(tuple(row.values()) for row in read.to_arrow().to_pylist()) == rows, Lsn(position)
    finally:
        spark.stop()
        drop_database(publisher)
