"""Source columns named like staging metadata (``_op``, ``_old_id``, ``~x``) land exactly.

Such a column may also be added after the slot exists, when leaving it out of a column list no
longer helps: the staged change files give it another name (``layout.staged_name``) and the
apply maps it back, so the lakehouse has the source's names and values.
"""

from __future__ import annotations

import json

import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.verification import verify_pipeline
from airflow_provider_pglogical.staging import batches, layout
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.spark import apply_changes
from tests.integration.test_toast_filter_crossing import apply


def test_staged_names_never_collide_and_both_sides_agree():
    names = ["id", "_op", "_seq", "_xid", "_commit_ts", "_commit_lsn", "_unchanged_toast", "_old_id", "~_op",
             "~", "_", "_created_at", "a.b", "old_id", "~~x"]
    staged = [layout.staged_name(n) for n in names]
    assert staged == [apply_changes.staged_name(n) for n in names]
    assert len(set(staged)) == len(names)
    taken = set(layout.CHANGE_METADATA) | {layout.OLD_KEY_PREFIX + n for n in names}
    assert not taken & set(staged)
    assert layout.staged_name("_created_at") == "_created_at" and layout.staged_name("_op") == "~_op"


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
    apply(root, warehouse)
    verdict = verify_pipeline(postgres_conn_id=publisher.conn_id, publications=["p"], staging_path=root.as_uri(),
                              pipeline="p", iceberg=IcebergConfig(warehouse=warehouse.as_uri(), namespace="toast"),
                              report=lambda m: None)
    assert verdict["equal"], verdict["summary"]
    assert verdict["tables"][0]["source_rows"] == 5
