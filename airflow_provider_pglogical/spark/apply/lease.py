"""One apply per pipeline: the lease the apply job takes on its state table (a table property, by
compare-and-swap), renews while it runs and releases at its end; a killed holder on the same
machine is seen gone at once, one elsewhere when the lease expires. The next streaming window,
started before the previous one ends, waits for it to hand the lease over (:meth:`ApplyLease.acquire`)."""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable

from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.common.java_classes import java_class
from airflow_provider_pglogical.spark.row_delta.driver_commits import java_exception_class
from airflow_provider_pglogical.staging.contract import APPLY_LEASE_PROPERTY_PREFIX

log = logging.getLogger("pglogical.apply")

#: how long past the promised end of the window holding the lease (its ``window_until``) the next
#: window waits for the handover; a window still holding it then is treated as any other holder
HANDOVER_MARGIN_SECONDS = 60.0
#: seconds between two reads of the lease while a window waits for the handover
HANDOVER_POLL_SECONDS = 0.25
#: the table operations whose ``commit(base, new)`` itself refuses a ``base`` that is no longer the
#: table's current metadata (a compare-and-swap of the metadata location). Any other, a REST
#: catalog's above all (the server checks only the requirements the update carries, and a change of
#: properties alone carries none), gets a fence in each lease commit: see :meth:`ApplyLease._fence`
COMPARE_AND_SWAP_OPERATIONS = frozenset({
    "org.apache.iceberg.hadoop.HadoopTableOperations",
    "org.apache.iceberg.jdbc.JdbcTableOperations",
    "org.apache.iceberg.aws.glue.GlueTableOperations",
    "org.apache.iceberg.hive.HiveTableOperations",
})
#: the snapshot summary property naming what a fence commit did to the lease
FENCE_SUMMARY_PROPERTY = "pglogical.apply-lease"


class ApplyLeaseHeld(ApplyError):
    """Another apply of the pipeline holds its lease: nothing was applied; retry later."""

    permanent = False

    def __init__(self, message: str, lease: dict) -> None:
        super().__init__(message)
        self.lease = lease


class ApplyLease:
    """One apply per pipeline and lakehouse: a lease kept as a property of the state table.

    Taken by a compare-and-swap of the table's metadata (``TableOperations.commit(base, new)``
    refuses a stale ``base`` and never retries; on a catalog whose commit does not compare the
    base, a REST catalog's, the commit carries a fence the server checks: :meth:`_fence`), renewed
    by a thread every third of its length, removed at the end. A killed apply cannot remove it: when
    its driver ran on the same machine (and pid namespace) as the next apply's, the next one sees
    that process gone and takes the lease over at once (an Airflow retry of a killed task); a driver
    elsewhere blocks it until it expires. Works on every Iceberg catalog, as atomically as the
    catalog commits (a Hadoop catalog on a file system without an atomic rename-if-absent leaves a
    window of milliseconds, which the read back after the swap narrows further).

    :param holder: who takes it, for the message another apply shows (an Airflow task instance).
    :param window_seconds: a keep-running window's length (not an initial load's, which may end
        early): the lease then says ``window_until``, the earliest its window ends. Every batch
        committed before then, the window applies (its last listing comes after it), which lets an
        apply that meets the lease end as skipped instead of failing (``operators/iceberg_apply.py``).
        Such a window, meeting another window's lease, waits for it to be handed over: until the
        holder releases it, or at most :data:`HANDOVER_MARGIN_SECONDS` past its ``window_until``
        (:func:`handover_deadline`); ``waited`` then says how long, which counts as part of its window.
    :param while_waiting: run once, in a thread of its own, when a window starts waiting for the
        handover (the job's JVM warm-up, ``warm_up.py``).
    """

    def __init__(self, spark, lakehouse, pipeline: str, seconds: float, holder: str | None = None,
                 window_seconds: float | None = None, while_waiting: Callable[[], object] | None = None) -> None:
        self.spark, self.lakehouse, self.pipeline, self.seconds = spark, lakehouse, pipeline, float(seconds)
        self.window_seconds, self.while_waiting = window_seconds, while_waiting
        self.waited = 0.0  # seconds this window waited for the previous one to hand the lease over
        self.key = APPLY_LEASE_PROPERTY_PREFIX + pipeline
        self.id = uuid.uuid4().hex
        self.holder = holder or f"an apply on {socket.gethostname()}, pid {os.getpid()}"
        self.expires_at = 0.0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._table = None
        self._ops = None
        self._fenced = False

    def __enter__(self) -> "ApplyLease":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lease, or raise :class:`ApplyLeaseHeld` when another apply holds a live one."""
        self._table = self.lakehouse.state.state_table()
        self._ops = self._table.operations()
        self._fenced = self._ops.getClass().getName() not in COMPARE_AND_SWAP_OPERATIONS
        started = time.monotonic()
        while True:
            try:
                self._swap(self._take, "take")
                # read back: a catalog that raced must show it. A fenced take needs no second read:
                # the server refused it unless main was unchanged since the lease was read, and the
                # commit's answer is the table as it left it (a REST catalog's refresh is a GET of it all)
                found = self._lease(self._ops.current() if self._fenced else self._ops.refresh())
                if found is None or found.get("id") != self.id:
                    raise self._held(found or {})
                break
            except ApplyLeaseHeld as held:
                if not self._wait_for_handover(held, started):
                    raise
        if self.waited:
            log.info("pipeline %r: the previous window handed the lease over after %.2fs", self.pipeline, self.waited)
        self._renewer = threading.Thread(target=self._renew, name=f"pglogical-lease-{self.pipeline}", daemon=True)
        self._renewer.start()
        log.info("apply lease of %s taken until %s", self.pipeline, _utc(self.expires_at))

    def _wait_for_handover(self, held: ApplyLeaseHeld, started: float) -> bool:
        """Wait a beat for another window's lease to be released; False when this apply is no window,
        the holder is no window, or its window ran past :func:`handover_deadline`."""
        deadline = handover_deadline(held.lease, time.time()) if self.window_seconds else None
        if deadline is None:
            return False
        if not self.waited:
            log.info("pipeline %r: waiting for the apply window of %s to hand its lease over (at most until %s)",
                     self.pipeline, held.lease.get("holder"), _utc(deadline))
            if self.while_waiting is not None:
                threading.Thread(target=self.while_waiting, name="pglogical-handover-wait", daemon=True).start()
        self._stop.wait(min(HANDOVER_POLL_SECONDS, max(0.0, deadline - time.time())))
        self.waited = round(time.monotonic() - started, 3)
        return True

    def promise(self, seconds: float) -> None:
        """Say in the lease that this window ends ``seconds`` from now at the earliest (its deadline,
        known after its first round): what the next window waits for and a single apply trusts."""
        until = time.time() + seconds
        self._swap(lambda lease: {**lease, "window_until": until}
                   if lease is not None and lease.get("id") == self.id else None, "promise")

    def check(self) -> None:
        """Raise :class:`ApplyError` when this apply no longer holds a live lease: called before each
        round and state commit, so an apply that stalled past its lease writes nothing more."""
        if time.time() >= self.expires_at:
            raise ApplyError(
                f"pipeline {self.pipeline!r}: this apply's lease expired at {_utc(self.expires_at)} (the driver "
                "stalled, or could not renew it), so another apply may run now; stopped before writing more. "
                "Every step committed so far is exact and recorded or re-applied by the next apply.", permanent=False)

    def release(self) -> None:
        """Stop renewing and remove the lease (if still ours); a failure only leaves it to expire."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        try:
            self._swap(lambda lease: self.key if lease is not None and lease.get("id") == self.id else None,
                       "release")
        except Exception as error:  # the lease expires by itself
            log.warning("could not release the apply lease of %s (it expires at %s): %s", self.pipeline,
                        _utc(self.expires_at), error)

    # the swap --------------------------------------------------------------------------------------
    def _take(self, lease: dict | None) -> dict | str | None:
        if lease is not None and lease.get("id") != self.id and lease.get("expires_at", 0) > time.time():
            if not holder_is_gone(lease.get("process")):
                raise self._held(lease)
            log.warning("pipeline %r: the apply holding the lease (%s) is no longer running on this machine: "
                        "taking its lease over", self.pipeline, lease.get("holder"))
        now = time.time()
        taken = {"id": self.id, "holder": self.holder, "taken_at": now, "expires_at": now + self.seconds,
                 "process": this_process()}
        if self.window_seconds:  # the window ends a full window (less the handover) after its first round
            taken["window_until"] = now + max(0.0, self.window_seconds - self.waited)
        return taken

    def _swap(self, change, what: str, attempts: int = 20) -> None:
        """Compare-and-swap the lease property: ``change`` maps the lease read (None when absent) to
        a new lease (dict), a property to remove (str) or None (nothing to do); a lost race is read again."""
        metadata = java_class(self.spark, "org.apache.iceberg.TableMetadata")
        for _ in range(attempts):
            fence = self._fence(what) if self._fenced else None
            base = self._ops.current() if fence is not None else self._ops.refresh()
            try:
                wanted = change(self._lease(base))
            except BaseException:
                self._discard(fence)
                raise
            if wanted is None:
                self._discard(fence)
                return
            builder = metadata.buildFrom(base)
            if isinstance(wanted, str):
                builder.removeProperties({wanted})
            else:
                builder.setProperties({self.key: json.dumps(wanted, sort_keys=True)})
            if fence is not None:
                builder.setBranchSnapshot(fence, "main")
            try:
                self._ops.commit(base, builder.build())
            except Exception as error:
                if java_exception_class(error) == "org.apache.iceberg.exceptions.CommitFailedException":
                    self._discard(fence)  # refused, so never part of the table
                    continue  # another commit of the state table came first: read it again
                raise
            if isinstance(wanted, dict):
                self.expires_at = wanted["expires_at"]
            return
        raise ApplyError(f"pipeline {self.pipeline!r}: could not {what} the apply lease: the state table "
                         f"{self.lakehouse.name('_pglogical_state')} changed under each of {attempts} attempts",
                         permanent=False)

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            def renew(lease: dict | None) -> dict | None:
                if lease is None or lease.get("id") != self.id:
                    self._stop.set()  # taken over: check() stops the run at its next round
                    self.expires_at = min(self.expires_at, time.time())
                    return None
                return {**lease, "expires_at": time.time() + self.seconds}
            try:
                self._swap(renew, "renew")
            except Exception as error:  # try again at the next beat; check() tells when it is too late
                log.warning("could not renew the apply lease of %s: %s", self.pipeline, error)

    def _fence(self, what: str):
        """An empty snapshot of the state table's main branch, not committed yet (its manifest list
        is written), on the table's current metadata (``ops.current()`` after this).

        Committed with the lease's change, it makes the commit carry Iceberg's requirement that main
        is still at the snapshot the lease was read at (``AssertRefSnapshotID``): a REST server
        refuses the commit when any other commit of the table, another apply's lease above all, came
        in between. Without it two applies taking the lease at the same instant both succeeded, the
        later silently replacing the earlier's lease. The empty snapshots (one per lease change on
        such catalogs) change no rows; housekeeping expires them as any other."""
        return self._table.newFastAppend().set(FENCE_SUMMARY_PROPERTY, what).apply()

    def _discard(self, fence) -> None:
        """Delete an uncommitted fence's manifest list (a commit that failed otherwise may have landed: kept)."""
        if fence is not None:
            self._table.io().deleteFile(fence.manifestListLocation())

    def _lease(self, metadata) -> dict | None:
        value = metadata.properties().get(self.key)
        return json.loads(value) if value else None

    def _held(self, lease: dict) -> ApplyLeaseHeld:
        expires = lease.get("expires_at", 0)
        return ApplyLeaseHeld(
            f"pipeline {self.pipeline!r}: another apply is running ({lease.get('holder', 'unknown holder')}, "
            f"since {_utc(lease.get('taken_at', 0))}); its lease on {self.lakehouse.name('_pglogical_state')} "
            f"lasts until {_utc(expires)} unless renewed. Nothing was applied. Run one apply per pipeline "
            "(max_active_tis_per_dag=1 on the apply task, or max_active_runs=1 on the DAG) and let Airflow "
            "retry: a killed apply's lease expires by itself.", lease)


def handover_deadline(lease: dict | None, now: float) -> float | None:
    """Until when (epoch seconds) a window may wait for ``lease`` to be released: its holder's
    promised end plus :data:`HANDOVER_MARGIN_SECONDS`; None when the holder is no keep-running
    window (a single apply, an initial load's window) or that time has passed."""
    until = (lease or {}).get("window_until")
    if not isinstance(until, (int, float)) or isinstance(until, bool):
        return None
    deadline = until + HANDOVER_MARGIN_SECONDS
    return deadline if deadline > now else None


def this_process() -> dict | None:
    """What tells this driver process apart on its machine: the boot, the pid namespace, the pid and
    its start time (a reused pid starts later); None where /proc does not say (not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        return {"boot": boot_id, "pid_namespace": os.readlink("/proc/self/ns/pid"), "pid": os.getpid(),
                "start": _start_time(os.getpid())}
    except OSError:
        return None


def holder_is_gone(process: dict | None) -> bool:
    """True only when the lease's holder ran in this machine's boot and pid namespace and that
    process has ended (a killed task's driver): its lease need not be waited out. A holder elsewhere
    (a driver on another host or container) is never judged: its lease expires by itself."""
    here = this_process()
    if not process or here is None or (process.get("boot"), process.get("pid_namespace")) != \
            (here["boot"], here["pid_namespace"]):
        return False
    try:
        state, start = _state_and_start(int(process["pid"]))
    except OSError:  # no such process
        return True
    # a zombie has ended: only its parent has yet to reap it (a killed driver whose JVM died with it
    # waits for init, which in a container may never come)
    return state in ("Z", "X") or start != process.get("start")


def _state_and_start(pid: int) -> tuple[str, int]:
    """The process's state letter and start time in clock ticks since boot (fields 3 and 22 of
    /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot."""
    return _state_and_start(pid)[1]


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
