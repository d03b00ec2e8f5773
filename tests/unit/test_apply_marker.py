"""The apply marker can make the operator start Spark when not needed, never skip a pending batch."""

from __future__ import annotations

import pyarrow as pa
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.staging.apply_marker import pending_batches, write_marker
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
