"""A keyed table's change batch reduced to one row per key (``reduction.py``), for the path that
writes it. Which path a step takes is chosen in ``paths/choice.py`` and taken in
``paths/taken.py``; each path is one module: ``paths/rewrite.py`` (a full snapshot, a batch holding
a TRUNCATE), ``paths/merge.py`` (a ranged backfill, a change batch), ``adoption.py`` and
``row_delta/``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow_provider_pglogical.spark.apply.plan import Step
from airflow_provider_pglogical.spark.apply.reduction import Reduced, reduce_changes
from airflow_provider_pglogical.spark.apply.steps import StepApplier
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.row_delta.row_deltas import RowDeltas
from airflow_provider_pglogical.staging.seam.manifests import TableManifest

log = logging.getLogger("pglogical.apply")


@dataclass(frozen=True)
class KeyedBatch:
    """A keyed table's change batch as its MERGE or rewrite needs it (:meth:`KeyedTables.reduced`).

    :param reduced: one row per touched key; None when the batch applies nothing.
    :param batch_columns: the batch's columns; ``values`` those of them that are not the key.
    """

    reduced: Reduced | None
    manifest: TableManifest
    batch_columns: list
    values: list


class KeyedTables(StepApplier):
    """Applies steps to tables with a replica-identity key (a primary key or USING INDEX).

    :param row_deltas: the small change batches ``paths/choice.py`` sends to a row delta are applied
        as Iceberg row deltas (``row_deltas.py``) instead of a MERGE; ``row_delta_steps`` names the
        ``(source, batch)`` steps that were.
    """

    keyless = False

    def __init__(self, spark, staging, lakehouse, row_deltas: bool = True) -> None:
        super().__init__(spark, staging, lakehouse)
        self.row_deltas = RowDeltas(spark, staging, lakehouse) if row_deltas else None

    def reduced(self, step: Step, source: str, types: dict[str, str]) -> KeyedBatch:
        """The step's change batch reduced to the last state of every key it touches."""
        manifest = step.batch.manifest.tables[source]
        keys = list(manifest.key)
        if not keys:
            raise ApplyError(
                f"batch {step.batch.name}, table {source}: no replica-identity key; set REPLICA IDENTITY "
                "(a primary key, USING INDEX or FULL) on the source table"
            )
        batch_columns = [c.name for c in manifest.columns]
        values = [c for c in batch_columns if c not in keys]
        if not manifest.files:
            return KeyedBatch(None, manifest, batch_columns, values)
        rows = self.read(step, source, {c: types[c] for c in batch_columns}, changes=True)
        reduced = reduce_changes(self.spark, rows, keys, values, step.position,
                                 manifest.facts_decide(step.position))
        return KeyedBatch(reduced if reduced.rows else None, manifest, batch_columns, values)
