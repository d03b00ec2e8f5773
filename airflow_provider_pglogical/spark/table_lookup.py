"""A lookup of a few keys' rows in a lakehouse table, read by the driver from the table's own files.

A row delta that keeps TOAST values looks the rows they come from up by key. As a Spark query
that is a fresh JVM's first query, 2-2.5 s of a small spark-submit tick, and 0.1-0.5 s warm:
analysis, planning and code generation for a few rows. Iceberg's own scan planning (in the
calling thread) names the data files that may hold the keys and, per data file, the delete files
that apply to it; pyarrow reads the key column of each, then only the row groups holding a
wanted key, and drops the rows a position delete or an equality delete on the key removes.

It answers only where that is the whole of Iceberg's read: Parquet files on this machine's file
system with Iceberg field ids, position deletes, equality deletes on the key column alone, format
version 2, and at most :data:`MAX_ROWS` rows to scan. Anything else (deletion vectors, an
equality delete on other columns, a remote warehouse, a large table) returns None, and Spark
reads the rows as before.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.driver_commits import pyarrow_missing, same_thread_executor
from airflow_provider_pglogical.spark.hadoop_files import local_path
from airflow_provider_pglogical.spark.java_classes import java_class
from airflow_provider_pglogical.spark.kept_values import lookup_values
from airflow_provider_pglogical.spark.snapshot_values import field_column, field_names_by_id

#: the most rows (by the planned data files' record counts) the driver scans for a lookup:
#: beyond that Spark's parallel, vectorised read is the better reader
MAX_ROWS = 2_000_000
_POSITION_PATH, _POSITION_POS = "file_path", "pos"


def lookup_rows(spark, table, snapshot: int | None, key: str, columns: list[str], keys: list) -> dict | None:
    """The rows of ``keys`` in snapshot ``snapshot`` of ``table`` (Iceberg's Java table): key -> the
    values of ``columns`` (a tuple; timestamps as microseconds). A key the snapshot does not hold is
    left out. None when the driver cannot read the table as Iceberg would (see the module)."""
    if snapshot is None or not keys or pyarrow_missing() is not None \
            or table.operations().current().formatVersion() != 2:
        return None
    schema = table.schema()
    key_field = schema.findField(key)
    fields = [schema.findField(name) for name in columns]
    if key_field is None or any(field is None for field in fields):
        return None
    tasks = _planned(spark, table, snapshot, key, keys)
    if tasks is None:
        return None
    wanted = set(keys)
    deletes = _Deletes(key_field.fieldId())
    found: dict = {}
    for data_path, location, delete_files in tasks:
        rows = _live_rows(data_path, location, delete_files, deletes, [f.fieldId() for f in fields], wanted)
        if rows is None:
            return None
        for value, row in rows:
            if value in found:  # two live rows under one key: not a table this lookup understands
                return None
            found[value] = row
    return found


def _planned(spark, table, snapshot: int, key: str, keys: list) -> list[tuple[str, str, list]] | None:
    """Per data file that may hold a key: its local path, its location as Iceberg names it, and
    its delete files (content, local path, equality field ids). None when a file is not one the
    driver reads (see the module). Each task comes back as Iceberg's own JSON of it (``ScanTaskParser``):
    one call to the JVM per data file, where its getters would cost one per field and delete file."""
    import json

    scan = table.newScan().useSnapshot(snapshot).planWith(same_thread_executor(spark))
    if all(isinstance(value, int) and not isinstance(value, bool) for value in keys):
        # data files whose key bounds miss the keys' range are left out (two literals: py4j
        # carries a list one element per call). Other keys plan every file: a range taken by
        # Python's ordering of strings, dates or decimals must not be trusted to be Iceberg's
        expressions = java_class(spark, "org.apache.iceberg.expressions.Expressions")
        in_range = getattr(expressions, "and")(expressions.greaterThanOrEqual(key, min(keys)),
                                               expressions.lessThanOrEqual(key, max(keys)))
        scan = scan.filter(in_range)
    parser = java_class(spark, "org.apache.iceberg.ScanTaskParser")
    planned, rows = [], 0
    tasks = scan.planFiles()
    try:
        found = tasks.iterator()
        while found.hasNext():
            task = json.loads(parser.toJson(found.next()))
            data = task["data-file"]
            rows += data["record-count"]
            path = local_path(spark, data["file-path"])
            if rows > MAX_ROWS or path is None or data["file-format"] != "PARQUET":
                return None
            deletes = []
            for delete in task.get("delete-files", []):
                delete_path = local_path(spark, delete["file-path"])
                if delete_path is None or delete["file-format"] != "PARQUET" \
                        or delete["content"] not in ("POSITION_DELETES", "EQUALITY_DELETES"):
                    return None
                deletes.append((delete["content"], delete_path, list(delete.get("equality-ids", []))))
            planned.append((path, data["file-path"], deletes))
    finally:
        tasks.close()
    return planned


class _Deletes:
    """The delete files of one lookup, each read once: an equality delete of a later commit
    applies to every older data file, so many tasks name the same files."""

    def __init__(self, key_id: int) -> None:
        self.key_id = key_id
        self._read: dict[str, object] = {}

    def positions(self, path: str, location: str) -> set:
        """The row positions of data file ``location`` that position delete file ``path`` removes."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if path not in self._read:
            self._read[path] = pq.read_table(path, columns=[_POSITION_PATH, _POSITION_POS])
        read = self._read[path]
        return set(read.filter(pc.equal(read[_POSITION_PATH], location))[_POSITION_POS].to_pylist())

    def keys(self, path: str):
        """The keys equality delete file ``path`` removes (an Arrow array); None when it lacks the key."""
        if path not in self._read:
            self._read[path] = field_column(path, self.key_id)
        return self._read[path]


def _live_rows(path: str, location: str, delete_files: list, deletes: _Deletes, value_ids: list[int],
               wanted: set) -> list | None:
    """(key, values) of the data file's rows under a wanted key that no delete file removes; None
    when a file lacks a field this needs or a delete is of a kind not read here."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = field_names_by_id(parquet.schema_arrow)
    if deletes.key_id not in names:
        return None
    keys = parquet.read(columns=[names[deletes.key_id]])[names[deletes.key_id]]
    candidates = pc.is_in(keys, value_set=pa.array(list(wanted), type=keys.type))
    removed_positions: set = set()
    for kind, delete_path, ids in delete_files:
        if kind == "POSITION_DELETES":
            removed_positions |= deletes.positions(delete_path, location)
        elif ids == [deletes.key_id] and deletes.keys(delete_path) is not None:
            removed = deletes.keys(delete_path)
            candidates = pc.and_(candidates, pc.invert(pc.is_in(keys, value_set=removed.combine_chunks().cast(keys.type))))
        else:
            return None
    live = [p for p in pc.indices_nonzero(candidates).to_pylist() if p not in removed_positions]
    if not live:
        return []
    key_values = keys.take(pa.array(live, type=pa.int64())).to_pylist()
    return list(zip(key_values, _values_at(parquet, names, value_ids, live)))


def _values_at(parquet, names: dict[int, str], value_ids: list[int], positions: list[int]) -> list[tuple]:
    """The values of fields ``value_ids`` at row ``positions`` of the file, reading only the row
    groups that hold them; a field the file lacks (added after it was written) reads as NULL."""
    import bisect

    import pyarrow as pa

    starts, start = [], 0
    for group in range(parquet.metadata.num_row_groups):
        starts.append(start)
        start += parquet.metadata.row_group(group).num_rows
    present = [names[i] for i in value_ids if i in names]
    by_group: dict[int, list[int]] = {}
    for position in positions:
        group = bisect.bisect_right(starts, position) - 1
        by_group.setdefault(group, []).append(position - starts[group])
    rows: list[tuple] = []
    for group, offsets in by_group.items():
        read = parquet.read_row_group(group, columns=present).take(pa.array(offsets, type=pa.int64()))
        arrays = {name: lookup_values(read[name]) for name in present}
        for index in range(len(offsets)):
            rows.append(tuple(arrays[names[i]][index] if i in names else None for i in value_ids))
    return rows

