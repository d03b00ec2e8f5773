"""Which committed batches the last successful apply saw: ``<root>/<pipeline>/_apply_marker.json``.

An idle tick must not start a JVM (5-10 s) just to learn that nothing is pending. The apply job
reports every batch it found committed; after the job *succeeded*, each of those is applied (or
made irrelevant by a later snapshot), and the operator records them here with the lakehouse they
went to. Before the next spark-submit the operator lists the committed batches: when each is in
the marker, for the same catalog, namespace and warehouse, there is nothing to apply.

The Iceberg state table stays the truth. The marker can only make the operator run Spark when it
was not needed (a stale marker), never skip a pending batch: a batch is skipped only when a
successful run saw it, and one committed during or after that run is not in the marker. Reset the
lakehouse and you must delete the marker too (``airflow pglogical drop`` removes staging whole).

The marker also records each target table's metadata file as the job left it: a table dropped
while the pipeline is idle loses it, and the operator then runs the job (which rebuilds the
table from staging) instead of skipping.
"""

from __future__ import annotations

from typing import Iterable

from airflow_provider_pglogical.staging.layout import (
    StagingPath,
    committed_batches,
    read_pipeline_file,
    write_pipeline_file,
)

MARKER = "_apply_marker.json"


def read_marker(root: StagingPath, pipeline: str) -> dict | None:
    return read_pipeline_file(root, pipeline, MARKER)


def write_marker(root: StagingPath, pipeline: str, lakehouse: dict, seen: Iterable[str],
                 targets: dict[str, str | None] | None = None) -> None:
    """Record the batches a successful apply saw, and its target tables' metadata files (through a
    temporary name and a rename)."""
    write_pipeline_file(root, pipeline, MARKER, {"lakehouse": lakehouse, "seen": sorted(set(seen)),
                                                 "targets": dict(sorted((targets or {}).items()))})


def recorded_targets(root: StagingPath, pipeline: str, lakehouse: dict) -> dict[str, str | None] | None:
    """Target table -> metadata file, as the last successful apply into ``lakehouse`` left them;
    None when the marker records none (no marker, another lakehouse, or an older marker)."""
    marker = read_marker(root, pipeline)
    if marker is None or marker.get("lakehouse") != lakehouse or "targets" not in marker:
        return None
    return dict(marker["targets"])


def pending_batches(root: StagingPath, pipeline: str, lakehouse: dict) -> list[str] | None:
    """Committed batches the last successful apply into ``lakehouse`` did not see, in LSN order;
    ``None`` when no marker speaks for this lakehouse (then only Spark can tell)."""
    marker = read_marker(root, pipeline)
    if marker is None or marker.get("lakehouse") != lakehouse:
        return None
    seen = set(marker.get("seen", ()))
    return [name for name, _start, _end, _kind in committed_batches(root, pipeline) if name not in seen]
