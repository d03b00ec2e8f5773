"""The values a table's current snapshot wrote, read from its own files when the driver committed it.

``kept_values.py`` remembers what a driver's last row delta of each table wrote, but only in the
JVM that committed it: a spark-submit run starts with nothing, and looks kept TOAST values up with
a Spark query, a fresh JVM's first (2-2.5 s of a small tick). The table's metadata says the same
as that memory. When the current snapshot is one of the driver's keyed row deltas (its summary
holds :data:`ROW_DELTA_PROPERTY`), its equality delete file lists every key it touched, and its
data file holds exactly the rows it left present: an equality delete applies only to older data
files, and nothing committed since. So a key in the data file holds that row, a key only in the
delete file is absent, and any other key is unknown (Spark reads it).

The driver reads both files with pyarrow where they are on this machine's file system; elsewhere,
or for any snapshot it cannot vouch for, it answers nothing.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.hadoop_files import local_path
from airflow_provider_pglogical.spark.kept_values import ABSENT

#: snapshot summary property of the driver's keyed row deltas (``RowDeltas.apply``)
ROW_DELTA_PROPERTY = "pglogical.row-delta"
ROW_DELTA_KEYED = "keyed"
_FIELD_ID = b"PARQUET:field_id"


def _files(iterable) -> list:
    found, files = iterable.iterator(), []
    while found.hasNext():
        files.append(found.next())
    return files


def written_values(spark, table, snapshot: int | None, key: str, columns: list[str], keys) -> dict:
    """The ``keys`` that snapshot ``snapshot`` of ``table`` (Iceberg's Java table) answers, when
    it is the table's current snapshot and the driver's keyed row delta on column ``key``: key ->
    the values of ``columns`` (a tuple; timestamps as microseconds, as a lookup reads them) or
    :data:`ABSENT`. A key left out is unknown."""
    current = table.currentSnapshot()
    if snapshot is None or current is None or current.snapshotId() != snapshot \
            or current.summary().get(ROW_DELTA_PROPERTY) != ROW_DELTA_KEYED:
        return {}
    schema = table.schema()
    key_field = schema.findField(key)
    fields = [schema.findField(name) for name in columns]
    if key_field is None or any(field is None for field in fields):
        return {}
    io = table.io()
    data, deletes = _files(current.addedDataFiles(io)), _files(current.addedDeleteFiles(io))
    if len(data) > 1 or len(deletes) != 1 or list(deletes[0].equalityFieldIds() or []) != [key_field.fieldId()]:
        return {}
    paths = [local_path(spark, file.location()) for file in (*data, *deletes)]
    if None in paths:
        return {}
    wanted = set(keys)
    deleted = _column(paths[-1], key_field.fieldId())
    if deleted is None:
        return {}
    found = {value: ABSENT for value in deleted.to_pylist() if value in wanted}
    if data:
        rows = _rows(paths[0], key_field.fieldId(), [field.fieldId() for field in fields], wanted)
        if rows is None:
            return {}
        found.update(rows)
    return found


def _column(path: str, field_id: int):
    """The column of field ``field_id`` in a Parquet file the driver wrote; None when absent."""
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
    arrays = [read[names[i]] for i in value_ids]
    arrays = [array.cast(pa.int64()) if pa.types.is_timestamp(array.type) else array for array in arrays]
    return dict(zip(read[names[key_id]].to_pylist(), zip(*(array.to_pylist() for array in arrays)))) \
        if read.num_rows else {}


def field_names_by_id(schema) -> dict[int, str]:
    """Top-level Parquet column names by their Iceberg field id."""
    return {int(field.metadata[_FIELD_ID]): field.name for field in schema
            if field.metadata and _FIELD_ID in field.metadata}
