"""Which way one step reaches its Iceberg table: the apply's one choice among its paths, made here.

Four paths bring a table to the end of a staged batch (``ApplyPath``):

* **ADOPT**: a full snapshot's staged Parquet files become the table's data files as they are
  (``apply/adoption.py``): no rewrite;
* **REWRITE**: every row of the table is replaced by rows computed from staging alone (a
  snapshot that cannot be adopted, a change batch holding a TRUNCATE): one validated overwrite
  (``paths/rewrite.py``);
* **MERGE**: one Spark ``MERGE INTO`` (merge-on-read: Spark writes position deletes; ``paths/merge.py``);
* **ROW_DELTA**: the driver reduces a small change batch itself and commits data and position
  deletes in one validated Iceberg ``RowDelta`` (``row_delta/``), without a Spark job.

:func:`choose_path` is pure: it reads the step's manifest and the facts of the target table
(:class:`TableFacts`, read once per step by :func:`table_facts`), and returns the path with the
reason, which the job logs at INFO. A path may still find at run time that it cannot do its work
(an adopted file whose own schema differs, a keyless batch whose copies are too many to read
through Iceberg's reader); it then logs why and hands the step to the next path (ADOPT ->
REWRITE, ROW_DELTA -> MERGE), which is exact from the same snapshot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from airflow_provider_pglogical.spark.apply.adoption import adoption_refused
from airflow_provider_pglogical.spark.apply.plan import Step, range_predicate
from airflow_provider_pglogical.spark.row_delta.multiset_row_deltas import multiset_ineligible
from airflow_provider_pglogical.spark.row_delta.row_deltas import ineligible
from airflow_provider_pglogical.staging.column_types import staged_columns
from airflow_provider_pglogical.staging.contract import NUMBERED_PROPERTY, OCCURRENCE
from airflow_provider_pglogical.staging.seam.manifests import TableManifest

#: the table properties a row delta needs to be merge-on-read (a copy-on-write table is rewritten by MERGE)
WRITE_MODE_PROPERTIES = ("write.merge.mode", "write.update.mode", "write.delete.mode")


class ApplyPath(enum.Enum):
    """The ways a step reaches its table (see the module)."""

    ADOPT = "adopt"
    REWRITE = "rewrite"
    MERGE = "merge"
    ROW_DELTA = "row delta"


@dataclass(frozen=True)
class PathChoice:
    """The path a step takes, and why (for the log and the step's result)."""

    path: ApplyPath
    reason: str


@dataclass(frozen=True)
class TableFacts:
    """What the choice needs to know of the target table, read once per step (:func:`table_facts`).

    :param source: the source table (``schema.table``) whose step this is.
    :param types: column -> Spark type, after the table's evolution for this batch.
    :param partitioned: the table has a partition spec (a staged file may span partitions).
    :param format_version: the table's Iceberg format version.
    :param merge_on_read: every write mode of the table is merge-on-read.
    :param numbered: a keyless table's identical rows are numbered already.
    :param row_deltas: the apply may commit row deltas from the driver (the apply's ``row_deltas`` option).
    """

    source: str
    types: dict
    partitioned: bool = False
    format_version: int = 2
    merge_on_read: bool = True
    numbered: bool = True
    row_deltas: bool = True

    @property
    def keyless(self) -> bool:
        """A REPLICA IDENTITY FULL table, kept as a multiset (``apply/multisets.py``)."""
        return OCCURRENCE in self.types


def table_facts(source: str, table, types: dict[str, str], row_deltas: bool) -> TableFacts:
    """The facts of Iceberg table ``table`` (Java, or None when it has none yet) for :func:`choose_path`."""
    if table is None:
        return TableFacts(source, dict(types), row_deltas=row_deltas)
    properties = table.properties()
    return TableFacts(source, dict(types), partitioned=not table.spec().isUnpartitioned(),
                      format_version=int(table.operations().current().formatVersion()),
                      merge_on_read=all(properties.get(name) == "merge-on-read" for name in WRITE_MODE_PROPERTIES),
                      numbered=properties.get(NUMBERED_PROPERTY) == "true", row_deltas=row_deltas)


def choose_path(step: Step, table: TableFacts) -> PathChoice:
    """The path that brings ``table`` to the end of ``step``, with the reason (pure)."""
    manifest = step.batch.manifest.tables[table.source]
    if step.kind == "snapshot":
        return _snapshot_path(step, manifest, table)
    if not manifest.files:
        return PathChoice(ApplyPath.MERGE, "the batch stages no row of the table: nothing to do")
    if manifest.truncated:
        return PathChoice(ApplyPath.REWRITE, "the batch holds a TRUNCATE: the table is replaced by the rows after it")
    if not table.row_deltas:
        return PathChoice(ApplyPath.MERGE, "row deltas are switched off (the apply's row_deltas=False)")
    reason = (multiset_ineligible if table.keyless else ineligible)(manifest, table.types, step.position)
    reason = reason or _table_takes_no_row_delta(table)
    if reason is not None:
        return PathChoice(ApplyPath.MERGE, f"not a row delta: {reason}")
    deletes = "deletion vectors (an updated row keeps its _row_id)" if table.format_version >= 3 else "position deletes"
    return PathChoice(ApplyPath.ROW_DELTA, f"a small batch the driver reduces itself: data and {deletes} "
                                           "in one validated RowDelta, no Spark job")


def _snapshot_path(step: Step, manifest: TableManifest, table: TableFacts) -> PathChoice:
    scope = step.batch.manifest.snapshot_scope(table.source)
    ranged = range_predicate(scope, step.batch.name, table.source) is not None
    if ranged and not table.keyless:
        return PathChoice(ApplyPath.MERGE, "a ranged backfill replaces only its key range: a MERGE")
    reason = adoption_refused(staged_columns(manifest, changes=False), table.types, keyless=table.keyless,
                              ranged=ranged, partitioned=table.partitioned)
    if reason is not None:
        if ranged:  # a keyless table's ranged snapshot folds the range's changes in: one MERGE
            return PathChoice(ApplyPath.MERGE, "a ranged backfill of a keyless table: one MERGE of its range "
                                               "and the range's changes since")
        return PathChoice(ApplyPath.REWRITE, f"the snapshot is rewritten, not adopted: {reason}")
    return PathChoice(ApplyPath.ADOPT, "a full snapshot of a keyed, unpartitioned table staged in the table's "
                                       "own types: its files are adopted as they are")


def _table_takes_no_row_delta(table: TableFacts) -> str | None:
    """Why the target table takes no row delta from the driver; None when it does."""
    if table.partitioned:
        return "the table is partitioned"
    if table.format_version < 2:
        return f"the table is format version {table.format_version}"
    if not table.merge_on_read:
        return "the table is copy-on-write"
    if table.keyless and not table.numbered:
        return "the table's copies are not numbered yet"
    return None
