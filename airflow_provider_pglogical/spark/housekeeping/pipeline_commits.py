"""The newest snapshot a pipeline committed to a table: expiry keeps it and every snapshot after it.

An apply killed between a step's data commit and its state commit finds that commit again by its
snapshot summary (``state_table.landed_position``), walking back from the table's current snapshot.
Housekeeping may commit on top of it (compaction), and an expiry with a short cut-off would then
remove it, and with it the only record that the step landed: a keyless table's re-run would count
its rows twice. So ``expire_snapshots`` never removes the newest snapshot an apply stamped
(``commit_stamp.py``), nor any after it; the ones before it expire by the usual cut-off.
"""

from __future__ import annotations

import datetime as dt

from airflow_provider_pglogical.staging.contract import SNAPSHOT_PIPELINE


def newest_pipeline_commit(table) -> dt.datetime | None:
    """When the newest snapshot of Iceberg ``table`` (Java) that an apply stamped was committed,
    walking back from the current snapshot; None when no snapshot of its history is stamped."""
    snapshot = table.currentSnapshot()
    while snapshot is not None:
        if snapshot.summary().get(SNAPSHOT_PIPELINE):
            return dt.datetime.fromtimestamp(snapshot.timestampMillis() / 1000, dt.timezone.utc)
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None
    return None
