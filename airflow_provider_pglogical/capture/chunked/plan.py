"""Which tables a chunked load reads in key chunks, by which key column, and the SQL of one chunk;
which it loads whole instead, and why.

A chunk is the rows of one table whose chunk column lies in a half-open range ``[start, end)``;
the ranges of a table tile the whole key space (the first starts open, the last ends open), so a
row inserted anywhere later belongs to exactly one range. The column is the first column of the
primary key (or of the replica identity index): its index makes each range an index range scan,
and the lakehouse replaces a staged chunk by the same range (``key_range``, as a ranged backfill).

A table without such a column is loaded *whole* (``whole.py``): a keyless table is a multiset,
whose changes carry no key (nor ctid) to attribute them to a chunk, so the chunk's rows could not
win over the window's events; a key PostgreSQL and Spark may order differently could not be
replaced by the range the copy selected. Such a table is copied in one exported snapshot of a
temporary slot instead, exactly, as a backfill is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

from psycopg2 import sql

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.management.published import ResolvedTable


class SnapshotMode(enum.StrEnum):
    """How the initial sync reads the tables (docs/snapshots.md says when to use which)."""

    #: every table inside one exported snapshot of the new slot: one long transaction, one LSN
    EXPORTED = "exported"
    #: key chunks, each in its own short transaction, reconciled with the slot by watermarks; a
    #: table without an orderable key whole, in its own exported snapshot of a temporary slot
    CHUNKED = "chunked"


#: chunk column types whose order PostgreSQL (text in byte order, ``COLLATE "C"``) and Spark share
INTEGER_TYPES = {"int2", "int4", "int8"}
TEXT_TYPES = {"text", "varchar"}


class ChunkedLoadRefused(InvalidInputError):
    """A chunked load that cannot run as asked; nothing was created."""

    permanent = True


@dataclass(frozen=True)
class ChunkedTable:
    """One table of a chunked load: the column its chunks are ranges of, or why it is loaded whole."""

    table: ResolvedTable
    #: the chunk column; None when the table is loaded whole
    column: str | None
    #: compare in byte order (``COLLATE "C"``), as Spark compares strings
    text: bool = False
    #: why the table is loaded whole, in one exported snapshot of a temporary slot (None: in chunks)
    whole: str | None = None

    @property
    def name(self) -> str:
        return self.table.qualified_name


_FIRST_KEY_COLUMN = """
SELECT a.attname, t.typname
  FROM pg_index i
  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
  JOIN pg_type t ON t.oid = a.atttypid
 WHERE i.indrelid = %s AND (CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END)
"""


def whole_reason(table: ResolvedTable, column: tuple[str, str] | None) -> str | None:
    """Why ``table`` cannot be read in key chunks, so is loaded whole (None: it can be chunked);
    ``column``: its first key column and that column's type."""
    if table.keyless or table.replica_identity in ("f", "n") or column is None:
        identity = {"f": "FULL", "n": "NOTHING"}.get(table.replica_identity, "DEFAULT without a primary key")
        return (f"no primary key or replica identity index (REPLICA IDENTITY {identity}): its rows are a "
                "multiset, whose changes carry no key to tell which chunk they belong to")
    attname, typname = column
    if attname not in table.column_names:
        return f"its key column {attname!r} is not published (column list), so it cannot bound a chunk"
    if typname not in INTEGER_TYPES | TEXT_TYPES:
        return (f"its first key column {attname!r} has type {typname}, which PostgreSQL and the lakehouse may "
                "order differently, so a chunk's range could not be replaced exactly")
    return None


def plan_tables(cursor, tables: Sequence[ResolvedTable]) -> list[ChunkedTable]:
    """Each table with its chunk column, or with why it is loaded whole."""
    planned = []
    for table in tables:
        cursor.execute(_FIRST_KEY_COLUMN, (table.oid, table.replica_identity))
        row = cursor.fetchone()
        why = whole_reason(table, (row[0], row[1]) if row else None)
        planned.append(ChunkedTable(table, None, whole=why) if why
                       else ChunkedTable(table, row[0], row[1] in TEXT_TYPES))
    return planned


_FREE = """
SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots),
       current_setting('max_wal_senders')::int
         - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender')
"""


def check_temporary_slot_room(cursor, planned: Sequence[ChunkedTable], creating: bool) -> None:
    """Refuse, before anything is created, a load whose whole tables could not get their temporary
    slot: it needs one replication slot and one WAL sender free beside the pipeline's own slot
    (``creating``: that one is still to be created)."""
    whole = [t.name for t in planned if t.whole]
    if not whole:
        return
    cursor.execute(_FREE)
    slots, senders = cursor.fetchone()
    needed = 2 if creating else 1
    if slots < needed or senders < 1:
        raise ChunkedLoadRefused(
            f"table(s) {', '.join(whole)} are loaded whole, each in the exported snapshot of a temporary "
            f"replication slot, which needs {needed} free replication slot(s) and 1 free WAL sender; the server has "
            f"{max(slots, 0)} slot(s) and {max(senders, 0)} WAL sender(s) free: drop unused slots "
            "(pg_replication_slots) or raise max_replication_slots / max_wal_senders (a restart), then re-run. "
            "Nothing was changed")


def whole_tables_line(planned: Sequence[ChunkedTable]) -> str:
    """The log's line naming the tables loaded whole, and why (empty without any)."""
    whole = [t for t in planned if t.whole]
    if not whole:
        return ""
    return (f"; {len(whole)} table(s) loaded whole, each in the exported snapshot of a temporary slot of its own "
            "(the primary's xmin is held while that one table is copied, not for the whole load): "
            + "; ".join(f"{t.name} ({t.whole})" for t in whole))


def _column(chunked: ChunkedTable) -> sql.Composable:
    column = sql.Identifier(chunked.column)
    return sql.SQL('{} COLLATE "C"').format(column) if chunked.text else column


def range_condition(chunked: ChunkedTable, start: Any, end: Any) -> sql.Composed:
    """``start <= column < end`` (a None bound is open), as the copy's extra filter."""
    parts = [sql.SQL("true")]
    if start is not None:
        parts.append(sql.SQL("{} >= {}").format(_column(chunked), sql.Literal(start)))
    if end is not None:
        parts.append(sql.SQL("{} < {}").format(_column(chunked), sql.Literal(end)))
    return sql.SQL(" AND ").join(parts)


_LEAVES = """
SELECT n.nspname, c.relname FROM pg_partition_tree(%s::oid::regclass) t
  JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE t.isleaf ORDER BY 1, 2
"""


def relations_read(cursor, chunked: ChunkedTable) -> list[tuple[str, str]]:
    """What a chunk reads (``FROM ONLY``): the table, or each leaf of a partitioned table published
    through its root (all in the chunk's one transaction, so the range is read at one moment)."""
    if chunked.table.relkind != "p":
        return [(chunked.table.schema, chunked.table.name)]
    cursor.execute(_LEAVES, (chunked.table.oid,))
    return [tuple(row) for row in cursor.fetchall()]


def _relation(chunked: ChunkedTable) -> sql.Composable:
    """The table to walk for boundaries: ``ONLY`` a plain table, a partitioned one with its leaves."""
    name = sql.Identifier(chunked.table.schema, chunked.table.name)
    return name if chunked.table.relkind == "p" else sql.SQL("ONLY {}").format(name)


def next_boundary(cursor, chunked: ChunkedTable, start: Any, rows: int) -> Any:
    """The end of the chunk that starts at ``start`` and holds about ``rows`` rows: the first column
    value past them (None: the chunk runs to the end of the table). Read in its own statement: any
    boundary is correct (the ranges tile the key space), so it needs no snapshot shared with the copy.

    Counts rows of the whole table, not only those the row filter publishes: an index-only walk."""
    column = _column(chunked)
    after = sql.SQL(" WHERE {} >= {}").format(column, sql.Literal(start)) if start is not None else sql.SQL("")
    cursor.execute(sql.SQL("SELECT {c} FROM {t}{w} ORDER BY {c} OFFSET {n} LIMIT 1").format(
        c=column, t=_relation(chunked), w=after, n=sql.Literal(rows)))
    found = cursor.fetchone()
    if found is None:
        return None
    if start is not None and found[0] == start:  # more than ``rows`` rows share the first key column's value
        cursor.execute(sql.SQL("SELECT min({c}) FROM {t} WHERE {c} > {s}").format(
            c=column, t=_relation(chunked), s=sql.Literal(start)))
        return cursor.fetchone()[0]
    return found[0]


def key_range(chunked: ChunkedTable, start: Any, end: Any) -> dict:
    """The manifest's ``key_range``: the rows of the lakehouse table the chunk replaces."""
    return {"column": chunked.column, "start": start, "end": end}
