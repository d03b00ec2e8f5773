"""A manifest crosses the seam as typed values (``staging/seam/manifests.py``): capture writes it
through them, the Spark job reads it through them, and every manifest written so far still reads.

The scan at the end keeps it so: a raw dict lookup on a manifest coming back into ``spark/`` fails here."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pyarrow as pa

from airflow_provider_pglogical.spark.common import hadoop_files
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.layout import read_manifest
from airflow_provider_pglogical.staging.seam.manifests import (
    BatchManifest,
    ChangeFacts,
    Column,
    ColumnEvolution,
    FileEntry,
    KeyRange,
    SnapshotScope,
    TableManifest,
)

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_pglogical"
#: a change batch's manifest exactly as the pull wrote it before manifests were typed (main at a9873b8)
WRITTEN_V1 = Path(__file__).resolve().parents[1] / "fixtures" / "manifests" / "changes_as_written_v1.json"


def test_a_manifest_written_before_the_types_reads_typed_and_writes_back_byte_for_byte():
    text = WRITTEN_V1.read_text()
    manifest = BatchManifest.from_json(text)
    assert manifest.name == "0000000000001000-0000000000002000-changes" and manifest.previous_end == "0/F00"
    orders = manifest.tables["public.orders"]
    assert orders.columns[0] == Column("id", "int4", 23, -1, "integer", None, True)
    assert orders.columns[2].element_type == "text" and orders.columns[3].override == "string"
    assert orders.files[0].path == "table0000-part00000.parquet" and orders.files[0].rows == 2
    assert orders.files[0].size > 0 and len(orders.files[0].sha256) == 64
    assert orders.change_facts == ChangeFacts(2, 4100, True, False, "2026-01-01T00:00:00+00:00",
                                              "2026-01-01T00:00:01+00:00")
    assert orders.facts_decide(4100) is None  # a row keeps an unchanged value: the job aggregates
    assert orders.column_evolution == ColumnEvolution({"total": "amount"}, ("note",))
    assert not orders.is_multiset and not orders.truncated and orders.replace_table is None
    quoted = manifest.tables['"x.y"."z"']
    assert quoted.is_multiset and quoted.truncated and quoted.files == [] and quoted.change_facts is None
    assert manifest.to_json() == text


def test_an_older_manifest_reads_too_and_keeps_what_it_does_not_know():
    """Before quoted table keys, file sizes and hashes, ``previous_end`` and facts; plus a key a newer
    writer might add: read with defaults, re-keyed, and the unknown key written back."""
    old = {"pipeline": "p", "kind": "snapshot", "start_lsn": "0/10", "end_lsn": "0/10", "created_at": 1.0,
           "format_version": 1, "tables": {"x.y.z": {"schema": "x.y", "name": "z", "key": ["id"],
                                                     "columns": [{"name": "id", "type": "int8", "key": True}],
                                                     "files": [{"path": "table0000-part00000.parquet", "rows": 5}],
                                                     "rows": 5, "details": {"key_range": {"column": "id", "start": 1}}}},
           "details": {"initial": True}, "newer_key": {"kept": 1}}
    manifest = BatchManifest.from_json(json.dumps(old))
    assert list(manifest.tables) == ['"x.y"."z"'] and manifest.previous_end is None and manifest.initial
    table = manifest.tables['"x.y"."z"']
    assert table.files == [FileEntry("table0000-part00000.parquet", 5)] and table.replica_identity == "d"
    assert manifest.snapshot_scope('"x.y"."z"') == SnapshotScope(KeyRange("id", 1, None))
    assert json.loads(manifest.to_json())["newer_key"] == {"kept": 1}
    assert BatchManifest.from_json(manifest.to_json()) == manifest


def test_the_writer_writes_through_the_types_and_both_sides_read_the_same_values(tmp_path):
    manifest = BatchManifest(pipeline="p", kind="changes", start_lsn="0/100", end_lsn="0/200", previous_end="0/80")
    writer = BatchWriter(tmp_path, manifest)
    facts = {"rows": 2, "first_commit_lsn": 300, "unchanged": False, "old_keys": True}
    writer.add_table(TableManifest("public", "t", [{"name": "id", "type": "int4", "key": True},
                                                   Column("v", "text")], ["id"], details={contract.CHANGE_FACTS: facts}))
    writer.write_part("public.t", pa.table({"id": pa.array([1, 2], pa.int32()), "v": ["a", "b"]}))
    writer.commit()
    table = manifest.tables["public.t"]
    assert all(isinstance(c, Column) for c in table.columns) and isinstance(table.files[0], FileEntry)
    assert table.files[0].size == (tmp_path / "p" / manifest.name / table.files[0].path).stat().st_size
    read = read_manifest(tmp_path, "p", manifest.name)
    assert read == manifest  # what capture reads back is what it wrote
    assert read.tables["public.t"].facts_decide(300) == ChangeFacts(2, 300, False, True)
    assert read.tables["public.t"].facts_decide(301) is None  # a row before the position: aggregate
    # the Spark job parses the same text with the same class
    text = (tmp_path / "p" / manifest.name / contract.MANIFEST).read_text()
    assert hadoop_files.BatchManifest is BatchManifest and BatchManifest.from_json(text) == manifest


def test_without_files_is_a_copy():
    manifest = BatchManifest.from_json(WRITTEN_V1.read_text())
    bare = manifest.without_files()
    assert all(not t.files for t in bare.tables.values()) and manifest.tables["public.orders"].files


# --- no raw manifest lookups in spark/ -------------------------------------------------------------

#: what counts as a raw lookup on a manifest: ``x["k"]``, ``x.get("k")``, ``x.setdefault("k")`` or
#: ``x.pop("k")`` where ``k`` is a manifest-only key (or the contract constant naming one), or where
#: ``x`` reads as a manifest or a part of one (its text names a manifest, details, facts, ...)
MANIFEST_KEYS = {"files", "replica_identity", "keyless", "schema_changes", "previous_end", "change_facts",
                 "column_evolution", "key_range", "extra_where", "truncated", "replace_table", "sha256", "type_oid",
                 "typmod", "element_type", "formatted", "override", "first_commit_lsn", "first_commit_ts", "old_keys",
                 "source_name", "initial", "chunked_load"}
CONTRACT_KEYS = {"CHANGE_FACTS", "COLUMN_EVOLUTION", "REPLACE_TABLE", "FILE_SIZE", "FILE_SHA256", "PREVIOUS_END",
                 "CHUNKED_LOAD", "SOURCE_NAME"}
MANIFEST_LIKE = re.compile(r"manifest|details|facts|evolution|key_range", re.IGNORECASE)


def raw_lookups(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript):
            receiver, key = node.value, node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "setdefault", "pop") and node.args):
            receiver, key = node.func.value, node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            name = key.value
        elif isinstance(key, ast.Name) and key.id in CONTRACT_KEYS:
            name = key.id
        else:
            continue
        if name in MANIFEST_KEYS or name in CONTRACT_KEYS or MANIFEST_LIKE.search(ast.unparse(receiver)):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_catches_the_lookups_the_job_made_before():
    before = '''
manifest = step.batch.manifest["tables"][source]
replace = (manifest.get("details") or {}).get(REPLACE_TABLE)
names = [c["name"] for c in manifest["columns"]]
if facts["rows"] and entry.get("sha256"): pass
'''
    # every lookup but c["name"] (its line is caught by manifest["columns"])
    assert len(raw_lookups(before)) == 6
    assert raw_lookups('summary["steps"].append(lease.get("id"))') == []  # not manifests


def test_no_raw_manifest_lookup_in_the_spark_jobs():
    found = {str(path.relative_to(PACKAGE)): hits for path in sorted((PACKAGE / "spark").rglob("*.py"))
             if (hits := raw_lookups(path.read_text()))}
    assert found == {}, ("the Spark jobs read manifests through their typed values (staging/seam/manifests.py: "
                         f"TableManifest.files, .change_facts, .snapshot_scope(...)), not as dicts: {found}")
