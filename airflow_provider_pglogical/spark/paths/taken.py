"""A step applied by the path :func:`choice.choose_path` chose, falling back where a path finds at
run time that it cannot do the step (each fallback logs why)."""

from __future__ import annotations

from airflow_provider_pglogical.spark.apply.plan import Step
from airflow_provider_pglogical.spark.apply.steps import StepApplier
from airflow_provider_pglogical.spark.paths.choice import ApplyPath, PathChoice


def take_path(applier: StepApplier, choice: PathChoice, step: Step, source: str, target: str,
              types: dict[str, str]) -> tuple[int, ApplyPath]:
    """Apply ``step`` to ``target`` by ``choice``; returns the staged rows applied and the path taken.

    An adoption that finds a staged file whose own schema is not the table's rewrites; a row delta
    that cannot read the rows it replaces through Iceberg's reader MERGEs. Either is exact from the
    same snapshot: nothing of the first path was committed."""
    if step.kind == "snapshot":
        if choice.path is ApplyPath.ADOPT:
            files = applier.adopt(step, source, target)
            if files is not None:
                applier.adopted_steps[(source, step.batch.name)] = files
                return step.batch.manifest.tables[source].rows, ApplyPath.ADOPT
            return applier.snapshot(step, source, target, types), ApplyPath.REWRITE
        return applier.snapshot(step, source, target, types), choice.path
    if choice.path is ApplyPath.ROW_DELTA and applier.row_deltas is not None:
        rows = applier.as_row_delta(step, source, target, types)
        if rows is not None:
            return rows, ApplyPath.ROW_DELTA
        return applier.changes(step, source, target, types), ApplyPath.MERGE
    return applier.changes(step, source, target, types), choice.path
