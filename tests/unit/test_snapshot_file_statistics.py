"""A snapshot's staged files, which the apply adopts into Iceberg as they are, carry the column
statistics Iceberg takes its file bounds from (flat, non-floating columns); change batches do not."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.batches import BatchWriter, bounded_columns
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64()),
                    ("tags", pa.list_(pa.int32())), ("day", pa.date32())])


def footer_statistics(path) -> dict[str, tuple]:
    """Column -> (min, max) of the file's first row group, for the columns that have statistics."""
    group = pq.ParquetFile(path).metadata.row_group(0)
    out = {}
    for index in range(group.num_columns):
        column = group.column(index)
        if column.is_stats_set and column.statistics.has_min_max:
            out[column.path_in_schema] = (column.statistics.min, column.statistics.max)
    return out


def test_only_flat_non_floating_columns_are_bounded():
    assert bounded_columns(SCHEMA) == ["id", "name", "day"]


def test_a_snapshot_part_keeps_the_bounds_iceberg_adopts_and_a_change_part_keeps_none(tmp_path):
    data = pa.table({"id": [3, 1, 2], "name": ["b", "a", "c"], "price": [1.5, float("nan"), 0.5],
                     "tags": [[1], [], None], "day": pa.array([0, 10, 5], pa.date32())}, schema=SCHEMA)
    manifest = BatchManifest(pipeline="p", kind="snapshot", start_lsn=str(Lsn(16)), end_lsn=str(Lsn(16)))
    writer = BatchWriter(tmp_path / "snapshot", manifest)
    writer.add_table(TableManifest("public", "t", [{"name": f.name, "type": "x"} for f in SCHEMA], ["id"]))
    with writer.part_writer("public.t", SCHEMA) as out:
        for batch in data.to_batches():
            out.write_batch(batch)
    writer.write_part("public.t", data)  # the unnumbered form, as a change batch's rows are written
    snapshot_part, change_part = sorted((tmp_path / "snapshot").rglob("*.parquet"))
    bounds = footer_statistics(snapshot_part)
    assert set(bounds) == {"id", "name", "day"}
    assert bounds["id"] == (1, 3) and bounds["name"] == ("a", "c")
    assert footer_statistics(change_part) == {}
