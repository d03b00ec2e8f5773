"""The pipelines the user's DAGs run, read from their serialized form (no DAG file is parsed).

Every operator of this provider carries ``staging_root`` and ``pipeline``; the capture operators
(initial sync, backfill, pull) also name the publisher's connection and the slot. A pipeline is
one ``(staging_root, pipeline)``; the DAGs that run it decide who may see it. A value still holding
a Jinja template is only known at run time, so such a task is left out (docs/ui.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

PACKAGE = "airflow_provider_pglogical."


@dataclass
class PipelineRef:
    """Where a pipeline lives and which DAGs run it (no secrets: connection ids only)."""

    staging_root: str
    pipeline: str
    postgres_conn_id: str | None = None
    slot: str | None = None
    dag_ids: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.staging_root.rstrip('/')}/{self.pipeline}"


def _plain(value) -> str | None:
    """A rendered string value, or None for a missing or templated one."""
    return value if isinstance(value, str) and value and "{{" not in value and "{%" not in value else None


def tasks_of(serialized: dict) -> list[dict]:
    """The task attributes of a serialized DAG (``SerializedDagModel.data``)."""
    return [task.get("__var", task) for task in (serialized.get("dag") or {}).get("tasks", [])]


def discover(dags: Iterable[tuple[str, dict]]) -> list[PipelineRef]:
    """The pipelines of ``(dag_id, serialized DAG)`` pairs, in a stable order."""
    found: dict[tuple[str, str], PipelineRef] = {}
    for dag_id, serialized in dags:
        for task in tasks_of(serialized):
            if not str(task.get("_task_module", "")).startswith(PACKAGE):
                continue
            root, pipeline = _plain(task.get("staging_root")), _plain(task.get("pipeline"))
            if root is None or pipeline is None:
                continue
            ref = found.setdefault((root.rstrip("/"), pipeline), PipelineRef(root.rstrip("/"), pipeline))
            if dag_id not in ref.dag_ids:
                ref.dag_ids.append(dag_id)
            ref.postgres_conn_id = ref.postgres_conn_id or _plain(task.get("postgres_conn_id"))
            ref.slot = ref.slot or _plain(task.get("slot"))
    return [found[key] for key in sorted(found)]
