"""What applying one table's step needs, shared by keyed tables and keyless (multiset) tables."""

from __future__ import annotations

import logging

from airflow_provider_pglogical.spark.apply.adoption import Adoption
from airflow_provider_pglogical.spark.common.hadoop_files import Staging
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.apply.plan import Batch, Step
from airflow_provider_pglogical.spark.apply.reduction import read_rows
from airflow_provider_pglogical.spark.row_delta.driver_commits import ConcurrentCommit, only_compacted_since
from airflow_provider_pglogical.staging.column_types import staged_columns


log = logging.getLogger("pglogical.apply")
#: how often a row delta that lost to a compaction (housekeeping beside the apply) reads and commits again
ROW_DELTA_ATTEMPTS = 3


class StepApplier:
    """What the paths (``paths/``) need to apply steps of one table: its staged rows, the driver's
    row deltas, an adoption; a keyed (``keyed.py``) or keyless (``multisets.py``) table's own
    reduction of a change batch."""

    #: a keyless table, kept as a multiset (``multisets.py``)
    keyless: bool = False

    def __init__(self, spark, staging: Staging, lakehouse: Lakehouse):
        self.spark = spark
        self.staging = staging
        self.lakehouse = lakehouse
        #: the driver's row deltas (``row_delta/``), or None: every change batch is MERGEd
        self.row_deltas = None
        #: the ``(source, batch)`` steps applied as Iceberg row deltas (``row_deltas.py``), not MERGEd
        self.row_delta_steps: set[tuple[str, str]] = set()
        #: the ``(source, batch)`` snapshot steps whose staged files were adopted (``adoption.py``): how many
        self.adopted_steps: dict[tuple[str, str], int] = {}

    def as_row_delta(self, step: Step, source: str, target: str, types: dict[str, str]) -> int | None:
        """The rows of ``step`` applied as an Iceberg row delta by ``self.row_deltas``; None (nothing
        committed, the reason logged) when it finds it cannot: the caller MERGEs."""
        manifest = step.batch.manifest.tables[source]
        for attempt in range(1, ROW_DELTA_ATTEMPTS + 1):
            table = self.row_deltas.load(target)
            try:
                rows = self.row_deltas.apply(table, target, self.staging.files(step.batch, source), manifest, types,
                                             step.batch.name)
                break
            except ConcurrentCommit as conflict:  # a compaction rewrote a file it deletes from: read again
                if attempt == ROW_DELTA_ATTEMPTS or not only_compacted_since(table, conflict.read_at):
                    raise
                log.info("%s, batch %s: a compaction committed while the row delta ran; reading its rows again",
                         source, step.batch.name)
        if rows is None:
            return None
        self.row_delta_steps.add((source, step.batch.name))
        return rows

    def adopt(self, step: Step, source: str, target: str) -> int | None:
        """Replace ``target``'s rows with the snapshot's staged files as they are (``adoption.py``);
        returns the files adopted, or None (nothing done, the reason logged) when a file's own schema
        is not the table's: the caller rewrites."""
        table = self.lakehouse.iceberg_table(target)
        files, reason = Adoption(self.spark).adopt(table, self.staging.files(step.batch, source), step.batch.name)
        if reason is not None:
            log.info("%s, batch %s: the snapshot is rewritten, not adopted: %s", source, step.batch.name, reason)
            return None
        return files

    def read(self, step: Step, source: str, types: dict[str, str], *, changes: bool):
        """The step's staged rows of ``source``, cast to ``types`` (see :func:`read_rows`)."""
        return self.read_batch(step.batch, source, types, changes=changes)

    def read_batch(self, batch: Batch, source: str, types: dict[str, str], *, changes: bool):
        """A batch's staged rows of ``source``, cast to ``types`` (see :func:`read_rows`)."""
        manifest = batch.manifest.tables[source]
        return read_rows(self.spark, self.staging.files(batch, source), staged_columns(manifest, changes=changes),
                         types, list(manifest.key), changes)
