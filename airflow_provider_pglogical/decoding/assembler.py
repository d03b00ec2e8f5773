"""Assemble decoded pgoutput messages into committed transactions, in commit order.

Input: the ``(lsn, xid, data)`` rows of ``pg_logical_slot_peek_binary_changes(slot, upto_lsn,
upto_nchanges, 'proto_version', ..., 'publication_names', ..., 'messages', 'true')``. Output:
:class:`Transaction` objects (and non-transactional :class:`LogicalMessage` s, which PostgreSQL
sends at once, outside any transaction), each complete: streamed transactions are reassembled at
Stream Commit with aborted subtransactions removed, prepared transactions are held until COMMIT
PREPARED and dropped at ROLLBACK PREPARED.

The output model (:class:`Transaction`, :class:`TableChanges`, ...) lives in :mod:`.transactions`
and is re-exported here.

Use one :class:`ChangeAssembler` per peek call: every call replays from the slot's position, and
PostgreSQL re-sends Relation messages, restarts streamed transactions and re-sends prepared ones.
LSNs and timestamps are ints, as in :mod:`.pgoutput_messages`.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from airflow_provider_pglogical.lsn import Lsn
# Every message class by name: the assembler dispatches on ``msg.__class__ is …`` in its hot loop.
from airflow_provider_pglogical.decoding.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputDecoder,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from airflow_provider_pglogical.decoding.transactions import (
    SchemaChange,
    TableChanges,
    Transaction,
    TransactionMessage,
    TruncateChange,
)

__all__ = [
    "ChangeAssembler", "ChangeAssemblyError", "Transaction", "TableChanges", "TruncateChange",
    "TransactionMessage", "SchemaChange", "iter_transactions",
]

Row = Sequence[Any]
"""A peek row: ``(lsn, xid, data)``; ``lsn`` as text ``X/Y``, int or Lsn, ``data`` bytes-like."""


class ChangeAssemblyError(RuntimeError):
    """The message stream cannot be assembled without losing or inventing changes."""


def _strip(values: tuple[object, ...]) -> tuple[object, ...]:
    """Replace the UNCHANGED_TOAST placeholder by None; the caller records the indices instead."""
    return tuple(None if v is UNCHANGED_TOAST else v for v in values)


def _lsn_int(value: str | int | Lsn | None) -> int | None:
    return None if value is None else Lsn.parse(value).value


class _Stream:
    """An in-progress streamed transaction: its decoded messages, in order, with the relation each
    data message was sent under (the cache may move on before Stream Commit)."""

    __slots__ = ("xid", "entries", "schema_changes")

    def __init__(self, xid: int) -> None:
        self.xid = xid
        self.entries: list[tuple[Any, Relation | None]] = []
        self.schema_changes: list[SchemaChange] = []


class ChangeAssembler:
    """Turns pgoutput rows into committed transactions; keeps state between :meth:`feed` calls.

    :param proto_version: the ``proto_version`` the slot is read with.
    :param relations: relations already known (e.g. from the last batch's manifest), so a changed
        table is reported as a :class:`SchemaChange` even on its first Relation message.
    :param pause_gc: pause Python's cyclic garbage collector inside :meth:`feed`. The rows and
        tuples it builds contain no cycles, and collecting while building millions of them costs
        up to half of the decode time.
    """

    def __init__(self, proto_version: int = 1, relations: Iterable[Relation] = (), *,
                 pause_gc: bool = True) -> None:
        self.decoder = PgOutputDecoder(proto_version)
        self.relations: dict[int, Relation] = {r.oid: r for r in relations}
        self.types: dict[int, Type] = {}
        self.schema_changes: list[SchemaChange] = []
        self.prepared: dict[str, Transaction] = {}
        """Prepared transactions not yet committed or rolled back, by gid."""
        self.pause_gc = pause_gc
        self._current: Transaction | None = None
        self._streams: dict[int, _Stream] = {}

    @property
    def advance_limit(self) -> int | None:
        """The lowest ``prepare_lsn`` of an unresolved prepared transaction, or None.

        Advancing the slot past a PREPARE means PostgreSQL will not send its changes again, so
        the COMMIT PREPARED would arrive alone: never advance beyond this LSN.
        """
        lsns = [t.prepare_lsn for t in self.prepared.values() if t.prepare_lsn is not None]
        return min(lsns) if lsns else None

    @property
    def open_transaction_xids(self) -> list[int]:
        """Transactions begun or streamed but not finished when the input ended."""
        current = [self._current.xid] if self._current is not None else []
        return current + list(self._streams)

    @property
    def open_stream_xids(self) -> list[int]:
        """Streamed transactions whose commit or abort had not arrived when the input ended."""
        return list(self._streams)

    def feed(self, rows: Iterable[Row]) -> list[Transaction | LogicalMessage]:
        """Consume rows; return the transactions they completed (commit order) and the
        non-transactional messages, interleaved as PostgreSQL sent them."""
        paused = self.pause_gc and gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._feed(rows)
        finally:
            if paused:
                gc.enable()

    def _feed(self, rows: Iterable[Row]) -> list[Transaction | LogicalMessage]:
        out: list[Transaction | LogicalMessage] = []
        decode = self.decoder.decode
        relations = self.relations
        # Hot-path state of the open transaction in locals; written back before control messages.
        txn = self._current
        by_oid = txn._by_oid if txn is not None else None
        for lsn, _xid, data in rows:
            msg = decode(data, lsn)
            cls = msg.__class__
            # Inserts, and updates without an old tuple, outside streams: the bulk of any stream.
            if by_oid is not None and (cls is Insert or (cls is Update and msg[3] is None)) and msg[-1] is None:
                oid = msg[0]
                values = msg[1]
                changes = by_oid.get(oid)
                if changes is None:
                    rel = relations.get(oid)
                    if rel is None:
                        raise self._unknown_relation(oid, lsn)
                    changes = by_oid[oid] = TableChanges(rel)
                    txn.tables.append(changes)  # type: ignore[union-attr]
                if msg[2]:
                    changes._set_unchanged(len(changes.rows), msg[2])
                    values = _strip(values)
                changes.ops.append("I" if cls is Insert else "U")
                changes.seqs.append(txn._seq)  # type: ignore[union-attr]
                txn._seq += 1  # type: ignore[union-attr]
                changes.rows.append(values)
            elif (cls is Update or cls is Delete) and by_oid is not None and msg.xid is None:
                rel = relations.get(msg.relation_oid)
                if rel is None:
                    raise self._unknown_relation(msg.relation_oid, lsn)
                self._add_row(txn, msg, rel)  # type: ignore[arg-type]
            elif cls is Commit and txn is not None and txn.gid is None:
                _flags, commit_lsn, end_lsn, commit_ts = msg
                out.append(txn._commit(commit_lsn, end_lsn, commit_ts))
                self._current = txn = by_oid = None
            elif cls is Begin and txn is None and not self.decoder.in_stream:
                self._current = txn = Transaction(msg.xid)
                by_oid = txn._by_oid
            else:
                self._control(msg, lsn, out)
                txn = self._current
                by_oid = txn._by_oid if txn is not None else None
        return out

    # -- row changes -------------------------------------------------------------------------------
    @staticmethod
    def _add_row(txn: Transaction, msg: Insert | Update | Delete, rel: Relation) -> None:
        """Append one row change (the generic path: updates, deletes, streamed replays)."""
        changes = txn._by_oid.get(rel.oid)  # type: ignore[union-attr]
        if changes is None or changes.relation is not rel:
            changes = txn._table(rel)
        index = len(changes.rows)
        changes.seqs.append(txn._seq)
        txn._seq += 1
        cls = msg.__class__
        if cls is Delete:
            changes.ops.append("D")
            changes.rows.append(_strip(msg.old))
            return
        changes.ops.append("I" if cls is Insert else "U")
        values = msg.new
        if msg.unchanged:
            changes._set_unchanged(index, msg.unchanged)
            values = _strip(values)
        old = msg.old if cls is Update else None
        if old is not None:
            key = tuple(None if old[i] is UNCHANGED_TOAST else old[i] for i in rel.key_indices)
            changes._set_old_key(index, key)
        changes.rows.append(values)

    def _unknown_relation(self, oid: int, lsn: Any) -> ChangeAssemblyError:
        return ChangeAssemblyError(
            f"change for relation oid {oid} at LSN {lsn} before any Relation message for it; feed "
            "every row of the peek call, from its first, to one assembler"
        )

    # -- everything but plain row changes -----------------------------------------------------
    def _control(self, msg: Any, lsn: Any, out: list[Transaction | LogicalMessage]) -> None:
        cls = msg.__class__
        decoder = self.decoder
        if decoder.in_stream and cls is not StreamStart:
            self._in_stream(msg, lsn)
        elif cls is Begin:
            self._begin(Transaction(msg.xid), lsn)
        elif cls is Commit:
            out.append(self._finish(lsn, "Commit")._commit(msg.commit_lsn, msg.end_lsn, msg.commit_ts))
        elif cls is Relation:
            self._relation(msg, lsn, self._current)
        elif cls is Type:
            self.types[msg.oid] = msg
        elif cls is Origin:
            if self._current is not None:
                self._current.origin = msg.name
        elif cls is Truncate:
            self._truncate(self._require(lsn, "Truncate"), msg)
        elif cls is LogicalMessage:
            if msg.transactional:
                self._require(lsn, "transactional Message")._add_message(msg)
            else:
                out.append(msg)
        elif cls is StreamStart:
            if msg.first_segment or msg.xid not in self._streams:
                if not msg.first_segment:
                    raise ChangeAssemblyError(
                        f"Stream Start (not first segment) of xid {msg.xid} at LSN {lsn} without its "
                        "first segment: feed every row of the peek call, from its first"
                    )
                self._streams[msg.xid] = _Stream(msg.xid)
        elif cls is StreamCommit:
            out.append(self._replay(self._pop_stream(msg.xid, lsn))._commit(
                msg.commit_lsn, msg.end_lsn, msg.commit_ts))
        elif cls is StreamAbort:
            self._stream_abort(msg)
        elif cls is BeginPrepare:
            txn = Transaction(msg.xid)
            txn.gid, txn.prepare_lsn, txn.prepare_ts = msg.gid, msg.prepare_lsn, msg.prepare_ts
            self._begin(txn, lsn)
        elif cls is Prepare:
            txn = self._finish(lsn, "Prepare")
            txn.gid, txn.prepare_lsn, txn.prepare_ts = msg.gid, msg.prepare_lsn, msg.prepare_ts
            self.prepared[msg.gid] = txn
        elif cls is StreamPrepare:
            txn = self._replay(self._pop_stream(msg.xid, lsn))
            txn.gid, txn.prepare_lsn, txn.prepare_ts = msg.gid, msg.prepare_lsn, msg.prepare_ts
            self.prepared[msg.gid] = txn
        elif cls is CommitPrepared:
            txn = self.prepared.pop(msg.gid, None)
            if txn is None:
                raise ChangeAssemblyError(
                    f"COMMIT PREPARED '{msg.gid}' (xid {msg.xid}) at LSN {lsn} but its PREPARE was "
                    "not in this peek: the slot was advanced past an unresolved prepared "
                    "transaction and its changes are lost; never advance beyond advance_limit"
                )
            out.append(txn._commit(msg.commit_lsn, msg.end_lsn, msg.commit_ts))
        elif cls is RollbackPrepared:
            self.prepared.pop(msg.gid, None)
        elif cls is Insert or cls is Update or cls is Delete:
            raise ChangeAssemblyError(f"{cls.__name__} at LSN {lsn} outside a transaction")
        elif cls is StreamStop:  # pragma: no cover - the decoder rejects a stray Stream Stop
            pass
        else:  # pragma: no cover - the decoder only returns the classes above
            raise ChangeAssemblyError(f"unexpected {cls.__name__} at LSN {lsn}")

    def _begin(self, txn: Transaction, lsn: Any) -> None:
        if self._current is not None:
            raise ChangeAssemblyError(
                f"transaction xid {txn.xid} begins at LSN {lsn} while xid {self._current.xid} is open"
            )
        self._current = txn

    def _require(self, lsn: Any, what: str) -> Transaction:
        if self._current is None:
            raise ChangeAssemblyError(f"{what} at LSN {lsn} outside a transaction")
        return self._current

    def _finish(self, lsn: Any, what: str) -> Transaction:
        txn = self._require(lsn, what)
        self._current = None
        return txn

    def _relation(self, rel: Relation, lsn: Any, txn: Transaction | None,
                  xid: int | None = None) -> SchemaChange | None:
        known = self.relations.get(rel.oid)
        if known is not None and known == rel:
            return None  # re-sent unchanged: keep the object so TableChanges stay grouped
        self.relations[rel.oid] = rel
        if known is None:
            return None
        change = SchemaChange(_lsn_int(lsn), known, rel, txn.xid if txn is not None else xid)
        self.schema_changes.append(change)
        if txn is not None:
            txn._add_schema_change(change)
            txn._by_oid.pop(rel.oid, None)  # type: ignore[union-attr]  # later rows: new TableChanges
        return change

    @staticmethod
    def _truncate(txn: Transaction, msg: Truncate) -> None:
        txn._add_truncate(msg.relation_oids, msg.cascade, msg.restart_identity)

    # -- streaming ------------------------------------------------------------------------------
    def _in_stream(self, msg: Any, lsn: Any) -> None:
        stream = self._streams[self.decoder.stream_xid]  # type: ignore[index]
        cls = msg.__class__
        if cls is Relation:
            change = self._relation(msg, lsn, None, stream.xid)
            if change is not None:
                stream.schema_changes.append(change)
        elif cls is Type:
            self.types[msg.oid] = msg
        elif cls is Insert or cls is Update or cls is Delete:
            rel = self.relations.get(msg.relation_oid)
            if rel is None:
                raise self._unknown_relation(msg.relation_oid, lsn)
            stream.entries.append((msg, rel))
        elif cls is Truncate or (cls is LogicalMessage and msg.transactional):
            stream.entries.append((msg, None))
        elif cls is not StreamStop:
            raise ChangeAssemblyError(f"unexpected {cls.__name__} inside a streamed block at LSN {lsn}")

    def _pop_stream(self, xid: int, lsn: Any) -> _Stream:
        stream = self._streams.pop(xid, None)
        if stream is None:
            raise ChangeAssemblyError(f"end of streamed transaction xid {xid} at LSN {lsn} without its blocks")
        return stream

    def _stream_abort(self, msg: StreamAbort) -> None:
        if msg.subxid == msg.xid:
            self._streams.pop(msg.xid, None)
            return
        stream = self._streams.get(msg.xid)
        if stream is not None:  # drop what the aborted subtransaction did
            stream.entries = [e for e in stream.entries if e[0].xid != msg.subxid]

    def _replay(self, stream: _Stream) -> Transaction:
        txn = Transaction(stream.xid, streamed=True)
        for change in stream.schema_changes:
            txn._add_schema_change(change)
        for msg, rel in stream.entries:
            if rel is not None:
                self._add_row(txn, msg, rel)
            elif msg.__class__ is Truncate:
                self._truncate(txn, msg)
            else:
                txn._add_message(msg)
        return txn


def iter_transactions(rows: Iterable[Row], proto_version: int = 1, *, chunk_size: int = 10_000,
                      assembler: ChangeAssembler | None = None) -> Iterator[Transaction | LogicalMessage]:
    """Yield committed transactions (and non-transactional messages) from ``rows`` in commit order.

    Feeds ``chunk_size`` rows at a time, so ``rows`` may be a server-side cursor.
    """
    asm = assembler or ChangeAssembler(proto_version)
    iterator = iter(rows)
    while True:
        chunk = list(itertools.islice(iterator, chunk_size))
        if not chunk:
            return
        yield from asm.feed(chunk)
