"""One pipeline's figures for the UI: what staging holds and what its slot says, read cheaply.

Everything here only reads: the pipeline's small JSON files under staging (record, applied
positions, apply marker, the tasks' capped history), the names of its committed batches and the
manifests of at most :data:`MAX_MANIFESTS` pending ones, and one short query on the publisher. No
lock a pipeline needs is taken. A staging root or publisher that cannot be reached becomes an
``error`` of that pipeline, so one broken pipeline never fails the page.
"""

from __future__ import annotations

import datetime as dt
import statistics
from typing import Any

from airflow_provider_pglogical.capture.chunked.progress import load_figures, read_load
from airflow_provider_pglogical.management import connector
from airflow_provider_pglogical.management.monitoring import slot_status
from airflow_provider_pglogical.management.slots import get_slot
from airflow_provider_pglogical.staging.applied_positions import read_applied
from airflow_provider_pglogical.staging.apply_marker import read_marker
from airflow_provider_pglogical.ui.history import read_history
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.staging.pipeline_record import read_record
from airflow_provider_pglogical.ui.discovery import PipelineRef

#: pending batches whose manifests are read for their row counts (the rest are counted, not read)
MAX_MANIFESTS = 50
#: recorded pulls whose gaps tell when the next one comes (for the idle-timeout warning)
CADENCE_PULLS = 6
#: history points returned per chart
MAX_POINTS = 200
#: seconds to wait for a publisher before showing it as unreachable
CONNECT_TIMEOUT = 3


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def pending_work(root, pipeline: str) -> dict[str, Any]:
    """Committed batches, and those no apply has seen yet (the apply marker) with their rows: read
    from at most :data:`MAX_MANIFESTS` manifests (``pending_rows_exact`` False when there are more).
    The view shows it and the metrics export it (``ui.metrics.pending_metrics``)."""
    batches = committed_batches(root, pipeline)
    marker = read_marker(root, pipeline)
    seen = set(marker.get("seen", ())) if marker else set()
    pending = [name for name, _start, _end, _kind in batches if name not in seen]
    pending_rows = sum(sum(t.rows for t in read_manifest(root, pipeline, name).tables.values())
                       for name in pending[:MAX_MANIFESTS])
    return {"committed_batches": len(batches), "last_batch": batches[-1][0] if batches else None,
            "pending_batches": len(pending), "pending_rows": pending_rows,
            "pending_rows_exact": len(pending) <= MAX_MANIFESTS}


def table_freshness(applies: list[dict]) -> dict[str, float]:
    """Per table, the freshness its newest apply reached (the history's entries, oldest first)."""
    freshness: dict[str, float] = {}
    for entry in applies:
        freshness.update(entry.get("tables") or {})
    return freshness


def pull_cadence(pulls: list[dict], now: dt.datetime | None = None) -> float | None:
    """Seconds until the next pull, judged from the recorded ones: the newest pull's time plus the
    median gap between the last :data:`CADENCE_PULLS` pulls; None with fewer than two."""
    times = [dt.datetime.fromisoformat(e["at"]) for e in pulls[-CADENCE_PULLS:] if e.get("at")]
    if len(times) < 2:
        return None
    gap = statistics.median((b - a).total_seconds() for a, b in zip(times, times[1:]))
    now = now or dt.datetime.now(dt.timezone.utc)
    return max(0.0, (times[-1] - now).total_seconds() + gap)


def staging_figures(root, ref: PipelineRef) -> dict[str, Any]:
    """Record, batches (pending and their rows), per-table applied positions and the history."""
    pipeline = ref.pipeline
    record = read_record(root, pipeline)
    applied = read_applied(root, pipeline)
    pulls = read_history(root, pipeline, "pull")
    applies = read_history(root, pipeline, "apply")
    freshness = table_freshness(applies)
    names = sorted(set(record.tables if record else ()) | set(applied))
    tables = [{"table": name, "target": applied.get(name, {}).get("target"),
               "applied_lsn": applied.get(name, {}).get("lsn"), "applied_at": applied.get(name, {}).get("applied_at"),
               "applied_rows": applied.get(name, {}).get("rows"), "freshness_seconds": freshness.get(name)}
              for name in names]
    errors = [e for e in [*pulls, *applies] if e.get("error")]
    recorded = [e for e in pulls if not e.get("error")]
    return {
        "state": record.state if record else "no pipeline record",
        "slot": record.slot if record else ref.slot,
        "publications": list(record.publications) if record else [],
        **pending_work(root, pipeline),
        "tables": tables,
        "last_pull": next((e for e in reversed(pulls) if not e.get("error")), None),
        "last_apply": next((e for e in reversed(applies) if not e.get("error")), None),
        "last_error": max(errors, key=lambda e: e.get("at", "")) if errors else None,
        # the newest pull that snapshotted tables again or orphaned some (issue 47)
        "last_source_change": next((e for e in reversed(recorded) if e.get("resnapshotted") or e.get("orphaned")),
                                   None),
        "next_pull_in_seconds": pull_cadence(recorded),
        # a chunked initial load's progress (snapshot_mode="chunked"); None without one
        "initial_load": load_figures(read_load(root, pipeline)),
        "history": {
            "slot_lag": [{"at": e["at"], "lag_bytes": e.get("lag_bytes"),
                          "retained_wal_bytes": e.get("retained_wal_bytes")}
                         for e in recorded][-MAX_POINTS:],
            "freshness": [{"at": e["at"], "seconds": e.get("freshness_seconds")}
                          for e in applies if e.get("freshness_seconds") is not None][-MAX_POINTS:],
        },
    }


def slot_figures(hook, slot: str, until_next_pull: float | None = None) -> dict[str, Any]:
    """The slot's state, lag, retained WAL, invalidation reason, WAL headroom and the warnings before
    its loss: ``monitoring.slot_status``, as the sensor and the metrics read it."""
    kwargs = {"connect_timeout": CONNECT_TIMEOUT, **hook.connect_kwargs()}
    with connector.autocommit_cursor(kwargs) as cursor:
        return slot_status(cursor, slot, until_next_pull=until_next_pull)


def pipeline_figures(ref: PipelineRef, open_root, open_hook) -> dict[str, Any]:
    """Everything the page shows of one pipeline; failures become ``staging_error`` / ``slot_error``.

    :param open_root: the staging root's ``ObjectStoragePath`` from its URI.
    :param open_hook: the publisher's hook from a connection id.
    """
    out: dict[str, Any] = {"pipeline": ref.pipeline, "staging_root": ref.staging_root, "dags": ref.dag_ids,
                           "postgres_conn_id": ref.postgres_conn_id}
    try:
        out.update(staging_figures(open_root(ref.staging_root), ref))
    except Exception as err:  # noqa: BLE001 - shown on the page for this pipeline only
        out["staging_error"] = (f"cannot read staging {ref.key}: {_reason(err)}. Fix: check the staging root "
                                "and its connection as the DAG's tasks use them")
    slot = out.get("slot") or ref.slot
    if ref.postgres_conn_id is None or slot is None:
        out["slot_error"] = ("no publisher connection or slot known for this pipeline: its DAGs hold no pull or "
                             "initial sync task with plain (untemplated) postgres_conn_id and slot")
        return out
    try:
        out["slot_health"] = slot_figures(open_hook(ref.postgres_conn_id), slot, out.get("next_pull_in_seconds"))
    except Exception as err:  # noqa: BLE001
        out["slot_error"] = (f"cannot read slot {slot!r} through connection {ref.postgres_conn_id!r}: "
                             f"{_reason(err)}. Fix: check that connection and that the publisher is up")
    return out
