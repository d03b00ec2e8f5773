"""What change assembly produces: committed transactions with their row changes per table.

The representation is built for speed (see :class:`TableChanges`): one tuple of raw ``bytes``
values per row, operations and sequence numbers in parallel lists, and the rare extras (old keys,
unchanged-TOAST columns) in dicts keyed by row index. ``list(zip(*rows))`` then gives the Arrow
columns without any per-value Python work in between. LSNs and timestamps are ints, as in
:mod:`.pgoutput_messages`; :class:`~.lsn.Lsn` wraps one for printing.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.decoding.pgoutput import LogicalMessage, Relation, pg_timestamp

__all__ = ["Transaction", "TableChanges", "TruncateChange", "TransactionMessage", "SchemaChange"]

# Most transactions have no truncate, message or schema change, and most rows no old key or
# unchanged TOAST: those containers start as shared empty read-only ones and become a list or dict
# on first use (allocating them for every small transaction cost more than decoding it).
_NONE: tuple = ()
_EMPTY: Mapping = MappingProxyType({})


class TableChanges:
    """The row changes of one table, under one schema, inside one transaction.

    Parallel lists, one entry per row, in the transaction's order:

    * ``ops``: ``'I'``, ``'U'`` or ``'D'``;
    * ``seqs``: position inside the transaction (shared with truncates and messages);
    * ``rows``: a tuple of values in ``relation.columns`` order; ``None`` is NULL. For a DELETE it
      is the old row as sent: with replica identity default/index only the key columns are
      meaningful (others are ``None``), with FULL it is the whole old row.

    Sparse extras keyed by row index (absent for most rows; read-only and empty until used):

    * ``old_keys[i]``: the old values of ``relation.key_columns`` when an UPDATE sent its old key
      (``'K'``: the key changed or a key value was TOASTed) or old row (``'O'``: FULL identity);
    * ``unchanged[i]``: indices of the columns sent as unchanged TOAST; their value in ``rows[i]`` is
      ``None`` and must not be applied (keep the target's current value).
    """

    __slots__ = ("relation", "ops", "seqs", "rows", "old_keys", "unchanged")

    def __init__(self, relation: Relation) -> None:
        self.relation = relation
        self.ops: list[str] = []
        self.seqs: list[int] = []
        self.rows: list[tuple[object, ...]] = []
        self.old_keys: Mapping[int, tuple[object, ...]] = _EMPTY
        self.unchanged: Mapping[int, tuple[int, ...]] = _EMPTY

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"TableChanges({self.relation.qualified_name}, {len(self.rows)} rows)"

    def _set_old_key(self, index: int, values: tuple[object, ...]) -> None:
        if not self.old_keys:
            self.old_keys = {}
        self.old_keys[index] = values  # type: ignore[index]

    def _set_unchanged(self, index: int, columns: tuple[int, ...]) -> None:
        if not self.unchanged:
            self.unchanged = {}
        self.unchanged[index] = columns  # type: ignore[index]

    def columns(self) -> list[tuple[object, ...]]:
        """The values column by column (the transpose of ``rows``), ready for ``pa.array``."""
        if not self.rows:
            return [() for _ in self.relation.columns]
        return list(zip(*self.rows, strict=True))


class TruncateChange(NamedTuple):
    """A TRUNCATE of ``relation_oids`` at position ``seq`` of its transaction."""

    seq: int
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


class TransactionMessage(NamedTuple):
    """A transactional ``pg_logical_emit_message`` at position ``seq`` of its transaction."""

    seq: int
    message: LogicalMessage


@dataclass(frozen=True)
class SchemaChange:
    """A Relation message that changed a known table (columns, key, name or replica identity).

    ``lsn`` is the LSN of the row that carried the new Relation message; changes of the table
    after it use ``new``.
    """

    lsn: int | None
    old: Relation
    new: Relation
    xid: int | None


class Transaction:
    """One committed (or prepared, not yet resolved) transaction.

    ``commit_lsn``/``end_lsn``/``commit_ts`` come from Commit, Stream Commit or Commit Prepared
    (``None`` while a prepared transaction waits). Advance a slot to ``end_lsn``, never past it.
    ``gid``/``prepare_lsn`` are set for two-phase transactions, ``streamed`` for ones reassembled
    from Stream Start/Stop blocks. ``tables`` holds one :class:`TableChanges` per table and schema;
    ``truncates``, ``messages`` and ``schema_changes`` are empty tuples until they have an entry.
    """

    __slots__ = (
        "xid", "commit_lsn", "end_lsn", "commit_ts", "origin", "gid", "prepare_lsn", "prepare_ts",
        "streamed", "tables", "truncates", "messages", "schema_changes", "_by_oid", "_seq",
    )

    def __init__(self, xid: int, *, streamed: bool = False) -> None:
        self.xid = xid
        self.commit_lsn: int | None = None
        self.end_lsn: int | None = None
        self.commit_ts: int | None = None
        self.origin: str | None = None
        self.gid: str | None = None
        self.prepare_lsn: int | None = None
        self.prepare_ts: int | None = None
        self.streamed = streamed
        self.tables: list[TableChanges] = []
        self.truncates: Sequence[TruncateChange] = _NONE
        self.messages: Sequence[TransactionMessage] = _NONE
        self.schema_changes: Sequence[SchemaChange] = _NONE
        self._by_oid: dict[int, TableChanges] | None = {}
        self._seq = 0

    def __repr__(self) -> str:
        lsn = str(Lsn(self.commit_lsn)) if self.commit_lsn is not None else "uncommitted"
        return f"Transaction(xid={self.xid}, commit_lsn={lsn}, changes={self.change_count})"

    @property
    def commit_time(self) -> _dt.datetime | None:
        return None if self.commit_ts is None else pg_timestamp(self.commit_ts)

    @property
    def change_count(self) -> int:
        return self._seq

    def _table(self, relation: Relation) -> TableChanges:
        """The TableChanges that receives ``relation``'s next row (new one after a schema change)."""
        by_oid: dict[int, TableChanges] = self._by_oid  # type: ignore[assignment]
        changes = by_oid.get(relation.oid)
        if changes is None or changes.relation is not relation:
            changes = TableChanges(relation)
            self.tables.append(changes)
            by_oid[relation.oid] = changes
        return changes

    def _add_truncate(self, relation_oids: tuple[int, ...], cascade: bool, restart_identity: bool) -> None:
        self._append("truncates", TruncateChange(self._next_seq(), relation_oids, cascade, restart_identity))

    def _add_message(self, message: LogicalMessage) -> None:
        self._append("messages", TransactionMessage(self._next_seq(), message))

    def _add_schema_change(self, change: SchemaChange) -> None:
        self._append("schema_changes", change)

    def _next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def _append(self, name: str, entry) -> None:
        """Append to one of the lists that stay a shared empty tuple until their first entry."""
        entries = getattr(self, name)
        if entries:
            entries.append(entry)
        else:
            setattr(self, name, [entry])

    def _commit(self, commit_lsn: int, end_lsn: int, commit_ts: int) -> Transaction:
        self.commit_lsn, self.end_lsn, self.commit_ts = commit_lsn, end_lsn, commit_ts
        self._by_oid = None  # assembly state; the rows live in ``tables``
        return self
