"""A small change batch of a keyless table (a multiset), applied without a MERGE: one Iceberg
``RowDelta`` the driver commits, as ``row_deltas.py`` does for keyed tables.

The lakehouse numbers the n identical copies of a row value 1..n (``_pglogical_occurrence``),
so (values, occurrence) is a key (``multisets.py``). The driver nets the batch per row value
(+1 per INSERT and UPDATE's new row, -1 per DELETE and UPDATE's old row: :func:`net_copies`),
reads the copies of each touched value, with their data file and position and whether this batch
has written one already, through Iceberg's reader (``lookups/table_rows.py``), and commits:

* a **position delete file** with the copies above the new count (a DELETE removes exactly one
  copy), and the highest copy kept, which is written again with the batch's name (the MERGE's mark);
* a **data file** with the copies added (count+1..count+d) and that marked copy.

Values are compared in Python with NULLs equal, as PostgreSQL's subscriber compares rows here. A
step applied again (a crash before the state commit) finds the batch's name on every value it
left copies of, and skips those: exact, as the MERGE is (:func:`copy_changes`).

It applies where the MERGE's result is this by construction (:func:`multiset_ineligible`): the
batch facts hold (no TRUNCATE, nothing before the table's position), no column is a float (NaN
is not equal to itself in Python, where PostgreSQL counts it equal) or an array, no TOAST value
was left out, the table is numbered, unpartitioned, format 2 or later and merge-on-read, some
column narrows the read to the touched values, and at most :data:`MAX_READ_ROWS` rows match.
Otherwise it is MERGEd (``paths/merge.py``; merge-on-read, so Spark writes position deletes too).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.lookups.table_rows import TooManyRows, arrow_values, read_rows
from airflow_provider_pglogical.spark.row_delta.row_deltas import RowDeltas, batch_ineligible, lookup_type
from airflow_provider_pglogical.staging.contract import (
    MULTISET_COLUMNS,
    OCCURRENCE,
    OLD_KEY_PREFIX,
    OP,
    WRITTEN_BY,
    staged_name,
)
from airflow_provider_pglogical.staging.seam.manifests import TableManifest
from airflow_provider_pglogical.staging.seam.pg_types import SparkType

#: a prefilter column's distinct values above this are not listed in the lookup's filter (each
#: literal is a round trip to the JVM); the rows read are still matched exactly
MAX_FILTER_VALUES = 2_000
#: the most rows the driver reads through Iceberg's reader to count copies; more are MERGEd
MAX_READ_ROWS = 5_000

log = logging.getLogger("pglogical.apply")


def multiset_ineligible(manifest: TableManifest, types: dict[str, str], position: int) -> str | None:
    """Why a keyless table's batch is not applied as a row delta; None when it can be, as far as
    the manifest tells (``paths/choice.py`` checks the table)."""
    values = {name: kind for name, kind in types.items() if name not in MULTISET_COLUMNS}
    reason = batch_ineligible(manifest, values, position)
    if reason is not None:
        return reason
    if any((spark_type := SparkType.parse(kind)).is_float or spark_type.is_array for kind in values.values()):
        return "a column is a float or an array (compared in Python, they would not count as PostgreSQL counts)"
    if manifest.change_facts.unchanged:  # batch_ineligible: the facts are there
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
    (the rules of ``reduction.signed_copies``). Every row counts: the facts say none is before the
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


def copies_of(read: list[tuple], width: int, value: tuple) -> int:
    """How many of the rows read hold ``value`` in their first ``width`` columns."""
    return sum(1 for row in read if row[:width] == value)


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

    def apply(self, table, target: str, files: list[str], manifest: TableManifest, types: dict[str, str],
              batch: str) -> int | None:
        """Apply batch ``batch``'s change rows of one keyless table (``files``) in one commit;
        returns their number, or None (nothing committed) when the copies it touches cannot be
        read through Iceberg's reader (nothing narrows the read, or too many rows match)."""
        import pyarrow as pa

        parts = [self._read_parquet(uri) for uri in files]
        if not parts:
            return 0
        rows = pa.concat_tables(parts, promote_options="default")
        values = [name for name in types if name not in MULTISET_COLUMNS]
        net = net_copies(rows, values)
        if net:
            snapshot = table.currentSnapshot()  # the copies are read at it; the commit validates from it
            read_at = snapshot.snapshotId() if snapshot is not None else None
            read = self._copies(table, target, values, types, list(net), read_at)
            if read is None:
                return None
            width = len(values)  # each row read: values, occurrence, batch, data file, position
            changes = copy_changes(net, count_copies([row[:width] + row[width + 1:width + 2] for row in read],
                                                     list(net), batch))
            where = {(row[:width], row[width]): (row[-2], row[-1]) for row in read}
            missing = [copy for copy in changes.deleted if copy not in where]
            if missing:
                raise ApplyError(
                    f"Iceberg table {self.lakehouse.name(target)} has no copy number {missing[0][1]} of a row value "
                    f"it holds {copies_of(read, width, missing[0][0])} copies of: its copies are not numbered "
                    "1..n as this pipeline numbers them. Fix: re-snapshot the table (PgBackfillOperator)")
            schema = table.schema()
            kinds = {name: rows[staged_name(name)].type for name in values}
            data = self._copies_table(changes.written, values, kinds, schema, batch)
            self.row_delta(table, data, [where[copy] for copy in changes.deleted], read_at=read_at)
        return rows.num_rows

    def _copies(self, table, target: str, values: list[str], types: dict[str, str], touched: list[tuple],
                read_at: int | None) -> list[tuple] | None:
        """The rows that may be copies of the touched values, read at ``read_at`` through Iceberg's
        reader: (values, occurrence, the batch that wrote it, data file, position) each, every column
        of a type that compares exactly narrowed to the touched values (matched exactly by the
        caller). None, with the reason logged, where nothing narrows them or more than
        :data:`MAX_READ_ROWS` match (they all pass through the driver's memory): the step is MERGEd."""
        narrowed = _narrowing(values, types, touched)
        if not narrowed:
            log.info("%s: a MERGE, not a row delta: no column narrows the read of the copies", target)
            return None
        try:
            return read_rows(self.spark, table, read_at, [*values, OCCURRENCE, WRITTEN_BY], narrowed,
                             limit=MAX_READ_ROWS, positions=True)
        except TooManyRows:
            log.info("%s: a MERGE, not a row delta: more than %d rows may be copies of the values the batch "
                     "touches", target, MAX_READ_ROWS)
            return None

    def _copies_table(self, copies: list[tuple[tuple, int]], values: list[str], kinds: dict, schema, batch: str):
        """(values, occurrence) rows as a data file's Arrow table with Iceberg's field ids and the
        batch's name in ``_pglogical_batch``."""
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
        fields.append(self.arrow_field(schema, WRITTEN_BY, pa.string()))
        arrays.append(pa.array([batch] * len(copies), type=pa.string()))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
