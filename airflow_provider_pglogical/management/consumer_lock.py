"""One consumer per slot: a session advisory lock on the publisher, held from peek to advance.

Two pulls of one slot at once (a manual ``airflow tasks test`` beside the schedule, a second
DAG) would peek the same window, stage it twice and race each other's advance, which can move
the slot past changes that sit in no committed batch. Pull and initial sync therefore take a
session-level advisory lock keyed on the slot's name in the slot's database. It lives in a
connection of its own, so it is released when the task ends, also when it is killed. A second
run waits up to ``wait_seconds`` for the first to finish and then fails, naming the holder.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Mapping

import psycopg2
import psycopg2.errors

from airflow_provider_pglogical.exceptions import ConcurrentRunError

log = logging.getLogger(__name__)

#: first half of the advisory lock key: "pglo" as an int4, so our locks stand apart from others'
LOCK_NAMESPACE = 0x70676C6F

_HOLDERS = """
SELECT a.pid, coalesce(a.application_name, ''), a.backend_start::text, coalesce(a.client_addr::text, 'local')
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s::oid
   AND l.objid = hashtext(%s)::oid AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@contextlib.contextmanager
def slot_consumer_lock(connect_kwargs: Mapping[str, Any], slot: str, what: str,
                       wait_seconds: float = 60.0) -> Iterator[None]:
    """Hold the slot's consumer lock for the block.

    :param what: the run taking it ("pull", "initial sync"), for the log and the error.
    :param wait_seconds: how long to wait for another run to finish before failing.
    """
    conn = psycopg2.connect(**connect_kwargs, application_name=f"pglogical {what} of slot {slot}")
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(wait_seconds * 1000)}ms",))
            try:
                cursor.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LOCK_NAMESPACE, slot))
            except psycopg2.errors.LockNotAvailable:
                cursor.execute(_HOLDERS, (LOCK_NAMESPACE, slot))
                holders = "; ".join(f"pid {pid} ({app or 'no application_name'}, from {addr}, since {start})"
                                    for pid, app, start, addr in cursor.fetchall()) or "a session that has just ended"
                raise ConcurrentRunError(
                    f"slot {slot!r} is being consumed by another run of this pipeline, which holds its lock: "
                    f"{holders}. This {what} waited {wait_seconds:g}s and changed nothing. Let that run finish "
                    "(pulls of one slot must not overlap: run one DAG per slot, and keep max_active_runs=1), "
                    "then retry"
                ) from None
            log.info("holding the consumer lock of slot %s for this %s", slot, what)
            yield
    finally:
        conn.close()
