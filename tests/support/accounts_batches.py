"""A staged ``public.accounts`` table: a snapshot of N rows and one change batch of updates,
deletes and inserts with keys spread over the table (the apply benchmark's workload, and the
tests' large-table MERGE)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pyarrow as pa

from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest

COLUMNS = [
    {"name": "id", "type": "int8", "key": True},
    {"name": "balance", "type": "numeric", "formatted": "numeric(12,2)"},
    {"name": "status", "type": "text"},
    {"name": "note", "type": "text"},
    {"name": "updated_at", "type": "timestamptz"},
]
SOURCE = "public.accounts"
SNAPSHOT_LSN = 0x1000
CHANGES_END = 0x100000


def values(ids: pa.Array, salt: int) -> dict[str, pa.Array]:
    import pyarrow.compute as pc

    n = len(ids)
    cents = pc.add(pc.multiply(ids, 7), salt)
    return {
        "id": ids,
        "balance": pc.cast(pc.cast(pc.bit_wise_and(cents, 0xFFFFFF), pa.int32()), pa.decimal128(12, 2)),
        "status": pc.take(pa.array(["open", "closed", "frozen", "review"]), pc.bit_wise_and(ids, 3)),
        "note": pa.array([f"account note {salt} " + "x" * 20] * n, pa.string()),
        "updated_at": pc.cast(pc.add(pc.multiply(ids, 1_000_000), 1_700_000_000_000_000), pa.timestamp("us", tz="UTC")),
    }


def planned_changes(rng: random.Random, size: int, changes: int) -> tuple[list[int], list[int], list[int]]:
    """The keys the change batch updates (60%), deletes (20%, both among the table's keys) and
    inserts (20%, after the last key)."""
    existing = rng.sample(range(1, size + 1), int(changes * 0.8))
    inserts = list(range(size + 1, size + 1 + changes - len(existing)))
    return existing[: int(changes * 0.6)], existing[int(changes * 0.6):], inserts


def expected_rows(size: int, changes: int, seed: int = 7) -> pa.Table:
    """The table once ``stage``'s snapshot and change batch are applied (updated and inserted rows
    carry the batch's values)."""
    updates, deletes, inserts = planned_changes(random.Random(seed), size, changes)
    touched = set(updates) | set(deletes)
    kept = [i for i in range(1, size + 1) if i not in touched]
    return pa.concat_tables([pa.table(values(pa.array(kept, pa.int64()), 0)),
                             pa.table(values(pa.array(sorted(updates) + inserts, pa.int64()), 1))])


def stage(root: Path, pipeline: str, size: int, changes: int, seed: int = 7) -> None:
    from airflow.sdk import ObjectStoragePath

    table = TableManifest(schema="public", name="accounts", columns=COLUMNS, key=["id"])
    writer = BatchWriter(ObjectStoragePath(root.as_uri()),
                         BatchManifest(pipeline=pipeline, kind="snapshot", start_lsn=f"0/{SNAPSHOT_LSN:X}",
                                       end_lsn=f"0/{SNAPSHOT_LSN:X}"))
    writer.add_table(table)
    part = 1_000_000
    for start in range(1, size + 1, part):
        ids = pa.array(range(start, min(start + part, size + 1)), pa.int64())
        writer.write_part(SOURCE, pa.table(values(ids, 0)))
    writer.commit()

    rng = random.Random(seed)
    updates, deletes, inserts = planned_changes(rng, size, changes)
    ops = [("U", i) for i in updates] + [("D", i) for i in deletes] + [("I", i) for i in inserts]
    rng.shuffle(ops)
    ids = pa.array([i for _, i in ops], pa.int64())
    data = values(ids, 1)
    deleted = pa.array([op == "D" for op, _ in ops])
    import pyarrow.compute as pc

    for name in ("balance", "status", "note", "updated_at"):  # a DELETE carries the key only
        data[name] = pc.if_else(deleted, pa.scalar(None, data[name].type), data[name])
    n = len(ops)
    batch = {
        "_op": pa.array([op for op, _ in ops]),
        "_commit_lsn": pa.array([SNAPSHOT_LSN + 1 + i // 10 for i in range(n)], pa.int64()),
        "_seq": pa.array(range(n), pa.int64()),
        "_xid": pa.array([1000 + i // 10 for i in range(n)], pa.int64()),
        "_commit_ts": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
        "_unchanged_toast": pa.array([None] * n, pa.list_(pa.string())),
        **data,
        "_old_id": pa.array([None] * n, pa.int64()),
    }
    writer = BatchWriter(ObjectStoragePath(root.as_uri()),
                         BatchManifest(pipeline=pipeline, kind="changes", start_lsn=f"0/{SNAPSHOT_LSN:X}",
                                       end_lsn=f"0/{CHANGES_END:X}"))
    writer.add_table(TableManifest(schema="public", name="accounts", columns=COLUMNS, key=["id"]))
    writer.write_part(SOURCE, pa.table(batch))
    writer.commit()
