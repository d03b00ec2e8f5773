"""The values a table's current snapshot wrote, read from its own files when the driver committed it.

``kept_values.py`` remembers what a driver's last row delta of each table wrote, but only in the
JVM that committed it: a spark-submit run starts with nothing. The table's metadata says the
same as that memory. When the current snapshot is one of the driver's keyed row deltas (its
summary holds :data:`ROW_DELTA_PROPERTY` and names its two files), its equality delete file lists
every key it touched, and its data file holds exactly the rows it left present: an equality
delete applies only to older data files, and nothing committed since. So a key in the data file
holds that row, a key only in the delete file is absent, and any other key is unknown (it is
read from the table: ``table_lookup.py``, else Spark).

The driver reads both files with pyarrow where they are on this machine's file system; elsewhere,
or for any snapshot it cannot vouch for, it answers nothing.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.hadoop_files import local_path
from airflow_provider_pglogical.spark.kept_values import ABSENT, lookup_values

#: snapshot summary properties of the driver's marked row deltas (``DriverCommits.row_delta``):
#: the mark, the data file and the equality delete file it added, and the delete's field ids
ROW_DELTA_PROPERTY = "pglogical.row-delta"
DATA_FILE_PROPERTY = "pglogical.row-delta.data-file"
DELETE_FILE_PROPERTY = "pglogical.row-delta.delete-file"
EQUALITY_IDS_PROPERTY = "pglogical.row-delta.equality-ids"
#: the mark of a keyed table's row delta (``RowDeltas.apply``)
ROW_DELTA_KEYED = "keyed"
_FIELD_ID = b"PARQUET:field_id"


def written_values(spark, table, snapshot: int | None, key: str, columns: list[str], keys) -> dict:
    """The ``keys`` that snapshot ``snapshot`` of ``table`` (Iceberg's Java table) answers, when
    it is the table's current snapshot and the driver's keyed row delta on column ``key``: key ->
    the values of ``columns`` (a tuple; timestamps as microseconds, as a lookup reads them) or
    :data:`ABSENT`. A key left out is unknown. The summary names the commit's two files, so no
    manifest is read."""
    current = table.currentSnapshot()
    if snapshot is None or current is None or current.snapshotId() != snapshot:
        return {}
    summary = current.summary()
    if summary.get(ROW_DELTA_PROPERTY) != ROW_DELTA_KEYED:
        return {}
    schema = table.schema()
    key_field = schema.findField(key)
    fields = [schema.findField(name) for name in columns]
    if key_field is None or any(field is None for field in fields) \
            or summary.get(EQUALITY_IDS_PROPERTY) != str(key_field.fieldId()):
        return {}
    data_at, deletes_at = summary.get(DATA_FILE_PROPERTY), summary.get(DELETE_FILE_PROPERTY)
    data_path = local_path(spark, data_at) if data_at else None
    deletes_path = local_path(spark, deletes_at) if deletes_at else None
    if deletes_path is None or (data_at and data_path is None):
        return {}
    wanted = set(keys)
    deleted = field_column(deletes_path, key_field.fieldId())
    if deleted is None:
        return {}
    found = {value: ABSENT for value in deleted.to_pylist() if value in wanted}
    if data_path is not None:
        rows = _rows(data_path, key_field.fieldId(), [field.fieldId() for field in fields], wanted)
        if rows is None:
            return {}
        found.update(rows)
    return found


def field_column(path: str, field_id: int):
    """The column of Iceberg field ``field_id`` in a Parquet file; None when the file lacks it."""
    import pyarrow.parquet as pq

    names = field_names_by_id(pq.read_schema(path))
    if field_id not in names:
        return None
    return pq.read_table(path, columns=[names[field_id]])[names[field_id]]


def _rows(path: str, key_id: int, value_ids: list[int], wanted: set) -> dict | None:
    """key -> the values of fields ``value_ids`` of the file's rows whose key is wanted; None
    when a field is not in the file (Iceberg would read it as NULL: Spark is asked instead)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    names = field_names_by_id(pq.read_schema(path))
    if key_id not in names or any(field_id not in names for field_id in value_ids):
        return None
    read = pq.read_table(path, columns=list(dict.fromkeys([names[key_id], *(names[i] for i in value_ids)])))
    read = read.filter(pc.is_in(read[names[key_id]], value_set=pa.array(list(wanted), type=read[names[key_id]].type)))
    return dict(zip(read[names[key_id]].to_pylist(), zip(*(lookup_values(read[names[i]]) for i in value_ids)))) \
        if read.num_rows else {}


def field_names_by_id(schema) -> dict[int, str]:
    """Top-level Parquet column names by their Iceberg field id."""
    return {int(field.metadata[_FIELD_ID]): field.name for field in schema
            if field.metadata and _FIELD_ID in field.metadata}
