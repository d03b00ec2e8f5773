"""A small change batch of a keyed table, applied without a MERGE: two Parquet files and one
Iceberg ``RowDelta`` commit.

A ``MERGE INTO`` costs every table its own query planning, Spark jobs and scan of the target,
about 0.3-0.5 s of a 2-core machine however few rows the batch holds. The driver instead reduces
the batch to the last state of every key it touches (pyarrow, :func:`last_change_per_key`, the
rules of ``reduction.py``) and writes:

* an **equality delete file** on the key columns, holding every key the batch touches (deleted,
  updated, inserted, or left by a key change);
* a **data file** with the last row of every key the batch leaves present; a value a row left
  unchanged (TOAST) comes from the batch's row that last sent it, else from the lakehouse row the
  row's history began at, looked up by key through Iceberg's reader (``_lakehouse_values``,
  ``lookups/table_rows.py``: no Spark job);

and commits both in one ``RowDelta``. Iceberg applies an equality delete to the data files of
earlier commits only (a lower data sequence number), so the new rows replace the old ones and
survive their own deletes. Running the step again (a crash before the state commit) deletes the
same keys again, the first run's rows with them, and writes the same rows: exact, as a MERGE.

It applies only where the result is the MERGE's by construction (:func:`ineligible` and
:meth:`RowDeltas.table_ineligible` say why not): the pull's facts describe the batch (no
TRUNCATE, nothing before the table's position), the table is unpartitioned, format 2 (not 3: row lineage),
merge-on-read, its columns are the batch's with the batch's types, none needs a cast, no key is a
float (NaN), an array or binary (Iceberg 1.9 loses equality deletes on binary columns), and kept
values sit under a one-column key that reads back exactly. The
rows pass through the driver, so the batch must be small and pyarrow importable there. Everything
else is MERGEd (``keyed.py``). Equality deletes cost readers until maintenance's
``rewrite_data_files`` folds them in; ``dead_deletes.py`` then removes the delete files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from airflow_provider_pglogical.spark.row_delta.driver_commits import DriverCommits, pyarrow_missing
from airflow_provider_pglogical.spark.common.identifiers import col
from airflow_provider_pglogical.spark.lookups.table_rows import lookup_rows
from airflow_provider_pglogical.staging.contract import (
    CHANGE_FACTS,
    COMMIT_LSN,
    OLD_KEY_PREFIX,
    OP,
    SEQ,
    UNCHANGED,
    staged_name,
)
from airflow_provider_pglogical.staging.column_types import column_type

log = logging.getLogger("pglogical.apply")

#: the most change rows a batch may hold to be applied by the driver (its rows pass through Python)
ROW_DELTA_MAX_ROWS = 20_000
#: the most change rows a batch that keeps values may hold: each row the lookup reads crosses py4j
#: value by value (``lookups/table_rows.py``), about 0.1 ms a value, where a MERGE's cost barely grows
KEPT_VALUES_MAX_ROWS = 2_000
#: lakehouse types whose staged Arrow values are the Iceberg values as they are (no cast)
_SIMPLE_TYPES = {"boolean", "int", "bigint", "float", "double", "string", "binary", "date", "timestamp",
                 "timestamp_ntz"}
FLOAT_TYPES = {"float", "double"}
#: Iceberg 1.9's reader loses equality deletes on a binary column: it reuses one buffer for every
#: binary value of a delete file it loads, so a shorter value read later overwrites the earlier
#: ones (apache/iceberg#11239; fixed after 1.9 by apache/iceberg#12855)
BINARY_EQUALITY = ("a binary column would be in the equality deletes, which Iceberg 1.9 loses "
                   "(apache/iceberg#11239)")
_WRITE_MODE_PROPERTIES = ("write.merge.mode", "write.update.mode", "write.delete.mode")


def _plain_type(kind: str) -> bool:
    """A Spark type the driver writes exactly as staged: a simple type or a decimal, or an array of one."""
    if kind.startswith("array<") and kind.endswith(">"):
        kind = kind[len("array<"):-1]
    return kind in _SIMPLE_TYPES or kind.startswith("decimal(")


def ineligible(manifest: dict, types: dict[str, str], position: int) -> str | None:
    """Why the batch of one keyed table (its manifest entry) is not applied as a row delta; None
    when it can be, as far as the manifest tells (:meth:`RowDeltas.table_ineligible` checks the table)."""
    reason = batch_ineligible(manifest, types, position)
    if reason is not None:
        return reason
    if any(types[key] in FLOAT_TYPES or types[key].startswith("array<") for key in manifest["key"]):
        return "a key column is a float or an array"
    if any(types[key] == "binary" for key in manifest["key"]):
        return BINARY_EQUALITY
    facts = manifest["details"][CHANGE_FACTS]
    if facts["unchanged"]:  # values kept from the lakehouse: looked up by key (RowDeltas._lakehouse_values)
        if not all(lookup_type(types[key]) for key in manifest["key"]):
            return "values are kept from the lakehouse under a key of a type not looked up"
        if any(kind.startswith("array<timestamp") for kind in types.values()):
            return "values are kept from the lakehouse and a column is an array of timestamps"
        if facts["rows"] > KEPT_VALUES_MAX_ROWS:
            return f"values are kept from the lakehouse for up to {facts['rows']} keys (more than {KEPT_VALUES_MAX_ROWS})"
    return None


def batch_ineligible(manifest: dict, types: dict[str, str], position: int) -> str | None:
    """Why the driver cannot reduce a table's change batch itself, for a table of any kind: no
    pyarrow, no change facts, too many rows, or columns the lakehouse holds otherwise."""
    reason = pyarrow_missing()
    if reason is not None:
        return reason
    details = manifest.get("details", {})
    facts = details.get(CHANGE_FACTS)
    if not facts or details.get("truncated"):
        return "the pull wrote no change facts for the batch (an earlier version staged it), or it holds a TRUNCATE"
    if facts["rows"] and facts["first_commit_lsn"] < position:
        return "the batch starts before the table's position"
    if facts["rows"] > ROW_DELTA_MAX_ROWS:
        return f"the batch holds {facts['rows']} rows (more than {ROW_DELTA_MAX_ROWS})"
    batch = {column["name"]: column_type(column) for column in manifest["columns"]}
    if batch != types:
        return "the table's columns or types differ from the batch's"
    if not all(_plain_type(kind) for kind in types.values()):
        return "a column's type needs a cast"
    return None


def lookup_type(kind: str) -> bool:
    """A type whose values read back from Spark equal the staged ones (no time zone, hashable):
    a key the kept values are looked up by, or a keyless table's column its copies are narrowed by."""
    return kind in ("int", "bigint", "string", "date") or kind.startswith("decimal(")


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

    def table_ineligible(self, table) -> str | None:
        """Why the Iceberg table takes no row delta; None when it does."""
        if not table.spec().isUnpartitioned():
            return "the table is partitioned"
        version = table.operations().current().formatVersion()
        if version != 2:  # v3: a MERGE keeps an updated row's _row_id (row lineage), these would not yet
            return f"the table is format version {version}"
        properties = table.properties()
        if any(properties.get(name) != "merge-on-read" for name in _WRITE_MODE_PROPERTIES):
            return "the table is copy-on-write"
        return None

    def apply(self, table, target: str, files: list[str], manifest: dict, types: dict[str, str]) -> int:
        """Apply the batch's change rows of one table (``files``) in one commit; returns their number."""
        import pyarrow as pa

        parts = [self._read_parquet(uri) for uri in files]
        if not parts:
            return 0
        rows = pa.concat_tables(parts, promote_options="default")
        keys = list(manifest["key"])
        reduction = last_change_per_key(rows, keys, [name for name in types if name not in keys])
        schema = table.schema()
        snapshot = table.currentSnapshot()
        base = snapshot.snapshotId() if snapshot is not None else None
        data = self._data_table(rows, reduction, table, target, keys, types, base)
        deletes = self._key_table(rows, reduction.touched, keys, schema)
        self.row_delta(table, data, deletes, keys, read_at=base)
        return rows.num_rows

    # files -------------------------------------------------------------------------------------
    def _read_parquet(self, uri: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pq.read_table(pa.BufferReader(self.staging.read_bytes(uri)))

    # Arrow tables with Iceberg's field ids ------------------------------------------------------
    def _data_table(self, rows, reduction: Reduction, table, target: str, keys: list[str], types: dict[str, str],
                    snapshot: int | None):
        """The present keys' rows: each column from the key's last row, or for a column some row
        left unchanged, from the row that last sent it, else from the lakehouse. Each column keeps
        the Arrow type the pull staged it in (the lakehouse type, ``ineligible``); a column no
        staged file holds is left out, and Iceberg reads it as NULL."""
        import pyarrow as pa
        import pyarrow.compute as pc

        last = rows.take(pa.array(reduction.last_rows, type=pa.int64()))
        kept = self._lakehouse_values(rows, table, target, keys, reduction, snapshot) \
            if reduction.sources else {}
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

    def _lakehouse_values(self, rows, table, target: str, keys: list[str], reduction: Reduction,
                          snapshot: int | None) -> dict:
        """Per column no row of the batch sent for some present key, the lakehouse's values (an Arrow
        array over the present keys): the row of the key's origin, else of the key itself (a step
        applied again: the origin's row is gone, the key's row holds what the first run kept).
        They are read at ``snapshot`` (the one the commit validates from) through Iceberg's reader
        (``lookups/table_rows.py``). Timestamps travel as microseconds, so no time zone touches them."""
        import pyarrow as pa

        missing = [name for name, sources in reduction.sources.items() if None in sources]
        if not missing:
            return {}
        needing = [i for i in range(len(reduction.present))
                   if any(reduction.sources[name][i] is None for name in missing)]
        wanted = {tuple(reduction.present[i]) for i in needing} | {tuple(reduction.origins[i]) for i in needing}
        found = lookup_rows(self.spark, table, snapshot, keys, missing, list(wanted), self.lakehouse.name(target))
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

    def _key_table(self, rows, touched: list[tuple], keys: list[str], schema):
        """Every touched key, with the Arrow types the key columns were staged in."""
        import pyarrow as pa

        fields, arrays = [], []
        for i, key in enumerate(keys):
            kind = rows[staged_name(key)].type
            fields.append(self.arrow_field(schema, key, kind))
            arrays.append(pa.array([values[i] for values in touched], type=kind))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


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
