"""The pipeline's figures as Airflow metrics, through Airflow's own ``Stats`` (docs/metrics.md).

Whatever Airflow is configured to send to (StatsD, Datadog's DogStatsD, OpenTelemetry) receives
them, with no configuration of ours: the pull, the apply and the slot-lag sensor emit them where
they already compute the figures the pipeline view shows, with the same functions
(:func:`airflow_provider_pglogical.management.monitoring.slot_status`,
:func:`airflow_provider_pglogical.ui.figures.pending_work`, :mod:`airflow_provider_pglogical.ui.history`'s
entries), so a dashboard and the view never disagree. Names start with ``pglogical.`` (Airflow adds
its ``statsd_prefix``); the pipeline and table go in tags, as Airflow's own metrics carry ``dag_id``,
and, where Airflow's plain StatsD client would drop them, also in a second name
(``pglogical.slot.lag_bytes.<pipeline>``, while ``[metrics] legacy_names_on`` is on, its default).
A metric never fails a task: an error is logged as a warning.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Callable, Mapping

from airflow_provider_pglogical.ui.history import pull_entry, safely_record

PREFIX = "pglogical"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")

#: what a slot's status (``monitoring.slot_status``) exports: metric name → field
SLOT_GAUGES = {
    "slot.lag_bytes": "lag_bytes",
    "slot.retained_wal_bytes": "retained_wal_bytes",
    "slot.wal_headroom_bytes": "safe_wal_size_bytes",
    "slot.wal_keep_share": "wal_keep_share",
    "slot.idle_timeout_share": "idle_share",
}


def _stats():
    try:  # what the official providers use on every Airflow 3 (the Task SDK's Stats on 3.2+)
        from airflow.providers.common.compat.sdk import Stats
    except ImportError:  # common-compat before Stats was added to it
        from airflow.stats import Stats
    return Stats


def _legacy_names() -> bool:
    """Whether to send a second name carrying the tag values: only where the tags are lost (Airflow's
    plain StatsD client without ``statsd_influxdb_enabled``; DogStatsD and OpenTelemetry keep them),
    and while Airflow's ``[metrics] legacy_names_on`` is on."""
    try:
        from airflow.providers.common.compat.sdk import conf
    except ImportError:
        from airflow.configuration import conf
    flag = lambda name, default=False: conf.getboolean("metrics", name, fallback=default)  # noqa: E731
    return (flag("statsd_on") and not flag("statsd_datadog_enabled") and not flag("statsd_influxdb_enabled")
            and flag("legacy_names_on", True))


def _legacy(name: str, tags: Mapping[str, str]) -> str:
    """``name`` with the tag values appended, as Airflow's legacy names carry ``dag_id`` (a dot in a
    value becomes ``__``, as Airflow does, so the name keeps its levels)."""
    return ".".join([name, *(_UNSAFE.sub("_", str(v).replace(".", "__")) for v in tags.values())])


def emit(kind: str, name: str, value: float | None, tags: Mapping[str, str]) -> None:
    """One metric: ``gauge``, ``incr`` (a count) or ``timing`` (seconds, sent as Airflow's timers in ms)."""
    if value is None:
        return
    stats, full = _stats(), f"{PREFIX}.{name}"
    names = [(full, dict(tags))] + ([(_legacy(full, tags), None)] if tags and _legacy_names() else [])
    for stat, stat_tags in names:
        if kind == "gauge":
            stats.gauge(stat, value, tags=stat_tags)
        elif kind == "incr":
            stats.incr(stat, count=int(value), tags=stat_tags)
        else:
            stats.timing(stat, value * 1000.0, tags=stat_tags)


def slot_metrics(pipeline: str, status: Mapping[str, Any]) -> None:
    """The slot's gauges and ``slot.at_risk`` (1 while a warning before its loss stands, else 0)."""
    tags = {"pipeline": pipeline}
    for name, field in SLOT_GAUGES.items():
        emit("gauge", name, status.get(field), tags)
    lost = status.get("state") in ("missing", "invalidated")
    emit("gauge", "slot.at_risk", 1 if lost or status.get("warnings") else 0, tags)


def pending_metrics(pipeline: str, pending: Mapping[str, Any]) -> None:
    """Committed batches no apply has seen yet, and their rows (``ui.figures.pending_work``)."""
    emit("gauge", "pending.batches", pending.get("pending_batches"), {"pipeline": pipeline})
    emit("gauge", "pending.rows", pending.get("pending_rows"), {"pipeline": pipeline})


def round_metrics(kind: str, pipeline: str, entry: Mapping[str, Any]) -> None:
    """A pull's or an apply's round from its history entry: ``<kind>.rows`` (a count) and
    ``<kind>.duration`` (a timer); an apply's entry adds ``table.freshness_seconds`` per table."""
    tags = {"pipeline": pipeline}
    emit("incr", f"{kind}.rows", entry.get("rows"), tags)
    emit("timing", f"{kind}.duration", entry.get("seconds"), tags)
    for table, seconds in sorted((entry.get("tables") or {}).items()):
        emit("gauge", "table.freshness_seconds", seconds, {"pipeline": pipeline, "table": table})


def safely(what: str, pipeline: str, action: Callable[[], None], warn: Callable[[str], None]) -> None:
    """Run ``action``; an error only warns: metrics must never fail a task."""
    try:
        action()
    except Exception as err:  # noqa: BLE001 - the task's work comes first
        warn(f"could not emit the {what} metrics of pipeline {pipeline!r}: {err}")


def after_pull(root, pipeline: str, hook, slot: str, result: dict, seconds: float, warn: Callable[[str], None],
               until_next_pull: float | None = None) -> None:
    """What a pull leaves for people: its history entry (the view's chart) and its metrics, with the
    slot as the pull left it, its warnings logged."""
    from airflow_provider_pglogical.ui.figures import pending_work

    status: dict = {}

    def read_slot() -> None:
        status.update(hook.slot_health(slot, until_next_pull=until_next_pull))
        for warning in status.get("warnings") or ():
            warn(warning)

    safely("slot", pipeline, read_slot, warn)
    entry: dict = {}
    safely_record(root, pipeline, "pull", lambda: entry.update(pull_entry(result, seconds, status)) or entry, warn)
    safely("pull", pipeline, lambda: round_metrics("pull", pipeline, entry), warn)
    if status:
        safely("slot", pipeline, lambda: slot_metrics(pipeline, status), warn)
    safely("pending", pipeline, lambda: pending_metrics(pipeline, pending_work(root, pipeline)), warn)


def after_apply(root, pipeline: str, entry: Callable[[], dict] | None, warn: Callable[[str], None],
                seconds: float | None = None) -> None:
    """What an apply leaves: its history entry and its metrics: the round, per table freshness, what
    is still pending.

    :param entry: the apply's history entry; None when its job recorded its rounds itself, as a
        window does: then the rounds it recorded in the last ``seconds`` are sent, when the window ends.
    """
    from airflow_provider_pglogical.ui.figures import pending_work
    from airflow_provider_pglogical.ui.history import read_history

    recorded: dict = {}
    if entry is not None:
        safely_record(root, pipeline, "apply", lambda: recorded.update(entry()) or recorded, warn)
        safely("apply", pipeline, lambda: round_metrics("apply", pipeline, recorded), warn)
    elif seconds is not None:
        def window_rounds() -> None:
            since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds)
            for past in read_history(root, pipeline, "apply"):
                if past.get("at") and dt.datetime.fromisoformat(past["at"]) >= since and not past.get("error"):
                    round_metrics("apply", pipeline, past)

        safely("apply", pipeline, window_rounds, warn)
    safely("pending", pipeline, lambda: pending_metrics(pipeline, pending_work(root, pipeline)), warn)
