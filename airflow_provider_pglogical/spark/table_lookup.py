"""Rows of a lakehouse table read by the driver from the table's own files, for a few values.

Two steps look rows up: a row delta that keeps TOAST values reads the rows they come from by key
(``row_deltas.py``), and a keyless table's row delta counts the copies of each row value it
touches (``multiset_row_deltas.py``). As a Spark query either is a fresh JVM's first query, 2-5 s
of a small spark-submit tick, and 0.1-0.5 s warm: analysis, planning and code generation for a
few rows. Iceberg's own scan planning (in the calling thread) names the data files that may hold
the values and, per data file, the delete files that apply to it; pyarrow reads the narrowing
columns of each, then only the row groups holding a wanted row, and drops the rows a position
delete or an equality delete removes (NULL matching NULL, as Iceberg matches it).

It answers only where that is the whole of Iceberg's read: Parquet files on this machine's file
system with Iceberg field ids, position and equality deletes (none on a float or binary column),
format version 2, and at most :data:`MAX_ROWS` rows to scan. Anything else (deletion vectors, a
remote warehouse, a large table) returns None, and Spark reads the rows as before.
"""

from __future__ import annotations

from airflow_provider_pglogical.spark.driver_commits import pyarrow_missing, same_thread_executor
from airflow_provider_pglogical.spark.hadoop_files import local_path
from airflow_provider_pglogical.spark.java_classes import java_class
from airflow_provider_pglogical.spark.kept_values import lookup_values
from airflow_provider_pglogical.spark.snapshot_values import field_names_by_id

#: the most rows (by the planned data files' record counts) the driver scans for a lookup:
#: beyond that Spark's parallel, vectorised read is the better reader
MAX_ROWS = 2_000_000
_POSITION_PATH, _POSITION_POS = "file_path", "pos"


def lookup_rows(spark, table, snapshot: int | None, key: str, columns: list[str], keys: list) -> dict | None:
    """The rows of ``keys`` in snapshot ``snapshot`` of ``table`` (Iceberg's Java table): key -> the
    values of ``columns`` (a tuple; timestamps as microseconds). A key the snapshot does not hold is
    left out. None when the driver cannot read the table as Iceberg would (see the module)."""
    if not keys:
        return None
    rows = live_rows(spark, table, snapshot, [key, *columns], {key: list(keys)})
    if rows is None:
        return None
    found: dict = {}
    for row in rows:
        if row[0] in found:  # two live rows under one key: not a table this lookup understands
            return None
        found[row[0]] = row[1:]
    return found


def live_rows(spark, table, snapshot: int | None, columns: list[str], narrowed: dict[str, list]) -> list[tuple] | None:
    """The values of ``columns`` (a tuple per row; timestamps as microseconds) of every row of
    snapshot ``snapshot`` of ``table`` whose value in each column of ``narrowed`` is one of its
    list (None matches NULL). None when the driver cannot read the table as Iceberg would."""
    if snapshot is None or not narrowed or pyarrow_missing() is not None \
            or table.operations().current().formatVersion() != 2:
        return None
    schema = table.schema()
    fields = {name: schema.findField(name) for name in dict.fromkeys([*columns, *narrowed])}
    if any(found is None for found in fields.values()):
        return None
    tasks = _planned(spark, table, snapshot, narrowed)
    if tasks is None:
        return None
    wanted = {fields[name].fieldId(): values for name, values in narrowed.items()}
    output = [fields[name].fieldId() for name in columns]
    deletes = _Deletes()
    rows: list[tuple] = []
    for data_path, location, delete_files in tasks:
        read = _live_rows(data_path, location, delete_files, deletes, wanted, output)
        if read is None:
            return None
        rows += read
    return rows


def _planned(spark, table, snapshot: int, narrowed: dict[str, list]) -> list[tuple[str, str, list]] | None:
    """Per data file that may hold a wanted row: its local path, its location as Iceberg names it,
    and its delete files (content, local path, equality field ids). None when a file is not one the
    driver reads (see the module). Each task comes back as Iceberg's own JSON of it (``ScanTaskParser``):
    one call to the JVM per data file, where its getters would cost one per field and delete file."""
    import json

    scan = table.newScan().useSnapshot(snapshot).planWith(same_thread_executor(spark))
    for name, values in narrowed.items():
        if values and all(isinstance(value, int) and not isinstance(value, bool) for value in values):
            # data files whose bounds miss the values' range are left out (two literals: py4j
            # carries a list one element per call). Only for integers, and never with NULL wanted:
            # a range taken by Python's ordering of strings, dates or decimals must not be trusted
            # to be Iceberg's, and a range leaves out the files that hold only NULLs
            expressions = java_class(spark, "org.apache.iceberg.expressions.Expressions")
            scan = scan.filter(getattr(expressions, "and")(expressions.greaterThanOrEqual(name, min(values)),
                                                           expressions.lessThanOrEqual(name, max(values))))
            break
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
                deletes.append((delete["content"], delete_path, tuple(delete.get("equality-ids", []))))
            planned.append((path, data["file-path"], deletes))
    finally:
        tasks.close()
    return planned


class _Deletes:
    """The delete files of one read, each read once: an equality delete of a later commit applies
    to every older data file, so many tasks name the same files."""

    def __init__(self) -> None:
        self._read: dict[tuple, object] = {}

    def positions(self, path: str, location: str) -> set:
        """The row positions of data file ``location`` that position delete file ``path`` removes."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if ("positions", path) not in self._read:
            self._read["positions", path] = pq.read_table(path, columns=[_POSITION_PATH, _POSITION_POS])
        read = self._read["positions", path]
        return set(read.filter(pc.equal(read[_POSITION_PATH], location))[_POSITION_POS].to_pylist())

    def equal(self, path: str, ids: tuple[int, ...]):
        """Equality delete file ``path``'s rows over fields ``ids``: an Arrow array for one field,
        a set of tuples for more; None when the file lacks a field or one is a float or binary
        (Iceberg's equality of those is not Python's or Arrow's)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if ("equal", path, ids) not in self._read:
            read = pq.read_table(path)
            names = field_names_by_id(read.schema)
            columns = [read[names[i]] for i in ids if i in names]
            if len(columns) != len(ids) or any(pa.types.is_floating(c.type) or pa.types.is_binary(c.type)
                                               or pa.types.is_large_binary(c.type) for c in columns):
                self._read["equal", path, ids] = None
            elif len(ids) == 1:
                self._read["equal", path, ids] = columns[0].combine_chunks()
            else:
                self._read["equal", path, ids] = set(zip(*(lookup_values(c) for c in columns)))
        return self._read["equal", path, ids]


def _live_rows(path: str, location: str, delete_files: list, deletes: _Deletes, wanted: dict[int, list],
               output: list[int]) -> list | None:
    """The values of fields ``output`` of the data file's wanted rows (see :func:`live_rows`) that
    no delete file removes; None when a delete is of a kind not read here."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    names = field_names_by_id(parquet.schema_arrow)
    for field_id, values in wanted.items():
        if field_id not in names and None not in values:  # a field added later reads as NULL
            return []
    present = [i for i in wanted if i in names]
    read = parquet.read(columns=[names[i] for i in present]) if present else None
    candidates = None  # every row, until a read column narrows them
    for field_id in present:
        column = read[names[field_id]]
        matched = pc.is_in(column, value_set=pa.array(wanted[field_id], type=column.type))
        candidates = matched if candidates is None else pc.and_(candidates, matched)
    removed_positions: set = set()
    by_tuple = []  # (field ids, the rows a delete file removes) of deletes over more than a read column
    for kind, delete_path, ids in delete_files:
        if kind == "POSITION_DELETES":
            removed_positions |= deletes.positions(delete_path, location)
            continue
        removed = deletes.equal(delete_path, ids)
        if removed is None:
            return None
        if len(ids) == 1 and ids[0] in present:
            column = read[names[ids[0]]]
            candidates = pc.and_(candidates, pc.invert(pc.is_in(column, value_set=removed.cast(column.type))))
        else:
            by_tuple.append((ids, removed if len(ids) > 1 else set((value,) for value in lookup_values(removed))))
    rows_at = range(parquet.metadata.num_rows) if candidates is None else pc.indices_nonzero(candidates).to_pylist()
    live = [p for p in rows_at if p not in removed_positions]
    if not live:
        return []
    needed = list(dict.fromkeys([*output, *(i for ids, _ in by_tuple for i in ids)]))
    index = {field_id: position for position, field_id in enumerate(needed)}
    rows = []
    for row in _values_at(parquet, names, needed, live):
        if not any(tuple(row[index[i]] for i in ids) in removed for ids, removed in by_tuple):
            rows.append(tuple(row[index[i]] for i in output))
    return rows


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
    if not present:
        return [(None,) * len(value_ids)] * len(positions)
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
