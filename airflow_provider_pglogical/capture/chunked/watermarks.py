"""Low and high watermarks of a chunk, written through the slot, and the wait that makes the low one exact.

Each watermark is a non-transactional logical decoding message (``pg_logical_emit_message``,
prefix :data:`PREFIX`): it lands in the WAL the slot decodes (the pull records it in the change
batch's manifest, as pgoutput sends it with ``messages``), and returns its LSN. The chunk is
staged as a ranged snapshot positioned at the low watermark ``L``; the apply replaces the chunk's
key range with its rows and re-applies every change committed at or after ``L`` (the ranged
backfill's rule). So the changes between the watermarks win over the chunk's rows, as in DBLog and
Debezium's incremental snapshots, and re-applying a change the chunk already saw is harmless for a
keyed table (the last change of a key wins).

That is exact only if the chunk's read sees every transaction committed before ``L``. A commit
record can be in the WAL before ``L`` while its transaction still counts as running for new
snapshots (it waits for the WAL flush or a synchronous standby before it leaves the proc array):
a read taken then would miss it, and nothing after ``L`` would repair the chunk. So after writing
``L`` the loader waits until every transaction that held a lock on the table at that moment has
ended (:func:`wait_for_writers`; a transaction leaves the proc array before it releases its
locks), and only then takes the chunk's snapshot. Writers that start later commit after ``L``.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.lsn import Lsn

#: the logical decoding message prefix of the chunked load's watermarks
PREFIX = "pglogical.chunked_load"


class WriterWaitTimeout(PgLogicalError):
    """A transaction writing the table stayed open longer than the load waits before a chunk."""


def emit(cursor, kind: str, **content) -> Lsn:
    """Write a ``low`` or ``high`` watermark; returns its LSN (the end of its WAL record)."""
    cursor.execute("SELECT pg_logical_emit_message(false, %s, %s)::text",
                   (PREFIX, json.dumps({"watermark": kind, **content}, sort_keys=True, default=str)))
    return Lsn.parse(cursor.fetchone()[0])


_WRITERS = """
SELECT DISTINCT l.virtualtransaction, coalesce(l.pid, 0)
  FROM pg_locks l
 WHERE l.locktype = 'relation' AND l.granted
   AND l.relation IN (SELECT relid FROM pg_partition_tree(%s::oid::regclass))
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.pid IS DISTINCT FROM pg_backend_pid()
   AND l.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
"""
_STILL_RUNNING = """
SELECT DISTINCT l.virtualtransaction, coalesce(l.pid, 0) FROM pg_locks l
 WHERE l.locktype = 'relation' AND l.relation IN (SELECT relid FROM pg_partition_tree(%s::oid::regclass))
   AND l.virtualtransaction = ANY(%s)
"""


def wait_for_writers(cursor, table_oid: int, table: str, timeout: float,
                     clock: Callable[[], float] = time.monotonic) -> int:
    """Wait until the transactions that hold a write lock on the table (or on any partition of it)
    now have ended; returns
    how many there were. Polls in autocommit (no snapshot is held while waiting).

    :raises WriterWaitTimeout: one is still open after ``timeout`` seconds, named with its pid.
    """
    cursor.execute(_WRITERS, (table_oid,))
    waiting = {vxid: pid for vxid, pid in cursor.fetchall()}
    if not waiting:
        return 0
    deadline, pause = clock() + timeout, 0.001
    while True:
        cursor.execute(_STILL_RUNNING, (table_oid, sorted(waiting)))
        still = {vxid: pid for vxid, pid in cursor.fetchall()}
        if not still:
            return len(waiting)
        if clock() >= deadline:
            raise WriterWaitTimeout(
                f"table {table}: transaction(s) {_named(still)} "
                f"writing it stayed open more than {timeout:g}s. The chunked load waits, before each chunk, for "
                "the transactions writing the table when the chunk's low watermark was written (so the chunk "
                "sees every change committed before it). Commit or end them, or raise writer_wait_seconds, "
                "then re-run: the load resumes at this chunk. Nothing of this chunk was staged", permanent=False,
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _named(transactions: dict[str, int]) -> str:
    return ", ".join(f"{vxid} (pid {pid})" if pid else f"{vxid} (a prepared transaction)"
                     for vxid, pid in sorted(transactions.items()))
