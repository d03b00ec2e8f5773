"""An event-driven apply: an asset whose watcher fires when a committed batch lands in staging.

``staged_batches_asset(staging_root, pipeline)`` is an Airflow 3 ``Asset`` with an ``AssetWatcher``
running :class:`StagedBatchTrigger` in the triggerer. A DAG scheduled on it runs when a pull
commits a batch (its ``_manifest.json`` written), so the apply follows the pulls instead of a clock
(docs/operators.md, "An apply the staged batches trigger").

Cheap while idle: no JVM and no busy loop, one listing of ``<staging_root>/<pipeline>/`` per
``poll_interval`` in a worker thread (the triggerer's loop never blocks), and a manifest looked at
only for a batch name newer than the newest one already announced (names sort in LSN order).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

try:
    from airflow.providers.common.compat.triggers import BaseEventTrigger
except ImportError:  # common-compat before its triggers module
    from airflow.triggers.base import BaseEventTrigger
from airflow.triggers.base import TriggerEvent

from airflow_provider_pglogical.staging.contract import MANIFEST

#: seconds between two listings of the staging area by default: a batch is applied at most this
#: much later than a scheduled apply would have started, and an idle pipeline costs a listing per poll
DEFAULT_WATCH_INTERVAL = 30.0


def _root(staging_root: str):
    from airflow_provider_pglogical.lakehouse.staging_roots import staging_path

    return staging_path(staging_root)


def pending_names(staging_root: str, pipeline: str) -> list[str]:
    """The committed batches no apply has seen yet (the apply marker), in LSN order: what the
    pipeline view counts as pending (``ui.figures.pending_work``)."""
    from airflow_provider_pglogical.staging.apply_marker import read_marker
    from airflow_provider_pglogical.staging.layout import committed_batches

    root = _root(staging_root)
    marker = read_marker(root, pipeline)
    seen = set(marker.get("seen", ())) if marker else set()
    return [name for name, *_ in committed_batches(root, pipeline) if name not in seen]


def batches_after(staging_root: str, pipeline: str, after: str | None) -> list[str]:
    """Committed batches whose names sort after ``after``: one listing, and a manifest check only for
    those names (a batch without its manifest does not exist yet)."""
    from airflow_provider_pglogical.staging.layout import forget_cached_listing, parse_batch_name

    directory = _root(staging_root) / pipeline
    forget_cached_listing(directory)
    if not directory.exists():
        return []
    names = sorted(child.name for child in directory.iterdir()
                   if parse_batch_name(child.name) and (after is None or child.name > after))
    return [name for name in names if (directory / name / MANIFEST).exists()]


class StagedBatchTrigger(BaseEventTrigger):
    """Fires each time committed batches land in a pipeline's staging area (for an ``AssetWatcher``).

    At start it fires once if committed batches wait that no apply has seen (the apply marker), so
    batches staged while the triggerer was down are applied too; then once per listing that finds
    batches newer than the newest it announced. The event's payload names the pipeline, the batches
    and the newest one's end LSN.

    :param staging_root: the staging root URI the pull writes to.
    :param pipeline: the pipeline's name.
    :param poll_interval: seconds between two listings (default 30).
    """

    def __init__(self, staging_root: str, pipeline: str, poll_interval: float = DEFAULT_WATCH_INTERVAL) -> None:
        super().__init__()
        # The trigger's arguments, kept as given: serialize() hands them back to the triggerer as they came.
        self.staging_root = staging_root
        self.pipeline = pipeline
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_provider_pglogical.triggers.staged_batches.StagedBatchTrigger",
            {"staging_root": self.staging_root, "pipeline": self.pipeline, "poll_interval": self.poll_interval},
        )

    def _event(self, names: list[str]) -> TriggerEvent:
        from airflow_provider_pglogical.staging.layout import parse_batch_name

        return TriggerEvent({"pipeline": self.pipeline, "staging_root": self.staging_root, "batches": names,
                             "end_lsn": str(parse_batch_name(names[-1])[1])})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        pending = await asyncio.to_thread(pending_names, self.staging_root, self.pipeline)
        newest = await asyncio.to_thread(batches_after, self.staging_root, self.pipeline, None)
        announced = newest[-1] if newest else None
        if pending:
            self.log.info("%d committed batch(es) of pipeline %s wait for an apply", len(pending), self.pipeline)
            yield self._event(pending)
        while True:
            await asyncio.sleep(self.poll_interval)
            names = await asyncio.to_thread(batches_after, self.staging_root, self.pipeline, announced)
            if names:
                announced = names[-1]
                self.log.info("%d batch(es) of pipeline %s committed, the newest %s", len(names), self.pipeline,
                              announced)
                yield self._event(names)


def staged_batches_asset(staging_root: str, pipeline: str, poll_interval: float = DEFAULT_WATCH_INTERVAL):
    """The Asset of a pipeline's committed batches, watched by :class:`StagedBatchTrigger`:
    ``schedule=[staged_batches_asset(STAGING, "shop")]`` runs a DAG when a pull commits a batch.

    The arguments are checked when the DAG is parsed (a wrong one fails the DAG's import with the fix),
    since the trigger would otherwise fail later in the triggerer, where nobody looks.
    """
    from airflow.sdk import Asset, AssetWatcher

    from airflow_provider_pglogical.management.validation import check_pipeline_name, check_seconds, check_staging_root

    check_staging_root(staging_root)
    check_pipeline_name(pipeline)
    poll_interval = check_seconds(poll_interval, "poll_interval")

    name = f"pglogical_staged_batches_{pipeline}"
    trigger = StagedBatchTrigger(staging_root=staging_root, pipeline=pipeline, poll_interval=poll_interval)
    return Asset(name=name, group="pglogical", watchers=[AssetWatcher(name=f"{name}_watcher", trigger=trigger)])
