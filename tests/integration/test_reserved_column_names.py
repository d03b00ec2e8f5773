"""Source columns named like staging metadata (``_op``, ``_old_id``, ``~x``) land exactly.

Such a column may also be added after the slot exists, when leaving it out of a column list no
longer helps: the staged change files give it another name (``contract.staged_name``) and the
apply maps it back, so the lakehouse has the source's names and values.
"""

from __future__ import annotations

import json

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.verification.witness import verify_pipeline
from airflow_provider_pglogical.staging import batches, contract, layout
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from tests.support.spark_jobs import submit_apply


def test_staged_names_never_collide():
    names = ["id", "_op", "_seq", "_xid", "_commit_ts", "_commit_lsn", "_unchanged_toast", "_old_id", "~_op",
             "~", "_", "_created_at", "a.b", "old_id", "~~x"]
    staged = [contract.staged_name(n) for n in names]
    assert len(set(staged)) == len(names)
    taken = set(contract.CHANGE_METADATA) | {contract.OLD_KEY_PREFIX + n for n in names}
    assert not taken & set(staged)
    assert contract.staged_name("_created_at") == "_created_at" and contract.staged_name("_op") == "~_op"


@pytest.mark.spark
def test_columns_named_like_metadata_replicate_exactly(publisher, publisher_hook, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    publisher.execute('CREATE TABLE t(id int PRIMARY KEY, "_op" text, "_old_id" int, "~x" text);'
                      "INSERT INTO t SELECT g, 'op' || g, -g, 'x' || g FROM generate_series(1, 5) g")
    publisher_hook.create_publication("p", [PublishedTable("t")])
    root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    # Key changes (the staged _old_id metadata column beside the source's "_old_id"), then a
    # column named like another metadata column, added after the slot exists.
    publisher.execute("""UPDATE t SET id = id + 100, "_op" = 'moved' WHERE id <= 2;
                         UPDATE t SET "_old_id" = 42, "~x" = NULL WHERE id = 3; DELETE FROM t WHERE id = 4;
                         ALTER TABLE t ADD COLUMN "_seq" bigint;
                         INSERT INTO t VALUES (6, 'six', 6, 'x6', 600); UPDATE t SET "_seq" = 5 WHERE id = 5""")
    result = run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    assert result["changes"] == 6
    manifest = layout.read_manifest(storage, "p", result["batch"].rsplit("/", 1)[1])
    staged = batches.read_table(storage, "p", manifest.name, manifest.tables["public.t"]).column_names
    assert {"_op", "~_op", "_old_id", "~_old_id", "~~x", "_seq", "~_seq"} <= set(staged)
    submit_apply(root, warehouse)
    verdict = verify_pipeline(postgres_conn_id=publisher.conn_id, publications=["p"], staging_path=root.as_uri(),
                              pipeline="p", iceberg=IcebergConfig(warehouse=warehouse.as_uri(), namespace="toast"),
                              report=lambda m: None)
    assert verdict["equal"], verdict["summary"]
    assert verdict["tables"][0]["source_rows"] == 5


@pytest.mark.spark
def test_dotted_and_backticked_names_replicate_exactly(publisher, publisher_hook, tmp_path, monkeypatch):
    """``a.b`` is a column, not field b of a struct a, in every step of the job: key changes that
    keep an unchanged TOAST value, deletes, and a keyless table's duplicate rows."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    big = "(SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 300) i)"  # ~9.6 kB, TOASTed
    publisher.execute(f"""
        CREATE TABLE "odd.t"("k.id" int PRIMARY KEY, "a.b" text, "x`y" int, "a" int);
        ALTER TABLE "odd.t" ALTER COLUMN "a.b" SET STORAGE EXTERNAL;
        INSERT INTO "odd.t" SELECT g, {big}, g, -g FROM generate_series(1, 6) g;
        CREATE TABLE "full.t"("c.d" text, "n`m" int);
        ALTER TABLE "full.t" REPLICA IDENTITY FULL;
        INSERT INTO "full.t" VALUES ('x', 1), ('x', 1), ('x', 1), (NULL, 2), ('y', NULL)""")
    publisher_hook.create_publication("p", [PublishedTable.of("public", "odd.t"), PublishedTable.of("public", "full.t")])
    root, warehouse = tmp_path / "staging", tmp_path / "warehouse"
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    submit_apply(root, warehouse)
    publisher.execute("""
        UPDATE "odd.t" SET "k.id" = "k.id" + 100 WHERE "k.id" <= 2;      -- "a.b" unchanged: kept across the move
        UPDATE "odd.t" SET "k.id" = 200 WHERE "k.id" = 101;              -- a chain of key changes
        UPDATE "odd.t" SET "x`y" = 0, "a" = 0 WHERE "k.id" = 3;          -- "a.b" unchanged in place
        DELETE FROM "odd.t" WHERE "k.id" = 4;
        INSERT INTO "odd.t" VALUES (7, 'short', 7, 7);
        DELETE FROM "full.t" WHERE ctid = (SELECT min(ctid) FROM "full.t" WHERE "c.d" = 'x');
        UPDATE "full.t" SET "n`m" = 3 WHERE "c.d" IS NULL;
        INSERT INTO "full.t" VALUES ('y', NULL), ('y', NULL)""")
    run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    submit_apply(root, warehouse)
    verdict = verify_pipeline(postgres_conn_id=publisher.conn_id, publications=["p"], staging_path=root.as_uri(),
                              pipeline="p", iceberg=IcebergConfig(warehouse=warehouse.as_uri(), namespace="toast"),
                              report=lambda m: None)
    assert verdict["equal"], verdict["summary"]
    assert {t["table"]: t["source_rows"] for t in verdict["tables"]} == {'"public"."odd.t"': 6, '"public"."full.t"': 6}
