"""The rows a driver's own row deltas last wrote, for the values a later batch keeps unchanged.

An UPDATE that leaves a TOASTed value unchanged does not send it; a row delta then reads it from
the lakehouse with a Spark query (``RowDeltas._lakehouse_values``), most of a small step's time.
Rows that change once tend to change again, and the driver knows what its last commit wrote:
while that commit's snapshot is still the table's current one, every key it deleted is absent
and every key it wrote holds exactly the values written. Any other commit (a MERGE, maintenance,
another writer) makes a new snapshot, and the table's entry no longer answers.

A spark-submit run keeps the entries from round to round (a long-lived session, as the tests and
benchmarks use, from run to run). They are bounded by :data:`BUDGET_BYTES`, oldest table first.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

#: the most bytes of values kept, over all tables of one Spark session (estimated from the values)
BUDGET_BYTES = 64 << 20
#: a key the snapshot holds no row under
ABSENT = object()
_PER_KEY_BYTES = 64


@dataclass
class _Entry:
    snapshot: int
    columns: tuple[str, ...]
    rows: dict = field(default_factory=dict)  # key -> tuple of values in ``columns`` order, or ABSENT
    sizes: dict = field(default_factory=dict)  # key -> estimated bytes
    size: int = 0


def value_bytes(value) -> int:
    """An estimate of a value's bytes: its length for text and binary, a word otherwise."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, list):
        return sum(value_bytes(item) for item in value)
    return 8


def lookup_values(array) -> list:
    """An Arrow column's values as every lookup of kept values returns them (a Spark query's
    ``readable`` columns alike): timestamps as microseconds, so no time zone touches them."""
    import pyarrow as pa

    return (array.cast(pa.int64()) if pa.types.is_timestamp(array.type) else array).to_pylist()


class KeptValues:
    """Per lakehouse table, the keys its current snapshot holds as the driver's last commit wrote them."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._budget = budget_bytes
        self._size = 0

    def lookup(self, table: str, snapshot: int | None, columns: list[str], keys) -> dict:
        """The ``keys`` this knows at ``snapshot``: key -> the values of ``columns`` (a tuple), or
        :data:`ABSENT`. A key left out is unknown, and must be read from the table."""
        with self._lock:
            entry = self._entries.get(table)
            if entry is None or snapshot is None or entry.snapshot != snapshot \
                    or not set(columns) <= set(entry.columns):
                return {}
            positions = [entry.columns.index(name) for name in columns]
            found = {}
            for key in keys:
                row = entry.rows.get(key)
                if row is not None:
                    found[key] = row if row is ABSENT else tuple(row[p] for p in positions)
            return found

    def columns(self, table: str) -> tuple[str, ...]:
        """The columns kept for ``table`` (none when it has no entry)."""
        with self._lock:
            entry = self._entries.get(table)
            return entry.columns if entry else ()

    def committed(self, table: str, snapshot: int, parent: int | None, columns: tuple[str, ...],
                  written: dict, removed) -> None:
        """Record the driver's commit ``snapshot`` (whose parent is ``parent``): it deleted every key
        of ``removed`` and ``written``, and wrote ``written`` (key -> values of ``columns``). What
        the entry knew carries over only when it described the commit's parent."""
        with self._lock:
            old = self._entries.pop(table, None)
            entry = _Entry(snapshot, columns)
            if old is not None:
                self._size -= old.size
                if old.snapshot == parent and old.columns == columns:
                    entry.rows, entry.sizes, entry.size = old.rows, old.sizes, old.size
            for key in removed:
                self._put(entry, key, ABSENT, _PER_KEY_BYTES)
            for key, values in written.items():
                self._put(entry, key, values, _PER_KEY_BYTES + sum(value_bytes(v) for v in values))
            if entry.size > self._budget:
                return
            self._entries[table] = entry
            self._size += entry.size
            while self._size > self._budget:
                _, evicted = self._entries.popitem(last=False)
                self._size -= evicted.size

    def forget(self, table: str) -> None:
        """Drop what is kept for ``table`` (a commit that failed may or may not have landed)."""
        with self._lock:
            old = self._entries.pop(table, None)
            if old is not None:
                self._size -= old.size

    @staticmethod
    def _put(entry: _Entry, key, row, size: int) -> None:
        entry.size += size - entry.sizes.get(key, 0)
        entry.rows[key] = row
        entry.sizes[key] = size


_SESSIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def kept_values(spark) -> KeptValues:
    """The :class:`KeptValues` of a Spark session (one per session, for as long as it lives)."""
    with _SESSIONS_LOCK:
        kept = _SESSIONS.get(spark)
        if kept is None:
            kept = _SESSIONS[spark] = KeptValues()
        return kept
