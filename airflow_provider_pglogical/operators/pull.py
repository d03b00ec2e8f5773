"""Operator that pulls the slot's next window of decoded changes into a staged batch."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.capture.pull_window import pull_window, unapplied_batches
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.staging.contract import DEFAULT_POLL_INTERVAL
from airflow_provider_pglogical.management.validation import check_count, check_seconds
from airflow_provider_pglogical.operators._capture import CaptureOperator
from airflow_provider_pglogical.operators._errors import fail_permanent_errors
from airflow_provider_pglogical.operators.publication import schedule_interval_seconds
from airflow_provider_pglogical.ui.history import errors_recorded, read_history
from airflow_provider_pglogical.ui.metrics import after_pull


if TYPE_CHECKING:
    from airflow.sdk import Context


class PgSlotPullOperator(CaptureOperator):
    """Stage the slot's pending changes as one change batch, then advance the slot past it.

    PostgreSQL has already applied the publications' row filters (UPDATEs crossing a filter
    arrive as INSERT/DELETE) and column lists. The peek is always bounded (``upto_lsn`` fixed at
    the start of the run, ``upto_nchanges``); transactions are never split. When nothing is
    pending the slot is still advanced to where decoding got, so an idle slot never pins WAL.
    Safe to retry at any point: a batch committed by a run that died before advancing is
    recognised and only the advance is repeated.

    :param slot: the pipeline's logical slot (created by the initial sync).
    :param publications: publications to decode (``publication_names``).
    :param staging_root: root of the staging area (``file://``, ``s3://``, … via ObjectStoragePath);
        ``staging_path``, its old name, still works with a deprecation warning.
    :param pipeline: the pipeline's name (staging sub-directory).
    :param max_changes: decoded messages per batch (``upto_nchanges``); a bigger transaction still comes whole.
    :param max_bytes: stop at a transaction boundary once this many bytes were decoded.
    :param new_tables: a table added to the publications after the initial sync: ``"snapshot"`` it
        before its changes are staged (default), or ``"fail"`` naming the backfill to run.
    :param on_ddl: DDL at the source the lakehouse cannot follow exactly (a re-created table, a column
        added with a default, a type change Iceberg cannot promote, a renamed enum label):
        ``"snapshot"`` the table again, replacing its Iceberg table (default), or ``"fail"`` naming the
        backfill to run. Renamed tables and columns, dropped and added columns are always followed.
    :param append_only: accept publications that do not publish updates and deletes: the lakehouse
        keeps every row ever inserted (docs/reliability.md); otherwise they stop the pull.
    :param orphaned_tables: a table whose rows a ``publish_via_partition_root`` flip moved under
        another table: ``"mark"`` its Iceberg table with the property ``pglogical.orphaned``
        (default) or ``"drop"`` it (the apply does either).
    :param on_slot_lost: the slot was invalidated or dropped: ``"fail"`` (default; no retries help) or
        ``"resync"``: recreate it and re-snapshot every table, replacing the lakehouse tables.
    :param type_overrides: ``{"schema.table.column": "string"}``: stage these columns as
        PostgreSQL's exact text output (a string column in Iceberg), for values the column's
        mapped type cannot hold (``infinity``, ``numeric`` NaN, …); pass the same mapping to the
        initial sync, backfill and pull operators of a pipeline (docs/types.md).
    :param streaming: have PostgreSQL stream transactions larger than ``logical_decoding_work_mem``
        while they run, instead of spilling them to disk on the server; only committed changes are
        staged (docs/postgresql-versions.md).
    :param keep_running: a streaming window (``timedelta`` or seconds; default off: one pull): keep
        pulling within this task, a batch whenever there are changes, one pull every ``poll_interval``,
        until the window ends (docs/streaming.md). Each pull commits its batch and advances the slot
        as a single pull does, so a window killed anywhere loses nothing. (templated)
    :param poll_interval: seconds between the starts of two pulls of a window (default 0.5). (templated)
    :param max_unapplied_batches: in a window, skip a pull while this many committed change batches
        still wait for the apply (as its history shows), so a slow apply gets fewer, larger batches;
        default None: never skip.
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    :return: (XCom) ``{"batch", "start_lsn", "end_lsn", "advanced_to", "tables", "transactions", "changes", "recovered"}``;
        a window adds ``pulls``, ``batches``, ``first_batch`` and ``seconds`` (``batch`` is its last).
    """

    template_fields: Sequence[str] = (
        "slot", "publications", "staging_root", "pipeline", "max_changes", "max_bytes", "new_tables", "on_slot_lost",
        "on_ddl", "type_overrides", "postgres_conn_id", "keep_running", "poll_interval",
    )
    ui_color = "#d8f0ff"

    def __init__(
        self, *, slot: str, max_changes: int = 200_000, max_bytes: int | None = None, new_tables: str = "snapshot",
        on_slot_lost: str = "fail", on_ddl: str = "snapshot", streaming: bool = False,
        keep_running: timedelta | float | str | None = None, poll_interval: float | str = DEFAULT_POLL_INTERVAL,
        max_unapplied_batches: int | None = None, append_only: bool = False, orphaned_tables: str = "mark",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.slot = slot
        self.max_changes = max_changes
        self.max_bytes = max_bytes
        self.new_tables = new_tables
        self.on_slot_lost = on_slot_lost
        self.on_ddl = on_ddl
        self.streaming = streaming
        self.keep_running = keep_running
        self.poll_interval = poll_interval
        self.max_unapplied_batches = max_unapplied_batches
        self.append_only = append_only
        self.orphaned_tables = orphaned_tables

    def execute(self, context: Context) -> dict:
        with fail_permanent_errors():
            window = check_seconds(self.keep_running, "keep_running", optional=True)
            poll_interval = check_seconds(self.poll_interval, "poll_interval")
            hook, root = self.publisher_and_staging()

            def pull() -> dict:
                with errors_recorded(root, self.pipeline, "pull", self.log.warning):
                    return run_pull(
                        hook, slot=self.slot, publications=self.publications, root=root,
                        pipeline=self.pipeline, max_changes=self.max_changes, max_bytes=self.max_bytes,
                        new_tables=self.new_tables, on_slot_lost=self.on_slot_lost, type_overrides=self.type_overrides,
                        on_ddl=self.on_ddl, streaming=self.streaming, append_only=self.append_only,
                        orphaned_tables=self.orphaned_tables, report=self.log.info if window is None else
                        self.log.debug,
                    )

            def pulled(result: dict, seconds: float) -> None:
                # the UI's chart of slot lag and the metrics: the slot as the pull left it (in a window:
                # each pull that staged); the slot idles until the next scheduled run's pull
                if window is None or result.get("batch"):
                    after_pull(root, self.pipeline, hook, self.slot, result, seconds, self.log.warning,
                               until_next_pull=schedule_interval_seconds(context) if window is None else None)

            if window is None:
                started = time.monotonic()
                result = pull()
                pulled(result, time.monotonic() - started)
            else:
                self.log.info("pulling slot %s for %.0f s, every %.1f s", self.slot, window, poll_interval)
                result = pull_window(pull, window, poll_interval, pulled=pulled,
                                     unapplied=lambda: unapplied_batches(layout.committed_batches(root, self.pipeline),
                                                                         applied_end(root, self.pipeline)),
                                     max_unapplied=check_count(self.max_unapplied_batches, "max_unapplied_batches",
                                                               optional=True))
                self.log.info("window ended: %d pulls staged %d batch(es), %d changes; slot at %s", result["pulls"],
                              result["batches"], result["changes"], result["advanced_to"])
            return self.remember_lineage(hook, root, result)


def applied_end(root, pipeline: str) -> Lsn | None:
    """Where the apply's newest round ended (its history's ``end_lsn``); None when no round says."""
    for entry in reversed(read_history(root, pipeline, "apply")):
        if entry.get("end_lsn"):
            return Lsn.parse(entry["end_lsn"])
    return None
