"""One consistent cut across a pipeline's tables: per table, the snapshot holding exactly the
source's state at one commit LSN, so a reader joins tables at one transaction boundary.

Every snapshot the apply commits records, in its summary, the batch it applied, the position from
which it applied changes and the position the table holds after it (``staging/contract.py``:
``SNAPSHOT_*``; ``spark/common/commit_stamp.py``). A table's snapshot at position P holds the
source at every LSN from P up to where its next commit's changes begin: a table that no batch
touches holds later LSNs too. Its newest snapshot counts only once the state table
(``_pglogical_state``) records it (same batch), and then up to the position recorded there: a
snapshot a killed apply committed before its state commit is never part of a cut. Compactions
(``replace`` snapshots) hold their parent's rows and position.

Library code: it reads metadata only (no data file, no Spark), with pyiceberg
(``pip install airflow-provider-pglogical[readers]``). Example (docs/lakehouse.md)::

    cut = consistent_cut("orders", IcebergConfig(warehouse="file:///lake"))
    for source, table in cut.tables.items():
        rows = catalog.load_table(("pglogical", table.target)).scan(snapshot_id=table.snapshot_id)
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.contract import (
    SNAPSHOT_BATCH,
    SNAPSHOT_FROM_LSN,
    SNAPSHOT_LSN,
    STATE_TABLE,
)


class NoConsistentCut(InvalidInputError):
    """No snapshot of some table holds the source at the LSN asked for."""


@dataclass(frozen=True)
class Commit:
    """One snapshot of a table as the cut sees it (oldest first in a history)."""

    snapshot_id: int
    #: the batch it applied (None: not written by the apply, or before it recorded this)
    batch: str | None
    #: the position the table holds after it (None: at no single source position)
    lsn: int | None
    #: from where its changes begin (None: unknown, so it bounds every older snapshot)
    from_lsn: int | None
    #: a compaction (``replace``): the same rows as its parent
    same_rows: bool = False


@dataclass(frozen=True)
class TableCut:
    """A table's part of a cut: read ``target`` at ``snapshot_id``."""

    source: str
    target: str
    snapshot_id: int


@dataclass(frozen=True)
class Cut:
    """The pipeline's tables at one source commit LSN."""

    pipeline: str
    lsn: Lsn
    #: by source table (``schema.table``)
    tables: dict[str, TableCut]

    def snapshot_ids(self) -> dict[str, int]:
        """Iceberg table name (in the namespace) -> the snapshot to read."""
        return {table.target: table.snapshot_id for table in self.tables.values()}


def commit_of(snapshot_id: int, operation: str, summary: dict[str, str]) -> Commit:
    """A snapshot's :class:`Commit` from its operation and summary."""
    def position(name: str) -> int | None:
        return int(summary[name], 16) if summary.get(name) else None  # 16 hex digits (hex16)

    return Commit(snapshot_id, summary.get(SNAPSHOT_BATCH), position(SNAPSHOT_LSN), position(SNAPSHOT_FROM_LSN),
                  same_rows=operation == "replace" and not summary.get(SNAPSHOT_BATCH))


def snapshot_at(history: list[Commit], lsn: int, state_batch: str | None, state_position: int) -> int | None:
    """The snapshot of ``history`` (the current snapshot's ancestry, oldest first) that holds the
    source exactly at ``lsn``, given the state table's row of the table; None when none does.

    A commit holds every LSN from its own position to where the next (not a compaction) begins;
    the newest one up to the state's position, once the state records its batch."""
    groups: list[tuple[Commit, int]] = []  # a commit, and its newest snapshot with the same rows
    for commit in history:
        if commit.same_rows and groups:
            groups[-1] = (groups[-1][0], commit.snapshot_id)
        else:
            groups.append((commit if not commit.same_rows else Commit(commit.snapshot_id, None, None, None),
                           commit.snapshot_id))
    for index in range(len(groups) - 1, -1, -1):
        commit, newest = groups[index]
        if commit.lsn is None or commit.lsn > lsn:
            continue
        if index == len(groups) - 1:
            holds = commit.batch is not None and commit.batch == state_batch and lsn <= state_position
        else:
            after = groups[index + 1][0].from_lsn
            holds = after is not None and lsn <= after
        if holds:
            return newest
    return None


def consistent_cut(pipeline: str, config: IcebergConfig | None = None, *, lsn: str | int | Lsn | None = None,
                   catalog=None) -> Cut:
    """For every table of ``pipeline``, the snapshot holding exactly the source at ``lsn``.

    :param pipeline: the pipeline's name (its rows of ``_pglogical_state``).
    :param config: the lakehouse the apply writes (its namespace, and its catalog unless ``catalog``).
    :param lsn: a source commit LSN (``X/Y``, 16 hex digits or an int), for instance a batch's end;
        default: the newest LSN every table holds (the lowest position the state table records).
    :param catalog: a pyiceberg catalog to load the tables from; default one built from ``config``
        (a Hadoop warehouse, or a REST catalog's uri). Glue, JDBC and Hive: pass a pyiceberg catalog.
    :raises NoConsistentCut: a table has no snapshot holding ``lsn`` (a position it has not reached,
        one whose snapshots were expired, or one inside a batch of its own), naming it.
    """
    from airflow_provider_pglogical.lakehouse.iceberg_readers import load_tables, state_rows

    config = config or IcebergConfig()
    load = load_tables(config, catalog)
    states = state_rows(load(STATE_TABLE), pipeline)
    if not states:
        raise NoConsistentCut(f"pipeline {pipeline!r} has no rows in {config.namespace}.{STATE_TABLE}: "
                              "no apply has recorded a table yet; run the pipeline's apply first")
    at = Lsn.parse(lsn).value if lsn is not None else min(state.position for state in states.values())
    tables, problems = {}, []
    for source, state in sorted(states.items()):
        table = load(state.target)
        snapshot = snapshot_at(history_of(table), at, state.last_batch, state.position)
        if snapshot is None:
            problems.append(f"{source} (Iceberg table {state.target}, at {Lsn(state.position)})")
        else:
            tables[source] = TableCut(source, state.target, snapshot)
    if problems:
        raise NoConsistentCut(
            f"pipeline {pipeline!r}: no snapshot holds the source exactly at LSN {Lsn(at)} for "
            f"{', '.join(problems)}. Ask for an LSN a batch ended on, no later than the lowest position "
            "(lsn=None takes it), and no older than the oldest snapshot housekeeping kept (expire_snapshots)")
    return Cut(pipeline, Lsn(at), tables)


def history_of(table) -> list[Commit]:
    """A pyiceberg table's current ancestry as :class:`Commit` values, oldest first."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    if current is None:
        return []
    commits = []
    for snapshot in ancestors_of(current, table.metadata):
        summary = snapshot.summary
        operation = summary.operation.value if summary is not None else ""
        properties = dict(summary.additional_properties) if summary is not None else {}
        commits.append(commit_of(snapshot.snapshot_id, operation, properties))
    return commits[::-1]
