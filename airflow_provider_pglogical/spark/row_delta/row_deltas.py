"""A small change batch of a keyed table, applied without a MERGE: two Parquet files and one
Iceberg ``RowDelta`` commit.

A ``MERGE INTO`` costs every table its own query planning, Spark jobs and scan of the target,
about 0.3-0.5 s of a 2-core machine however few rows the batch holds. The driver instead reduces
the batch to the last state of every key it touches (pyarrow, :func:`last_change_per_key`, the
rules of ``reduction.py``), reads the rows the table holds under those keys through Iceberg's own
reader (``lookups/table_rows.py``: no Spark job; with each row's data file and position, Iceberg's
``_file`` and ``_pos`` metadata columns) and writes:

* a **position delete file** (the spec's ``file_path``, ``pos``; ``driver_commits.py``) holding the data file and
  position of every row the batch replaces: the rows of keys it deletes, updates, inserts again or
  leaves by a key change;
* a **data file** with the last row of every key the batch leaves present; a value a row left
  unchanged (TOAST) comes from the batch's row that last sent it, else from the lakehouse row the
  row's history began at (the same read);

and commits both in one ``RowDelta`` validated from the snapshot it read (no data or delete file
added since, every data file a delete points into still live). Deletes are by position, never by
equality: every engine reads them (DuckDB, pyiceberg, Trino, Snowflake, Databricks), and a reader
opens a delete file only with the data files it names. Running the step again (a crash before the
state commit) reads the first run's rows under the same keys, deletes them and writes the same
rows: exact, as a MERGE.

It applies only where the result is the MERGE's by construction (:func:`ineligible` and
``paths/choice.py`` say why not): the pull's facts describe the batch (no TRUNCATE, nothing
before the table's position), the table is unpartitioned, format 2 (on 3 a MERGE keeps an updated
row's ``_row_id``, which these do not yet), merge-on-read, its columns are the batch's with the
batch's types, none needs a cast, and every key column is of a type whose values read back from
Iceberg equal the staged ones (:func:`lookup_type`). The rows
pass through the driver (the rows the read finds cross py4j as one in-memory Parquet file), so the batch
must be small (:data:`ROW_DELTA_MAX_ROWS`) and pyarrow importable there. Everything else is
MERGEd (``paths/merge.py``; merge-on-read, so Spark writes position deletes too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from airflow_provider_pglogical.spark.row_delta.driver_commits import DriverCommits, pyarrow_missing
from airflow_provider_pglogical.spark.common.identifiers import col
from airflow_provider_pglogical.spark.lookups.table_rows import lookup_rows
from airflow_provider_pglogical.staging.contract import (
    COMMIT_LSN,
    OLD_KEY_PREFIX,
    OP,
    SEQ,
    UNCHANGED,
    staged_name,
)
from airflow_provider_pglogical.staging.seam.manifests import TableManifest
from airflow_provider_pglogical.staging.seam.pg_types import SparkType
from airflow_provider_pglogical.staging.column_types import column_type

log = logging.getLogger("pglogical.apply")

#: the most change rows a batch may hold to be applied by the driver: its rows pass through Python,
#: and so do the rows the read of the replaced rows finds (``lookups/table_rows.py``), where a
#: MERGE's cost barely grows
ROW_DELTA_MAX_ROWS = 2_000


def _plain_type(kind: str) -> bool:
    """A Spark type the driver writes exactly as staged: a simple type or a decimal, or an array of one."""
    return SparkType.parse(kind).plain


def ineligible(manifest: TableManifest, types: dict[str, str], position: int) -> str | None:
    """Why the batch of one keyed table (its manifest entry) is not applied as a row delta; None
    when it can be, as far as the manifest tells (``paths/choice.py`` checks the table)."""
    reason = batch_ineligible(manifest, types, position)
    if reason is not None:
        return reason
    odd = [key for key in manifest.key if not lookup_type(types[key])]
    if odd:  # the rows a batch replaces are found by key, compared in Python
        return (f"key column {odd[0]} is {types[odd[0]]}, whose values the read of the rows the batch "
                "replaces does not compare exactly")
    if manifest.change_facts.unchanged and any(
            (spark_type := SparkType.parse(kind)).is_array and spark_type.element.is_timestamp for kind in types.values()):
        return "values are kept from the lakehouse and a column is an array of timestamps"
    return None


def batch_ineligible(manifest: TableManifest, types: dict[str, str], position: int) -> str | None:
    """Why the driver cannot reduce a table's change batch itself, for a table of any kind: no
    pyarrow, no change facts, too many rows, or columns the lakehouse holds otherwise."""
    reason = pyarrow_missing()
    if reason is not None:
        return reason
    facts = manifest.change_facts
    if not facts or manifest.truncated:
        return "the pull wrote no change facts for the batch (an earlier version staged it), or it holds a TRUNCATE"
    if facts.rows and facts.first_commit_lsn < position:
        return "the batch starts before the table's position"
    if facts.rows > ROW_DELTA_MAX_ROWS:
        return f"the batch holds {facts.rows} rows (more than {ROW_DELTA_MAX_ROWS})"
    batch = {column.name: column_type(column) for column in manifest.columns}
    if batch != types:
        return "the table's columns or types differ from the batch's"
    if not all(_plain_type(kind) for kind in types.values()):
        return "a column's type needs a cast"
    return None


def lookup_type(kind: str) -> bool:
    """A type whose values read back from Spark equal the staged ones (no time zone, hashable):
    a key the kept values are looked up by, or a keyless table's column its copies are narrowed by."""
    return SparkType.parse(kind).lookup_safe


@dataclass
class Reduction:
    """A change batch reduced to the last state of every key it touches (:func:`last_change_per_key`)."""

    #: every key the batch touches (tuples): deleted, written, or left by a key change
    touched: list
    #: the keys it leaves present, and per present key the staged row of its last change
    present: list = field(default_factory=list)
    last_rows: list = field(default_factory=list)
    #: per value column some row left unchanged: per present key, the staged row its value comes
    #: from, or None when no row of the batch sent it (the lakehouse holds it, under ``origins``)
    sources: dict = field(default_factory=dict)
    #: per present key, the key whose lakehouse row holds the values the batch did not send
    origins: list = field(default_factory=list)


def last_change_per_key(rows, keys: list[str], values: list[str] = ()) -> Reduction:
    """The last state of every key a change batch touches, as the Spark reduction computes it
    (``reduction.py``): the last change per key by ``(_commit_lsn, _seq)``; a key-changing UPDATE
    deletes the old key and carries the row's history to the new one; a value column a row left
    unchanged keeps the value an earlier row of the same history sent, else the lakehouse row's
    where that history began (its origin: the key itself, or the first key it was moved from).

    :param rows: the staged change rows (``contract`` names), every one at or after the table's
        position, no TRUNCATE among them.
    :param values: the value columns (needed only when a row leaves one unchanged).
    """
    import pyarrow.compute as pc

    order = pc.sort_indices(rows, sort_keys=[(COMMIT_LSN, "ascending"), (SEQ, "ascending")]).to_pylist()
    ops = rows[OP].to_pylist()
    count = rows.num_rows
    new = list(zip(*(rows[staged_name(key)].to_pylist() for key in keys)))
    old = list(zip(*(rows[OLD_KEY_PREFIX + key].to_pylist() if OLD_KEY_PREFIX + key in rows.column_names
                     else [None] * count for key in keys)))
    unchanged = rows[UNCHANGED].to_pylist() if UNCHANGED in rows.column_names else [None] * count
    tracked = sorted({name for names in unchanged if names for name in names} & set(values))
    # key -> None (deleted) or (its last row, {tracked column: row that sent it}, origin)
    state: dict[tuple, tuple | None] = {}
    for index in order:
        op = ops[index]
        if op not in ("I", "U", "D"):
            raise ValueError(f"change row with operation {op!r} in a batch the pull's facts decide")
        key = new[index]
        if op == "D":
            state[key] = None
            continue
        if op == "U" and any(value is not None for value in old[index]) and old[index] != key:
            history = state.get(old[index]) or (None, {}, old[index])  # a key change: the old key leaves
            state[old[index]] = None
        elif op == "U":
            history = state.get(key) or (None, {}, key)
        else:
            history = (None, {}, key)  # an INSERT begins a history
        sent = history[1]
        if tracked:
            kept = set(unchanged[index] or ())
            sent = {**sent, **{name: index for name in tracked if name not in kept}}
        state[key] = (index, sent, history[2])
    reduction = Reduction(touched=list(state))
    for key, last in state.items():
        if last is not None:
            reduction.present.append(key)
            reduction.last_rows.append(last[0])
            reduction.origins.append(last[2])
    for name in tracked:
        reduction.sources[name] = [state[key][1].get(name) for key in reduction.present]
    return reduction


class RowDeltas(DriverCommits):
    """Applies eligible change batches of keyed tables as Iceberg row deltas (see the module)."""

    def __init__(self, spark, staging, lakehouse) -> None:
        super().__init__(spark, lakehouse)
        self.staging = staging

    def apply(self, table, target: str, files: list[str], manifest: TableManifest, types: dict[str, str],
              batch: str) -> int | None:
        """Apply batch ``batch``'s change rows of one table (``files``) in one commit; returns their number."""
        import pyarrow as pa

        parts = [self._read_parquet(uri) for uri in files]
        if not parts:
            return 0
        rows = pa.concat_tables(parts, promote_options="default")
        keys = list(manifest.key)
        reduction = last_change_per_key(rows, keys, [name for name in types if name not in keys])
        snapshot = table.currentSnapshot()
        base = snapshot.snapshotId() if snapshot is not None else None
        missing = [name for name, sources in reduction.sources.items() if None in sources]
        # every touched key's row, where the table holds one: its position is deleted (a present
        # key's new row is in the data file), and its values fill what the batch kept unchanged
        lineage = table.operations().current().formatVersion() >= 3  # an updated row keeps its _row_id
        found = lookup_rows(self.spark, table, base, keys, missing, list(reduction.touched),
                            self.lakehouse.name(target), positions=True, row_ids=lineage)
        data = self._data_table(rows, reduction, table, types, missing, found)
        if lineage:
            data = self.with_row_ids(data, table, [found.get(tuple(key)) for key in reduction.present])
        deletes = [(row[-2], row[-1]) for row in found.values()]
        self.row_delta(table, data, deletes, read_at=base)
        return rows.num_rows

    # files -------------------------------------------------------------------------------------
    def _read_parquet(self, uri: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pq.read_table(pa.BufferReader(self.staging.read_bytes(uri)))

    # Arrow tables with Iceberg's field ids ------------------------------------------------------
    def _data_table(self, rows, reduction: Reduction, table, types: dict[str, str], missing: list[str],
                    found: dict):
        """The present keys' rows: each column from the key's last row, or for a column some row
        left unchanged, from the row that last sent it, else from the lakehouse (``found``). Each
        column keeps the Arrow type the pull staged it in (the lakehouse type, ``ineligible``); a
        column no staged file holds is left out, and Iceberg reads it as NULL."""
        import pyarrow as pa
        import pyarrow.compute as pc

        last = rows.take(pa.array(reduction.last_rows, type=pa.int64()))
        kept = self._lakehouse_values(rows, reduction, missing, found)
        schema = table.schema()
        fields, arrays = [], []
        for name in types:
            staged = staged_name(name)
            if staged not in rows.column_names:
                continue
            field = self.arrow_field(schema, name, rows[staged].type)
            if name in reduction.sources:
                sources = reduction.sources[name]
                array = rows[staged].take(pa.array(sources, type=pa.int64()))
                if name in kept:
                    array = pc.if_else(pa.array([index is None for index in sources]), kept[name], array)
            else:
                array = last[staged]
            fields.append(field)
            arrays.append(array.cast(field.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def _lakehouse_values(self, rows, reduction: Reduction, missing: list[str], found: dict) -> dict:
        """Per column no row of the batch sent for some present key (``missing``), the lakehouse's
        values (an Arrow array over the present keys): the row of the key's origin, else of the key
        itself (a step applied again: the origin's row is gone, the key's row holds what the first
        run kept). ``found`` holds them as the step read them through Iceberg's reader
        (``lookups/table_rows.py``), at the snapshot the commit validates from. Timestamps travel
        as microseconds, so no time zone touches them."""
        import pyarrow as pa

        values = {}
        for position, name in enumerate(missing):
            column = []
            for i, own in enumerate(reduction.present):
                row = found.get(tuple(reduction.origins[i])) or found.get(tuple(own))
                column.append(plain_value(row[position]) if row is not None else None)
            kind = rows[staged_name(name)].type
            if pa.types.is_timestamp(kind):
                values[name] = pa.array(column, type=pa.int64()).cast(kind)
            else:
                values[name] = pa.array(column, type=kind)
        return values


def readable(name: str, kind: str):
    """Column ``name`` of Spark type ``kind`` as the driver compares it with staged values:
    timestamps as microseconds (so no time zone touches them), everything else as it is."""
    from pyspark.sql import functions as F

    if kind == "timestamp":
        return F.unix_micros(col(name))
    if kind == "timestamp_ntz":  # the job's session is UTC: the wall time as it is
        return F.unix_micros(col(name).cast("timestamp"))
    return col(name)


def is_in(name: str, values: list):
    """``name IN (values…)`` as a Spark column, built in one call to the JVM: py4j carries the list,
    each value converted as ``lit`` would convert it. ``Column.isin`` of Python values makes a call
    per value (about 0.5 ms each here, 40 ms for 80 keys)."""
    from pyspark.sql import Column

    return Column(col(name)._jc.isInCollection(list(values)))


def plain_value(value):
    """A value Spark returned, as pyarrow takes it (binary comes back as a bytearray)."""
    return bytes(value) if isinstance(value, bytearray) else value
