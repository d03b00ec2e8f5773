"""A keyless table's change batch netted per row value (``reduction.py``), for the path that
writes it (``paths/merge.py``, ``paths/rewrite.py``, ``row_delta/multiset_row_deltas.py``; chosen in
``paths/choice.py``, taken in ``paths/taken.py``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow_provider_pglogical.spark.apply.plan import Step
from airflow_provider_pglogical.spark.apply.reduction import check_multiset_identity, multiset_deltas, multiset_values
from airflow_provider_pglogical.spark.apply.steps import StepApplier
from airflow_provider_pglogical.spark.row_delta.multiset_row_deltas import MultisetRowDeltas

log = logging.getLogger("pglogical.apply")


@dataclass(frozen=True)
class NettedBatch:
    """A keyless table's change batch as its MERGE or rewrite needs it (:meth:`Multisets.netted`).

    :param deltas: per row value, the net change of its number of copies (``__d``); None when the
        batch counts no row.
    :param truncated: the batch holds a TRUNCATE (``deltas`` counts the rows after the last one).
    :param rows: the change rows counted.
    """

    deltas: object | None
    truncated: bool
    rows: int


class Multisets(StepApplier):
    """Applies steps to a keyless table, kept as PostgreSQL's own subscriber keeps it: a multiset.

    An INSERT adds one row even when identical ones exist; a DELETE, or an UPDATE's old row,
    removes exactly one identical row; NULLs compare equal. The n identical copies of a row value
    are numbered 1..n in ``_pglogical_occurrence``, so (values, occurrence) is a key. A change
    batch reduces to the net change of the number of copies per row value and one MERGE adds
    copies count+1..count+d or deletes the copies above count+d (``paths/merge.py``).

    Exactly once: the MERGE also writes the batch's name into ``_pglogical_batch`` of the copies
    it inserts, or of the highest copy it keeps, so a re-run after the data commit and before
    the state commit finds the row values the batch has changed already and skips them; a row
    value the batch removed entirely cannot go below zero copies.

    :param row_deltas: the small change batches ``paths/choice.py`` sends to a row delta are applied
        as Iceberg row deltas the driver commits (``multiset_row_deltas.py``), the same copies written
        and deleted, instead of a MERGE.
    """

    keyless = True

    def __init__(self, spark, staging, lakehouse, row_deltas: bool = True) -> None:
        super().__init__(spark, staging, lakehouse)
        self.row_deltas = MultisetRowDeltas(spark, staging, lakehouse) if row_deltas else None

    def netted(self, step: Step, source: str, types: dict[str, str]) -> NettedBatch:
        """The step's change batch netted per row value."""
        manifest = step.batch.manifest.tables[source]
        check_multiset_identity(step.batch.name, source, manifest)
        if not manifest.files:
            return NettedBatch(None, False, 0)
        batch_columns = [c.name for c in manifest.columns]
        rows = self.read(step, source, {c: types[c] for c in batch_columns}, changes=True)
        known = manifest.facts_decide(step.position)
        deltas, truncated, count = multiset_deltas(rows, multiset_values(types), list(manifest.key), step.position,
                                                   known_rows=known.rows if known else None)
        return NettedBatch(deltas if count else None, truncated, count)
