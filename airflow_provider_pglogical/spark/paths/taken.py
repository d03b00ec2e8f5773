"""A step applied by the path :func:`choice.choose_path` chose, falling back where a path finds at
run time that it cannot do the step (each fallback logs why). Each path is one module:
ADOPT ``apply/adoption.py``, REWRITE ``rewrite.py``, MERGE ``merge.py``, ROW_DELTA ``row_delta/``."""

from __future__ import annotations

from airflow_provider_pglogical.spark.apply.plan import Step, range_predicate
from airflow_provider_pglogical.spark.apply.reduction import multiset_values
from airflow_provider_pglogical.spark.apply.steps import StepApplier
from airflow_provider_pglogical.spark.paths.choice import ApplyPath, PathChoice
from airflow_provider_pglogical.spark.paths.merge import (
    merge_key_range,
    merge_keyed_changes,
    merge_multiset_changes,
    merge_multiset_range,
)
from airflow_provider_pglogical.spark.paths.rewrite import (
    rewrite_keyed_snapshot,
    rewrite_keyed_truncated,
    rewrite_multiset_snapshot,
    rewrite_multiset_truncated,
)


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
        return _snapshot(applier, step, source, target, types)
    if choice.path is ApplyPath.ROW_DELTA and applier.row_deltas is not None:
        rows = applier.as_row_delta(step, source, target, types)
        if rows is not None:
            return rows, ApplyPath.ROW_DELTA
        return _changes(applier, step, source, target, types, ApplyPath.MERGE)
    return _changes(applier, step, source, target, types, choice.path)


def _snapshot(applier: StepApplier, step: Step, source: str, target: str, types: dict[str, str]) -> tuple[int, ApplyPath]:
    """A snapshot not adopted: a ranged backfill MERGEs its range, a full snapshot rewrites the table."""
    predicate = range_predicate(step.batch.manifest.snapshot_scope(source), step.batch.name, source)
    if predicate is not None:
        merge = merge_multiset_range if applier.keyless else merge_key_range
        return merge(applier, step, source, target, types, predicate), ApplyPath.MERGE
    if applier.keyless:
        return rewrite_multiset_snapshot(applier, step, source, target, multiset_values(types)), ApplyPath.REWRITE
    return rewrite_keyed_snapshot(applier, step, source, target, types), ApplyPath.REWRITE


def _changes(applier: StepApplier, step: Step, source: str, target: str, types: dict[str, str],
             chosen: ApplyPath) -> tuple[int, ApplyPath]:
    """A change batch reduced by its table's kind, then MERGEd, or, holding a TRUNCATE (which an
    earlier version's batch may say only in its rows), the table rewritten; ``chosen`` when it
    applies no row."""
    if applier.keyless:
        netted = applier.netted(step, source, types)
        if netted.deltas is None:
            return netted.rows, chosen
        if netted.truncated:
            rewrite_multiset_truncated(applier.lakehouse, netted.deltas, target, types, step.batch.name)
            return netted.rows, ApplyPath.REWRITE
        merge_multiset_changes(applier.spark, applier.lakehouse, netted.deltas, target,
                               list(multiset_values(types)), step.batch.name)
        return netted.rows, ApplyPath.MERGE
    batch = applier.reduced(step, source, types)
    if batch.reduced is None:
        return 0, chosen
    if batch.reduced.truncated:
        rewrite_keyed_truncated(applier.lakehouse, batch.reduced.frame, target, batch.batch_columns, types)
        return batch.reduced.rows, ApplyPath.REWRITE
    merge_keyed_changes(applier, batch.reduced, batch.manifest, target, batch.values)
    return batch.reduced.rows, ApplyPath.MERGE
