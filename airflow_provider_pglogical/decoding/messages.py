"""The pgoutput logical replication messages, as the decoder returns them.

Field names follow PostgreSQL's "Logical Replication Message Formats" documentation. Conventions:

* LSNs are ``int`` (a 64-bit WAL position); wrap one in :class:`~.lsn.Lsn` to print or compare it
  with LSNs from elsewhere. Ints keep the per-message cost low.
* Timestamps are ``int`` microseconds since 2000-01-01 00:00 UTC, as PostgreSQL sends them;
  :func:`pg_timestamp` turns one into an aware ``datetime``.
* ``xid`` on a data message is only set inside a streamed block (protocol >= 2), where it is the
  xid of the (sub)transaction the change belongs to; otherwise it is ``None``.

Messages are ``NamedTuple`` s: the decoder builds them straight from ``struct.unpack``'s tuple,
which is several times cheaper than a dataclass (data messages are the bulk of a stream, and
Begin/Commit come with every transaction). :class:`Relation` is a frozen dataclass, for the key
indices it derives once. Compare messages of the same class only: a NamedTuple equals any tuple
with the same values.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import NamedTuple

from airflow_provider_pglogical.staging.contract import table_key

PG_EPOCH = _dt.datetime(2000, 1, 1, tzinfo=_dt.UTC)


def pg_timestamp(micros: int) -> _dt.datetime:
    """A PostgreSQL ``TimestampTz`` (microseconds since 2000-01-01 UTC) as an aware datetime."""
    return PG_EPOCH + _dt.timedelta(microseconds=micros)


# -- transaction control ------------------------------------------------------------------------
class Begin(NamedTuple):
    """``'B'``: a transaction's changes follow; ``final_lsn`` is the LSN of its commit record."""

    final_lsn: int
    commit_ts: int
    xid: int


class Commit(NamedTuple):
    """``'C'``: end of the transaction; ``end_lsn`` is where a consumer may advance to."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


class Origin(NamedTuple):
    """``'O'``: the transaction was replicated here from ``name`` (``origin_lsn`` on that node)."""

    origin_lsn: int
    name: str


# -- schema -----------------------------------------------------------------------------------------
class Column(NamedTuple):
    """One column of a :class:`Relation`; ``flags`` bit 1 marks a replica-identity (key) column."""

    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    """``'R'``: the published columns of a table, sent before its first change in a session.

    ``replica_identity`` is ``pg_class.relreplident``: ``'d'`` default (primary key), ``'n'``
    nothing, ``'f'`` full (every column is flagged key), ``'i'`` index.
    """

    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: tuple[Column, ...]
    xid: int | None = field(default=None, compare=False)
    key_indices: tuple[int, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_indices", tuple(i for i, c in enumerate(self.columns) if c.flags & 1))

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Names of the replica-identity columns, in column order (the old-key layout)."""
        return tuple(self.columns[i].name for i in self.key_indices)

    @property
    def qualified_name(self) -> str:
        return table_key(self.namespace, self.name)


class Type(NamedTuple):
    """``'Y'``: a non-built-in data type used by a published column (e.g. an enum)."""

    oid: int
    namespace: str
    name: str
    xid: int | None = None


# -- data ---------------------------------------------------------------------------------------------
class Insert(NamedTuple):
    """``'I'``: a new row. ``unchanged`` lists the columns sent as ``'u'`` (value UNCHANGED_TOAST)."""

    relation_oid: int
    new: tuple[object, ...]
    unchanged: tuple[int, ...] = ()
    xid: int | None = None


class Update(NamedTuple):
    """``'U'``: ``old`` is set when PostgreSQL sent the old key (``old_kind == 'K'``, only key
    columns meaningful, others ``None``) or the whole old row (``'O'``, REPLICA IDENTITY FULL)."""

    relation_oid: int
    new: tuple[object, ...]
    unchanged: tuple[int, ...] = ()
    old: tuple[object, ...] | None = None
    old_kind: str | None = None
    xid: int | None = None


class Delete(NamedTuple):
    """``'D'``: the deleted row's key (``old_kind == 'K'``) or whole old row (``'O'``)."""

    relation_oid: int
    old: tuple[object, ...]
    old_kind: str
    xid: int | None = None


TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2


class Truncate(NamedTuple):
    """``'T'``: one TRUNCATE statement over ``relation_oids`` (option bits 1 and 2)."""

    relation_oids: tuple[int, ...]
    options: int
    xid: int | None = None

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


class LogicalMessage(NamedTuple):
    """``'M'``: ``pg_logical_emit_message(transactional, prefix, content)``; ``lsn`` is its WAL
    position. Non-transactional ones arrive at once, outside any transaction."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


# -- streaming (protocol >= 2) -----------------------------------------------------------------------
class StreamStart(NamedTuple):
    """``'S'``: a block of an in-progress transaction ``xid`` follows (until Stream Stop)."""

    xid: int
    first_segment: bool


class StreamStop(NamedTuple):
    """``'E'``: end of a streamed block (no fields)."""


class StreamCommit(NamedTuple):
    """``'c'``: the streamed transaction ``xid`` committed."""

    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


class StreamAbort(NamedTuple):
    """``'A'``: (sub)transaction ``subxid`` of streamed ``xid`` aborted (``subxid == xid``: all of
    it). ``abort_lsn``/``abort_ts`` are only sent with protocol 4 and ``streaming = parallel``."""

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_ts: int | None = None


# -- two-phase commit (protocol >= 3, or any protocol on a two_phase slot) ---------------------
class BeginPrepare(NamedTuple):
    """``'b'``: a transaction that will be prepared; ``prepare_lsn`` is its PREPARE record."""

    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


class Prepare(NamedTuple):
    """``'P'``: the transaction ``gid`` is prepared; its changes wait for COMMIT/ROLLBACK PREPARED."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


class StreamPrepare(NamedTuple):
    """``'p'``: the streamed transaction ``xid`` is prepared as ``gid``.

    The fields are Prepare's because the protocol gives both one layout; a class of its own keeps
    the two apart where the assembler dispatches on the class."""

    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_ts: int
    xid: int
    gid: str


class CommitPrepared(NamedTuple):
    """``'K'``: COMMIT PREPARED ``gid``; ``end_lsn`` is where a consumer may advance to."""

    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int
    xid: int
    gid: str


class RollbackPrepared(NamedTuple):
    """``'r'``: ROLLBACK PREPARED ``gid``: its prepared changes are void."""

    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_ts: int
    rollback_ts: int
    xid: int
    gid: str


Message = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | LogicalMessage
    | StreamStart | StreamStop | StreamCommit | StreamAbort | BeginPrepare | Prepare | StreamPrepare
    | CommitPrepared | RollbackPrepared
)
