"""The rows of a lakehouse table at one snapshot whose columns hold given values, read by Iceberg.

Two steps read a few rows of a table by value: a row delta fills the values a batch kept
unchanged (TOAST) from the rows the lakehouse holds under their keys (``row_deltas.py``), and a
keyless table's row delta counts the copies of the row values it touches
(``multiset_row_deltas.py``). Both read through ``IcebergGenerics``, Iceberg's own reader, in the
driver's JVM with the table's ``FileIO``: it follows the whole spec on any storage Iceberg
supports (sequence numbers, position and equality deletes, deletion vectors, files without field
ids through the table's name mapping, promoted types), filters files, row groups and rows by an
``in`` expression on the wanted values, and projects only the columns asked for. No Spark job:
about 0.1 s for a few keys (0.2 s for the first read of a JVM). The wanted values go into the JVM
as one pickled list, and the rows found come out as one Parquet file written in memory by
Iceberg's own generic writer (:func:`_read_columnar`): a few py4j round trips per read, where value
by value it was one per value and per row (``docs/benchmarks.md``, issue 46).

Values come back as Python values a staged Arrow column compares with: timestamps as
microseconds (no time zone touches them), dates as ``datetime.date``, binary as ``bytes``,
decimals as ``Decimal``, lists as lists.
"""

from __future__ import annotations

import datetime

from airflow_provider_pglogical.spark.common.java_classes import java_class, java_list
from airflow_provider_pglogical.spark.common.errors import ApplyError

_EPOCH = datetime.date(1970, 1, 1)
#: Iceberg's metadata columns naming a row's data file and its position in it (``MetadataColumns``)
FILE_COLUMN, POSITION_COLUMN = "_file", "_pos"
#: format v3's row lineage: a row's id, kept when an update rewrites it (``MetadataColumns.ROW_ID``)
ROW_ID_COLUMN = "_row_id"


class TooManyRows(Exception):
    """The rows matching a read's filter are more than its caller wants to pass through py4j."""


def read_rows(spark, table, snapshot: int | None, columns: list[str], narrowed: dict[str, list],
              limit: int | None = None, positions: bool = False, row_ids: bool = False) -> list[tuple]:
    """The values of ``columns`` (a tuple per row) of every row of snapshot ``snapshot`` of
    ``table`` (Iceberg's Java table) whose value in each column of ``narrowed`` is one of its list
    (None matches NULL). No rows when ``snapshot`` is None (an empty table).

    :param limit: raise :class:`TooManyRows` on reading more rows than this (None: no limit).
    :param positions: end each tuple with the row's data file and position in it (Iceberg's
        ``_file`` and ``_pos`` metadata columns, which its reader fills): where a position delete
        of the row points.
    :param row_ids: with ``positions``, put each row's ``_row_id`` (format v3's row lineage) before them.
    """
    if snapshot is None:
        return []
    expressions = java_class(spark, "org.apache.iceberg.expressions.Expressions")
    condition = expressions.alwaysTrue()
    for name, values in narrowed.items():
        condition = getattr(expressions, "and")(condition, _matching(spark, expressions, name, values))
    scan = java_class(spark, "org.apache.iceberg.data.IcebergGenerics").read(table).useSnapshot(snapshot).where(condition)
    kinds = [table.schema().findType(name) for name in columns]
    fields = list(table.schema().select(list(columns)).columns())
    if positions:
        metadata = java_class(spark, "org.apache.iceberg.MetadataColumns")
        fields += [*([metadata.ROW_ID] if row_ids else []), metadata.FILE_PATH, metadata.ROW_POSITION]
        columns = [*columns, *([ROW_ID_COLUMN] if row_ids else []), FILE_COLUMN, POSITION_COLUMN]
    projection = java_class(spark, "org.apache.iceberg.Schema")(fields)
    records = scan.project(projection).build()
    if all(_columnar_type(kind) for kind in kinds):
        order = [field.name() for field in fields]  # the file's columns, in this order
        return _read_columnar(spark, records, projection, [order.index(name) for name in columns], limit)
    convert = [_converter(spark, kind) for kind in kinds]
    if positions:
        convert += [*([_optional_int] if row_ids else []), str, int]
    rows: list[tuple] = []
    try:
        found = records.iterator()
        while found.hasNext():
            if limit is not None and len(rows) >= limit:
                raise TooManyRows(f"more than {limit} rows match")
            record = found.next()
            rows.append(tuple(to_python(record.getField(name)) for name, to_python in zip(columns, convert)))
    finally:
        records.close()
    return rows


def lookup_rows(spark, table, snapshot: int | None, key: str | list[str], columns: list[str], keys: list,
                name: str, positions: bool = False, row_ids: bool = False) -> dict:
    """The rows of ``keys`` in snapshot ``snapshot`` of ``table``: key -> the values of ``columns``
    (a tuple; with ``positions``, then the row's data file and position, see :func:`read_rows`).
    ``key`` is one key column (``keys`` holds its values) or a list of them (``keys``
    holds tuples). A key the snapshot does not hold is left out. Two rows under one key raise
    :class:`ApplyError` (the table ``name`` is not keyed as its batches say).

    A composite key is narrowed by an ``in`` on each of its columns, which reads every row whose
    values are each among the wanted ones (a superset of the wanted tuples); only the wanted tuples
    are kept.
    """
    composite = not isinstance(key, str)
    key_columns = list(key) if composite else [key]
    wanted = set(keys)
    narrowed = {column: sorted({k[i] for k in wanted}, key=_sortable) if composite else list(keys)
                for i, column in enumerate(key_columns)}
    width = len(key_columns)
    found: dict = {}
    for row in read_rows(spark, table, snapshot, [*key_columns, *columns], narrowed, positions=positions,
                         row_ids=row_ids):
        found_key = row[:width] if composite else row[0]
        if composite and found_key not in wanted:
            continue
        if found_key in found:
            shown = ", ".join(f"{c} = {v!r}" for c, v in zip(key_columns, row[:width]))
            raise ApplyError(f"Iceberg table {name} holds two rows under key {shown}, where its source "
                             f"table has one: the table was written by something other than this pipeline. Fix: "
                             f"re-snapshot the table (PgBackfillOperator) so it holds the source's rows again")
        found[found_key] = row[width:]
    return found


#: Iceberg types whose values a Parquet file written by Iceberg hands pyarrow as :func:`read_rows`
#: returns them (a timestamp as microseconds once cast); a read of any other type goes value by value
_COLUMNAR_TYPES = {"BOOLEAN", "INTEGER", "LONG", "FLOAT", "DOUBLE", "STRING", "DECIMAL", "DATE", "TIMESTAMP",
                   "BINARY", "FIXED"}


def _columnar_type(kind) -> bool:
    """Whether values of Iceberg type ``kind`` (Java) cross as Parquet (:func:`_read_columnar`)."""
    type_id = kind.typeId().name()
    if type_id == "LIST":
        return _columnar_type(kind.asListType().elementType())
    return type_id in _COLUMNAR_TYPES


def _read_columnar(spark, records, projection, columns: list[int], limit: int | None) -> list[tuple]:
    """The rows of Iceberg's reader ``records`` (a ``CloseableIterable`` of records of
    ``projection``; ``columns``: the positions in it of the columns wanted, in order), moved out of
    the JVM in one piece: Iceberg's own generic Parquet writer
    writes them all into memory in one py4j call, and pyarrow reads the file. Value by value, a
    row cost a py4j round trip per column and per row (about 0.1 ms each, idle; the 50-table round
    of docs/benchmarks.md spent most of its lookup time there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    memory = java_class(spark, "org.apache.iceberg.inmemory.InMemoryOutputFile")()
    parquet = java_class(spark, "org.apache.iceberg.FileFormat").PARQUET
    appender = java_class(spark, "org.apache.iceberg.data.GenericAppenderFactory")(projection).newAppender(
        memory, parquet)
    wanted = records if limit is None else java_class(
        spark, "org.apache.iceberg.relocated.com.google.common.collect.Iterables").limit(records, limit + 1)
    try:
        try:
            appender.addAll(wanted)
        finally:
            appender.close()
    finally:
        records.close()
    if not appender.metrics().recordCount():  # Iceberg's writer creates no file for no row
        return []
    found = pq.read_table(pa.BufferReader(bytes(memory.toByteArray())))
    if limit is not None and found.num_rows > limit:
        raise TooManyRows(f"more than {limit} rows match")
    # by position: Parquet names differ where Iceberg's are not Avro-compatible ("a.b" is "a_x2Eb")
    values = [_python_values(found.column(index)) for index in columns]
    return list(zip(*values)) if values else []


def _python_values(column) -> list:
    """A column pyarrow read as :func:`read_rows` returns it: timestamps (in lists too) as microseconds."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_timestamp(kind):
        return column.cast(pa.int64()).to_pylist()
    if pa.types.is_list(kind) and pa.types.is_timestamp(kind.value_type):
        return column.cast(pa.list_(pa.int64())).to_pylist()
    return column.to_pylist()


def _sortable(value) -> tuple:
    """A sort key for one key column's values, NULL first (a wanted value may be None)."""
    return (value is not None, value)


def arrow_values(array) -> list:
    """An Arrow column's values as :func:`read_rows` returns a table's (timestamps as microseconds)."""
    import pyarrow as pa

    return (array.cast(pa.int64()) if pa.types.is_timestamp(array.type) else array).to_pylist()


def _matching(spark, expressions, name: str, values: list):
    """Iceberg's expression for ``name IN (values)``, NULL matching a None among them; the values
    cross py4j as one list (:func:`java_list`)."""
    present = [_literal(value) for value in values if value is not None]
    matching = getattr(expressions, "in")(name, java_list(spark, present)) if present else expressions.alwaysFalse()
    if len(present) < len(values):
        matching = getattr(expressions, "or")(matching, expressions.isNull(name))
    return matching


def _literal(value):
    """A value as py4j hands it to Iceberg's literals: a date as its ISO text, which Iceberg
    converts to the column's date (py4j carries no Python date)."""
    return value.isoformat() if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime) \
        else value


def _optional_int(value) -> int | None:
    """A row id: None in files written before the table was v3 (they inherit none)."""
    return None if value is None else int(value)


def _converter(spark, kind):
    """How a value of Iceberg type ``kind`` (Java) becomes a Python one (see the module); py4j
    already converts numbers, booleans, strings and decimals."""
    type_id = kind.typeId().name()
    if type_id == "LIST":
        element = _converter(spark, kind.asListType().elementType())
        return lambda value: None if value is None else [element(item) for item in value]
    util = java_class(spark, "org.apache.iceberg.util.DateTimeUtil")
    if type_id == "DATE":
        return lambda value: None if value is None else _EPOCH + datetime.timedelta(days=util.daysFromDate(value))
    if type_id == "TIMESTAMP":
        micros = util.microsFromTimestamptz if kind.shouldAdjustToUTC() else util.microsFromTimestamp
        return lambda value: None if value is None else micros(value)
    if type_id == "BINARY":  # a ByteBuffer
        buffers = java_class(spark, "org.apache.iceberg.util.ByteBuffers")
        return lambda value: None if value is None else bytes(buffers.toByteArray(value))
    if type_id == "FIXED":  # a byte[], which py4j carries as bytes
        return lambda value: None if value is None else bytes(value)
    if type_id in ("BOOLEAN", "INTEGER", "LONG", "FLOAT", "DOUBLE", "STRING", "DECIMAL"):
        return lambda value: value
    return lambda value: None if value is None else value.toString()  # uuid, time: as Spark shows them
