"""The apply marker can make the operator start Spark when not needed, never skip a pending batch."""

from __future__ import annotations

import pyarrow as pa
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.staging.apply_marker import pending_batches, pending_rows, write_marker
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest
from airflow_provider_pglogical.staging.batches import BatchWriter

LAKE = {"catalog": "lake", "namespace": "shop", "warehouse": "file:///wh"}


def commit(root, start: str, end: str, kind: str, rows: int = 1) -> str:
    writer = BatchWriter(root, BatchManifest(pipeline="p", kind=kind, start_lsn=start, end_lsn=end))
    writer.add_table(TableManifest(schema="public", name="t", columns=[], key=[]))
    writer.write_part("public.t", pa.table({"id": list(range(rows))}))
    writer.commit()
    return writer.manifest.name


def test_only_batches_a_successful_apply_saw_are_idle(tmp_path):
    root = ObjectStoragePath((tmp_path / "staging").as_uri())
    first = commit(root, "0/100", "0/100", "snapshot")
    changes = [commit(root, "0/100", "0/200", "changes"), commit(root, "0/200", "0/300", "changes")]
    assert pending_batches(root, "p", LAKE) is None  # no marker: only Spark can tell
    write_marker(root, "p", LAKE, [first, *changes])
    assert pending_batches(root, "p", LAKE) == []
    assert pending_batches(root, "p", {**LAKE, "namespace": "other"}) is None  # another lakehouse
    # a backfill that started earlier commits a snapshot whose name sorts before the last seen batch
    late = commit(root, "0/180", "0/180", "snapshot")
    assert late < changes[-1] and pending_batches(root, "p", LAKE) == [late]
    # a batch directory without a manifest does not exist, pending or not
    (tmp_path / "staging" / "p" / "0000000000000300-0000000000000400-changes").mkdir()
    assert pending_batches(root, "p", LAKE) == [late]


def test_pending_rows_are_counted_from_the_manifests(tmp_path):
    root = ObjectStoragePath((tmp_path / "staging").as_uri())
    batches = [commit(root, "0/100", "0/200", "changes", rows=30), commit(root, "0/200", "0/300", "changes", rows=70),
               commit(root, "0/300", "0/400", "changes", rows=5)]
    assert pending_rows(root, "p", batches) == 105
    assert pending_rows(root, "p", batches[1:]) == 75
    assert pending_rows(root, "p", []) == 0
    assert pending_rows(root, "p", None) is None  # unknown stays unknown
    # counting stops once above the limit: the answer is only "more than the limit"
    assert pending_rows(root, "p", batches, stop_above=50) == 100
    # a batch removed meanwhile (retention): no guess
    assert pending_rows(root, "p", [*batches, "0000000000000400-0000000000000500-changes"]) is None
