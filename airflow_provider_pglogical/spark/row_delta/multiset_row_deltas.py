"""A small change batch of a keyless table (a multiset), applied without a MERGE: one Iceberg
``RowDelta`` the driver commits, as ``row_deltas.py`` does for keyed tables.

The lakehouse numbers the n identical copies of a row value 1..n (``_pglogical_occurrence``),
so (values, occurrence) is a key (``multisets.py``). The driver nets the batch per row value
(+1 per INSERT and UPDATE's new row, -1 per DELETE and UPDATE's old row: :func:`net_copies`),
reads how many copies each touched value has and whether this batch has written one already
(through Iceberg's reader, ``lookups/table_rows.py``, else one Spark aggregate), and commits:

* an **equality delete file** on (values, occurrence) with the copies above the new count, and
  the highest copy kept, which is written again with the batch's name (the MERGE's mark);
* a **data file** with the copies added (count+1..count+d) and that marked copy.

Equality deletes match NULLs as equal, as PostgreSQL's subscriber compares rows here. A step
applied again (a crash before the state commit) finds the batch's name on every value it left
copies of, and skips those: exact, as the MERGE is (:func:`copy_changes`).

It applies where the MERGE's result is this by construction (:func:`multiset_ineligible`): the
batch facts hold (no TRUNCATE, nothing before the table's position), no column is a float
(equality deletes compare ``-0.0`` and ``0.0`` apart), an array (equality deletes take
primitive columns only) or binary (Iceberg 1.9 loses equality deletes on binary columns,
apache/iceberg#11239), no TOAST value was left out, and the table is numbered, unpartitioned,
format 2 and merge-on-read. Everything else is MERGEd (``multisets.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_provider_pglogical.spark.common.identifiers import col
from airflow_provider_pglogical.spark.lookups.table_rows import TooManyRows, arrow_values, read_rows
from airflow_provider_pglogical.spark.row_delta.row_deltas import (
    BINARY_EQUALITY,
    FLOAT_TYPES,
    RowDeltas,
    batch_ineligible,
    is_in,
    lookup_type,
    plain_value,
    readable,
)
from airflow_provider_pglogical.staging.contract import (
    CHANGE_FACTS,
    MULTISET_COLUMNS,
    OCCURRENCE,
    OLD_KEY_PREFIX,
    OP,
    WRITTEN_BY,
    staged_name,
)

#: a prefilter column's distinct values above this are not listed in the lookup's filter (each
#: literal is a round trip to the JVM); the aggregate still matches every value exactly
MAX_FILTER_VALUES = 2_000
#: the most rows the driver reads through Iceberg's reader to count copies; more are counted by Spark
MAX_READ_ROWS = 5_000


def multiset_ineligible(manifest: dict, types: dict[str, str], position: int) -> str | None:
    """Why a keyless table's batch is not applied as a row delta; None when it can be, as far as
    the manifest tells (``paths/choice.py`` checks the table)."""
    values = {name: kind for name, kind in types.items() if name not in MULTISET_COLUMNS}
    reason = batch_ineligible(manifest, values, position)
    if reason is not None:
        return reason
    if any(kind in FLOAT_TYPES or kind.startswith("array<") for kind in values.values()):
        return "a column is a float or an array (equality deletes compare them otherwise)"
    if "binary" in values.values():
        return BINARY_EQUALITY
    if manifest["details"][CHANGE_FACTS]["unchanged"]:
        return "a row left a TOAST value out"
    return None


@dataclass
class CopyChanges:
    """What a batch does to the copies of each row value it touches (:func:`copy_changes`)."""

    #: (values, occurrence) of every copy to add or to write again with the batch's name
    written: list = field(default_factory=list)
    #: (values, occurrence) of every copy to delete (the marked copy's old row among them)
    deleted: list = field(default_factory=list)


def net_copies(rows, values: list[str]) -> dict[tuple, int]:
    """Per touched row value (a tuple in :func:`python_column` form; NULLs equal), the net change
    of its number of copies: +1 per INSERT and UPDATE's new row, -1 per DELETE and UPDATE's old row
    (the rules of ``multisets.signed_copies``). Every row counts: the facts say none is before the
    table's position and no TRUNCATE is among them."""
    count = rows.num_rows
    ops = rows[OP].to_pylist()
    new = list(zip(*(python_column(rows, staged_name(name)) for name in values))) if values else [()] * count
    old = list(zip(*(python_column(rows, OLD_KEY_PREFIX + name) for name in values))) if values else [()] * count
    net: dict[tuple, int] = {}
    for index, op in enumerate(ops):
        if op not in ("I", "U", "D"):
            raise ValueError(f"change row with operation {op!r} in a batch the pull's facts decide")
        if op == "D":
            net[new[index]] = net.get(new[index], 0) - 1
            continue
        net[new[index]] = net.get(new[index], 0) + 1
        if op == "U":
            net[old[index]] = net.get(old[index], 0) - 1
    return {value: change for value, change in net.items() if change}


def copy_changes(net: dict[tuple, int], copies: dict[tuple, tuple[int, bool]]) -> CopyChanges:
    """The copies to write and delete so that each touched value has max(0, count + change) copies.

    :param copies: per value the lakehouse holds, its number of copies and whether one of them
        was written by this batch (the batch was applied already: the value is left as it is).
    """
    changes = CopyChanges()
    for value, change in net.items():
        count, done = copies.get(value, (0, False))
        if done:
            continue
        target = max(0, count + change)
        if target > count:
            changes.written += [(value, occurrence) for occurrence in range(count + 1, target + 1)]
        elif target < count:
            changes.deleted += [(value, occurrence) for occurrence in range(target + 1, count + 1)]
            if target:  # the highest copy kept carries the batch's name, for a step applied again
                changes.deleted.append((value, target))
                changes.written.append((value, target))
    return changes


def count_copies(rows: list[tuple], touched: list[tuple], batch: str) -> dict[tuple, tuple[int, bool]]:
    """Per touched value, its copies among ``rows`` (each the values, then the batch that wrote
    the row) and whether ``batch`` wrote one of them."""
    touched_set, copies = set(touched), {}
    for row in rows:
        value = row[:-1]
        if value in touched_set:
            count, done = copies.get(value, (0, False))
            copies[value] = (count + 1, done or row[-1] == batch)
    return copies


def _narrowing(values: list[str], types: dict[str, str], touched: list[tuple]) -> dict[str, list]:
    """Per column of a type that compares exactly, the touched values of it (at most
    :data:`MAX_FILTER_VALUES`), a row that may match has there; None among them for NULL."""
    narrowed = {}
    for position, name in enumerate(values):
        if lookup_type(types[name]):
            wanted = list({value[position] for value in touched})
            if len(wanted) <= MAX_FILTER_VALUES:
                narrowed[name] = wanted
    return narrowed


def python_column(rows, name: str) -> list:
    """A staged column as Python values the lakehouse lookup returns alike: timestamps as
    microseconds; NULLs where the file has no such column."""
    if name not in rows.column_names:
        return [None] * rows.num_rows
    return arrow_values(rows[name])


class MultisetRowDeltas(RowDeltas):
    """Applies eligible change batches of keyless tables as Iceberg row deltas (see the module)."""

    def apply(self, table, target: str, files: list[str], manifest: dict, types: dict[str, str],
              batch: str) -> int:
        """Apply batch ``batch``'s change rows of one keyless table (``files``) in one commit;
        returns their number."""
        import pyarrow as pa

        parts = [self._read_parquet(uri) for uri in files]
        if not parts:
            return 0
        rows = pa.concat_tables(parts, promote_options="default")
        values = [name for name in types if name not in MULTISET_COLUMNS]
        net = net_copies(rows, values)
        if net:
            snapshot = table.currentSnapshot()  # the copies are counted at it; the commit validates from it
            read_at = snapshot.snapshotId() if snapshot is not None else None
            changes = copy_changes(net, self._copies(table, target, values, types, list(net), batch, read_at))
            schema = table.schema()
            kinds = {name: rows[staged_name(name)].type for name in values}
            data = self._copies_table(changes.written, values, kinds, schema, batch)
            deletes = self._copies_table(changes.deleted, values, kinds, schema, None)
            self.row_delta(table, data, deletes, [*values, OCCURRENCE], read_at=read_at)
        return rows.num_rows

    def _copies(self, table, target: str, values: list[str], types: dict[str, str], touched: list[tuple],
                batch: str, read_at: int | None) -> dict[tuple, tuple[int, bool]]:
        """Per touched value the lakehouse holds: its copies, and whether ``batch`` wrote one.

        The rows that may match (each column of a type that compares exactly narrowed to the
        touched values) are read at ``read_at`` through Iceberg's reader (``lookups/table_rows.py``),
        and counted by one Spark aggregate instead where nothing narrows them or more than
        :data:`MAX_READ_ROWS` match (each row's values cross py4j one by one); either is matched
        exactly here."""
        narrowed = _narrowing(values, types, touched)
        if narrowed:
            try:
                rows = read_rows(self.spark, table, read_at, [*values, WRITTEN_BY], narrowed, limit=MAX_READ_ROWS)
            except TooManyRows:
                pass
            else:
                return count_copies(rows, touched, batch)
        return self._copies_by_spark(target, values, types, touched, batch, narrowed)

    def _copies_by_spark(self, target: str, values: list[str], types: dict[str, str], touched: list[tuple],
                         batch: str, narrowed: dict[str, list]) -> dict[tuple, tuple[int, bool]]:
        """:meth:`_copies` as one Spark aggregate over the narrowed rows."""
        from pyspark.sql import functions as F

        condition = None
        for name, wanted in narrowed.items():
            present = sorted(value for value in wanted if value is not None)
            narrow = is_in(name, present) if present else F.lit(False)
            if None in wanted:
                narrow = narrow | col(name).isNull()
            condition = narrow if condition is None else condition & narrow
        frame = self.spark.table(self.lakehouse.name(target))
        if condition is not None:
            frame = frame.where(condition)
        found = (frame.groupBy(*[readable(name, types[name]).alias(name) for name in values])
                 .agg(F.count(F.lit(1)).alias("__copies"),
                      F.max((col(WRITTEN_BY) == F.lit(batch)).cast("int")).alias("__done"))
                 .collect())
        touched_set = set(touched)
        copies = {}
        for row in found:
            value = tuple(plain_value(item) for item in row[:len(values)])
            if value in touched_set:
                copies[value] = (row["__copies"], bool(row["__done"]))
        return copies

    def _copies_table(self, copies: list[tuple[tuple, int]], values: list[str], kinds: dict, schema,
                      batch: str | None):
        """(values, occurrence) rows as an Arrow table with Iceberg's field ids; with ``batch``, the
        batch's name in ``_pglogical_batch`` too (a data file), else not (an equality delete file)."""
        import pyarrow as pa

        fields, arrays = [], []
        for position, name in enumerate(values):
            kind = kinds[name]
            column = [value[position] for value, _ in copies]
            array = (pa.array(column, type=pa.int64()).cast(kind) if pa.types.is_timestamp(kind)
                     else pa.array(column, type=kind))
            fields.append(self.arrow_field(schema, name, kind))
            arrays.append(array)
        fields.append(self.arrow_field(schema, OCCURRENCE, pa.int32()))
        arrays.append(pa.array([occurrence for _, occurrence in copies], type=pa.int32()))
        if batch is not None:
            fields.append(self.arrow_field(schema, WRITTEN_BY, pa.string()))
            arrays.append(pa.array([batch] * len(copies), type=pa.string()))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
