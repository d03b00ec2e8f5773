"""What the apply task last applied, per source table: ``<root>/<pipeline>/_applied.json``.

The authoritative positions live in the lakehouse (``<catalog>.<namespace>._pglogical_state``,
read and written by the Spark job). The apply operator copies what each run applied into this
small file under staging after the job committed, so operations tooling (``airflow pglogical
status``) can show the applied position per table without starting Spark.
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable

from airflow_provider_pglogical.staging.layout import (
    StagingPath,
    parse_batch_name,
    read_pipeline_file,
    write_pipeline_file,
)

APPLIED = "_applied.json"


def read_applied(root: StagingPath, pipeline: str) -> dict[str, dict]:
    """``{source table: {"target", "batch", "kind", "lsn", "rows", "applied_at"}}``; empty before any apply."""
    return read_pipeline_file(root, pipeline, APPLIED) or {}


def record_applied(root: StagingPath, pipeline: str, steps: Iterable[dict]) -> dict[str, dict]:
    """Merge one apply run's steps (as the job reports them) into the file; returns the new contents."""
    applied = read_applied(root, pipeline)
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    changed = False
    for step in steps:
        parsed = parse_batch_name(step["batch"])
        applied[step["table"]] = {
            "target": step["target"], "batch": step["batch"], "kind": step["kind"],
            "lsn": str(parsed[1]) if parsed else None, "rows": step["rows"], "applied_at": now,
        }
        changed = True
    if changed:
        write_pipeline_file(root, pipeline, APPLIED, applied)
    return applied
