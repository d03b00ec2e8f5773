"""A small change batch of a keyed table, applied without a Spark query: two Parquet files and
one Iceberg ``RowDelta`` commit.

A ``MERGE INTO`` costs every table its own query planning, Spark jobs and scan of the target,
about 0.3-0.5 s of a 2-core machine however few rows the batch holds. A batch that only sets
whole rows needs none of that. The driver reduces it to the last change per key (pyarrow) and
writes:

* an **equality delete file** on the key columns, holding every key the batch touches (deleted,
  updated, inserted, or left by a key change);
* a **data file** with the last row of every key the batch leaves present;

and commits both in one ``RowDelta``. Iceberg applies an equality delete to the data files of
earlier commits only (a lower data sequence number), so the new rows replace the old ones and
survive their own deletes. Running the step again (a crash before the state commit) deletes the
same keys again, the first run's rows with them, and writes the same rows: exact, as a MERGE.

It applies only where the result is the MERGE's by construction (:func:`ineligible` says why not):
the pull's facts decide the batch (no TRUNCATE, no value kept from the lakehouse, nothing before
the table's position), the table is unpartitioned, format 2, merge-on-read, its columns are the
batch's with the batch's types, none of them needs a cast, and no key is a float (NaN). The rows
are read and written by the driver, so the batch must be small and pyarrow importable there.
Everything else is MERGEd (``keyed.py``). Equality deletes cost readers until compaction folds
them in (``IcebergMaintenanceOperator``'s ``rewrite_data_files``).
"""

from __future__ import annotations

import importlib.util
import logging
import uuid

from airflow_provider_pglogical.staging.contract import COMMIT_LSN, OLD_KEY_PREFIX, OP, SEQ, column_type, facts_decide, staged_name

log = logging.getLogger("pglogical.apply")

#: the most change rows a batch may hold to be applied by the driver (its rows pass through Python)
ROW_DELTA_MAX_ROWS = 20_000
#: lakehouse types whose staged Arrow values are the Iceberg values as they are (no cast)
_SIMPLE_TYPES = {"boolean", "int", "bigint", "float", "double", "string", "binary", "date", "timestamp",
                 "timestamp_ntz"}
_FLOAT_TYPES = {"float", "double"}
_WRITE_MODE_PROPERTIES = ("write.merge.mode", "write.update.mode", "write.delete.mode")


def _plain_type(kind: str) -> bool:
    """A Spark type the driver writes exactly as staged: a simple type or a decimal, or an array of one."""
    if kind.startswith("array<") and kind.endswith(">"):
        kind = kind[len("array<"):-1]
    return kind in _SIMPLE_TYPES or kind.startswith("decimal(")


def ineligible(manifest: dict, types: dict[str, str], position: int) -> str | None:
    """Why the batch of one table (its manifest entry) is not applied as a row delta; None when it
    can be, as far as the manifest tells (:meth:`RowDeltas.table_ineligible` checks the table)."""
    if importlib.util.find_spec("pyarrow") is None:
        return "pyarrow is not installed where the driver runs"
    facts = facts_decide(manifest.get("details", {}), position)
    if facts is None:
        return "the batch keeps lakehouse values, holds a TRUNCATE or starts before the table's position"
    if facts["rows"] > ROW_DELTA_MAX_ROWS:
        return f"the batch holds {facts['rows']} rows (more than {ROW_DELTA_MAX_ROWS})"
    batch = {column["name"]: column_type(column) for column in manifest["columns"]}
    if batch != types:
        return "the table's columns or types differ from the batch's"
    if not all(_plain_type(kind) for kind in types.values()):
        return "a column's type needs a cast"
    if any(types[key] in _FLOAT_TYPES or types[key].startswith("array<") for key in manifest["key"]):
        return "a key column is a float or an array"
    return None


def last_change_per_key(rows, keys: list[str]):
    """The reduction of a change batch without kept values: ``(present, touched)``.

    :param rows: the staged change rows (``contract`` names), every one at or after the table's
        position, no TRUNCATE among them.
    :returns: the indices into ``rows`` (an Arrow array) of the last row of every key the batch leaves present,
        and every key the batch touches (a list of tuples): deleted, written, or left by a key change.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    order = pc.sort_indices(rows, sort_keys=[(COMMIT_LSN, "ascending"), (SEQ, "ascending")]).to_pylist()
    ops = rows[OP].to_pylist()
    count = rows.num_rows
    new = list(zip(*(rows[staged_name(key)].to_pylist() for key in keys)))
    old_columns = [rows[OLD_KEY_PREFIX + key].to_pylist() if OLD_KEY_PREFIX + key in rows.column_names
                   else [None] * count for key in keys]
    old = list(zip(*old_columns))
    last: dict[tuple, int | None] = {}  # key -> index of its last row, None when deleted
    for index in order:
        op = ops[index]
        if op not in ("I", "U", "D"):
            raise ValueError(f"change row with operation {op!r} in a batch the pull's facts decide")
        if op == "U" and any(value is not None for value in old[index]) and old[index] != new[index]:
            last[old[index]] = None  # a key change: the old key leaves
        last[new[index]] = None if op == "D" else index
    present = sorted(index for index in last.values() if index is not None)
    return pa.array(present, type=pa.int64()), list(last)


class RowDeltas:
    """Applies eligible change batches of keyed tables as Iceberg row deltas (see the module)."""

    def __init__(self, spark, staging, lakehouse) -> None:
        self.spark = spark
        self.staging = staging
        self.lakehouse = lakehouse
        self._jvm = spark.sparkContext._jvm
        self._gateway = spark.sparkContext._gateway

    def load(self, target: str):
        """The Iceberg table (Java) as Spark's catalog holds it: a commit here is what Spark reads next."""
        return self._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(
            self.spark._jsparkSession, self.lakehouse.name(target))

    def table_ineligible(self, table) -> str | None:
        """Why the Iceberg table takes no row delta; None when it does."""
        if not table.spec().isUnpartitioned():
            return "the table is partitioned"
        if table.operations().current().formatVersion() < 2:
            return "the table is format version 1"
        properties = table.properties()
        if any(properties.get(name) != "merge-on-read" for name in _WRITE_MODE_PROPERTIES):
            return "the table is copy-on-write"
        return None

    def apply(self, table, files: list[str], manifest: dict, types: dict[str, str]) -> int:
        """Apply the batch's change rows of one table (``files``) in one commit; returns their number."""
        import pyarrow as pa

        parts = [self._read_parquet(uri) for uri in files]
        if not parts:
            return 0
        rows = pa.concat_tables(parts, promote_options="default")
        keys = list(manifest["key"])
        present, touched = last_change_per_key(rows, keys)
        schema = table.schema()
        data = self._data_table(rows.take(present), schema, types)
        deletes = self._key_table(touched, keys, schema, types)
        jvm = self._jvm
        delta = table.newRowDelta()
        if data.num_rows:
            path = self._write(table, data, "data")
            written = table.io().newInputFile(path)
            delta.addRows(jvm.org.apache.iceberg.DataFiles.builder(table.spec()).withInputFile(written)
                          .withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET)
                          .withMetrics(self._metrics(table, written)).build())
        if deletes.num_rows:
            path = self._write(table, deletes, "deletes")
            written = table.io().newInputFile(path)
            ids = self._gateway.new_array(jvm.int, len(keys))
            for i, key in enumerate(keys):
                ids[i] = schema.findField(key).fieldId()
            delta.addDeletes(jvm.org.apache.iceberg.FileMetadata.deleteFileBuilder(table.spec())
                             .ofEqualityDeletes(ids).withPath(path).withFileSizeInBytes(written.getLength())
                             .withFormat(jvm.org.apache.iceberg.FileFormat.PARQUET)
                             .withMetrics(self._metrics(table, written)).build())
        delta.commit()
        return rows.num_rows

    # files -------------------------------------------------------------------------------------
    def _read_parquet(self, uri: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pq.read_table(pa.BufferReader(self.staging.read_bytes(uri)))

    def _write(self, table, frame, kind: str) -> str:
        """Write ``frame`` as a Parquet file where the table keeps its data; returns its location."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(frame, sink, compression="zstd")
        path = table.locationProvider().newDataLocation(f"pglogical-{uuid.uuid4().hex}-{kind}.parquet")
        out = table.io().newOutputFile(path).create()
        try:
            out.write(bytearray(sink.getvalue().to_pybytes()))
        finally:
            out.close()
        return path

    def _metrics(self, table, written):
        """Column bounds and counts from the file's footer, as Iceberg's own import reads them."""
        jvm = self._jvm
        return jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(
            written, jvm.org.apache.iceberg.MetricsConfig.forTable(table))

    # Arrow tables with Iceberg's field ids ------------------------------------------------------
    def _data_table(self, rows, schema, types: dict[str, str]):
        import pyarrow as pa

        fields = [self._field(schema, name, _arrow_type(kind)) for name, kind in types.items()]
        arrays = [rows[staged_name(name)].cast(field.type) if staged_name(name) in rows.column_names
                  else pa.nulls(rows.num_rows, field.type) for name, field in zip(types, fields)]
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def _key_table(self, touched: list[tuple], keys: list[str], schema, types: dict[str, str]):
        import pyarrow as pa

        fields, arrays = [], []
        for i, key in enumerate(keys):
            kind = _arrow_type(types[key])
            fields.append(self._field(schema, key, kind))
            arrays.append(pa.array([values[i] for values in touched], type=kind))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def _field(self, schema, name: str, kind):
        """The Arrow field of Iceberg column ``name``: its field id (and its list element's), required or not."""
        import pyarrow as pa

        field = schema.findField(name)
        if pa.types.is_list(kind):
            element_id = field.type().asListType().elementId()
            kind = pa.list_(pa.field("element", kind.value_type, metadata={b"PARQUET:field_id": str(element_id).encode()}))
        return pa.field(name, kind, nullable=field.isOptional(),
                        metadata={b"PARQUET:field_id": str(field.fieldId()).encode()})


def _arrow_type(kind: str):
    """The Arrow type the pull stages a column of lakehouse type ``kind`` in (``staging/typemap.py``)."""
    import pyarrow as pa

    simple = {"boolean": pa.bool_(), "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(),
              "double": pa.float64(), "string": pa.string(), "binary": pa.binary(), "date": pa.date32(),
              "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us")}
    if kind in simple:
        return simple[kind]
    if kind.startswith("decimal("):
        precision, scale = kind[len("decimal("):-1].split(",")
        return pa.decimal128(int(precision), int(scale))
    if kind.startswith("array<"):
        return pa.list_(_arrow_type(kind[len("array<"):-1]))
    raise ValueError(f"no Arrow type for lakehouse type {kind}")
