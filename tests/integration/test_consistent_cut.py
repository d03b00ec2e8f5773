"""One consistent cut across tables (invariant 17): at every LSN a batch ends on, the snapshots
``consistent_cut`` names hold exactly the source's state at that LSN, read by pyiceberg (not by
the apply's own Spark reads). Two tables changed in one source transaction are both seen or both
not; a table no batch touched still takes part; the cut holds through a snapshot adopted by the
driver, a rewrite, MERGEs and applies of several batches in one run (rounds).
"""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_provider_pglogical.embedded.postgres import available_servers
from airflow_provider_pglogical.lakehouse.consistent_cut import NoConsistentCut, consistent_cut
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.iceberg_readers import load_tables
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.contract import parse_batch_name
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import pull, synced
from tests.support.databases import drop_database, new_database
from tests.support.spark_jobs import reading_session

SOURCE = """
CREATE TABLE a (id int PRIMARY KEY, v int);
CREATE TABLE b (id int PRIMARY KEY, v int);
CREATE TABLE c (v int);
ALTER TABLE c REPLICA IDENTITY FULL;
INSERT INTO a VALUES (0, 0); INSERT INTO b VALUES (0, 0); INSERT INTO c VALUES (0), (0);
"""
#: one pull each; a and b change together in one transaction, and apart
WORKLOAD = [
    ["BEGIN; INSERT INTO a VALUES (1, 1); INSERT INTO b VALUES (1, 1); COMMIT", "UPDATE a SET v = 10 WHERE id = 0"],
    ["INSERT INTO c VALUES (2)"],  # a and b untouched
    ["BEGIN; UPDATE a SET v = v + 1; DELETE FROM b WHERE id = 0; INSERT INTO b VALUES (3, 3); "
     "INSERT INTO a VALUES (3, 3); COMMIT", "DELETE FROM c WHERE v = 2"],
    ["BEGIN; UPDATE a SET id = 4 WHERE id = 3; UPDATE b SET id = 4, v = 4 WHERE id = 3; COMMIT",
     "INSERT INTO c VALUES (4)"],
]
TABLES = {"a": "id, v", "b": "id, v", "c": "v"}


def source_state(publisher) -> dict[str, Counter]:
    return {name: Counter(publisher.query(f"SELECT {columns} FROM {name}")) for name, columns in TABLES.items()}


def read_cut(config: IcebergConfig, cut) -> dict[str, Counter]:
    """Each table at its snapshot of the cut, read by pyiceberg."""
    load = load_tables(config)
    out = {}
    for source, table in cut.tables.items():
        name = source.split(".")[1]
        rows = load(table.target).scan(snapshot_id=table.snapshot_id,
                                       selected_fields=tuple(TABLES[name].split(", "))).to_arrow().to_pylist()
        out[name] = Counter(tuple(row.values()) for row in rows)
    return out


@pytest.mark.spark
def test_every_batch_end_is_one_consistent_cut_across_tables(cluster_pool, tmp_path, monkeypatch):
    publisher = new_database(cluster_pool.get("publisher", next(iter(available_servers()))), "publisher",
                             monkeypatch.setenv)
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

    hook = PgLogicalHook(postgres_conn_id=publisher.conn_id)
    root = tmp_path / "staging"
    spark = reading_session(tmp_path / "warehouse", "test-consistent-cut")
    config = IcebergConfig(warehouse=(tmp_path / "warehouse").as_uri(), namespace="cut")
    try:
        storage = synced(publisher, hook, root, SOURCE, [f"public.{name}" for name in TABLES])
        snapshot = [p.name for p in (root / "p").iterdir() if p.name.endswith("-snapshot")][0]
        expected = {parse_batch_name(snapshot)[0]: source_state(publisher)}
        apply = lambda **options: apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", "cut",  # noqa: E731
                                                   row_deltas=False, **options))
        apply()  # the snapshot: a and b adopted by the driver, c (keyless) rewritten by Spark
        ends = []
        for number, statements in enumerate(WORKLOAD):
            for statement in statements:
                publisher.execute(statement)
            ends.append(parse_batch_name(pull(hook, storage))[1])
            expected[ends[-1]] = source_state(publisher)
            if number != 1:  # the second and third batches are applied by one run, in rounds
                apply()

        # every snapshot the apply committed to a target says where it leaves the table
        for name in TABLES:
            table = load_tables(config)(f"public__{name}")
            for snapshot in table.snapshots():
                properties = snapshot.summary.additional_properties
                assert properties[contract.SNAPSHOT_PIPELINE] == "p" and properties[contract.SNAPSHOT_BATCH]
                assert properties[contract.SNAPSHOT_LSN] and properties[contract.SNAPSHOT_FROM_LSN]

        for lsn, state in expected.items():
            cut = consistent_cut("p", config, lsn=Lsn(lsn))
            assert cut.lsn == Lsn(lsn) and set(cut.tables) == {f"public.{name}" for name in TABLES}
            read = read_cut(config, cut)
            assert read == state, Lsn(lsn)
            assert {row[0] for row in read["a"]} & {1, 3, 4} == {row[0] for row in read["b"]} & {1, 3, 4}
        latest = consistent_cut("p", config)  # the newest LSN every table holds: the last batch's end
        assert latest.lsn == Lsn(ends[-1]) and read_cut(config, latest) == expected[ends[-1]]

        # inside a batch of a's own, or past what the apply holds: refused, naming the tables
        inside = (ends[2] + ends[3]) // 2
        with pytest.raises(NoConsistentCut, match=r"public\.a \(Iceberg table public__a.*public\.b"):
            consistent_cut("p", config, lsn=inside)
        with pytest.raises(NoConsistentCut, match="no snapshot holds the source exactly at LSN"):
            consistent_cut("p", config, lsn=ends[-1] + 1)
    finally:
        spark.stop()
        drop_database(publisher)
