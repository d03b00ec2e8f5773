"""Which steps bring each table from what the lakehouse holds to the end of the staged batches.

Pure functions over batch names and manifests: no Spark, so the unit tests cover every ordering
(late backfills, superseded snapshots, partly applied batches) in milliseconds; and the proof
that the chain of change batches has no hole (invariant 12), from the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_provider_pglogical.spark.common.batch import Batch  # noqa: F401 (plan.Batch: the steps' batches)
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.common.identifiers import quote, sql_literal
from airflow_provider_pglogical.staging.contract import (
    MANIFEST,
    SNAPSHOT_BATCH,
    SNAPSHOT_FROM_LSN,
    SNAPSHOT_LSN,
    SNAPSHOT_PIPELINE,
    format_lsn,
    hex16,
    parse_lsn,
)
from airflow_provider_pglogical.staging.seam.manifests import SnapshotScope


@dataclass
class TableState:
    """What the lakehouse holds of one source table (a row of the state table)."""

    target: str
    position: int = 0
    snapshots: set = field(default_factory=set)
    last_batch: str | None = None


@dataclass
class Step:
    kind: str  # "snapshot" | "changes"
    batch: Batch
    #: rows with ``_commit_lsn`` >= this are applied (changes); the snapshot's position (snapshot)
    position: int
    #: a ranged snapshot of a keyless table: the change batches whose rows in [position, through)
    #: are folded into the range (the rest of the table is at ``through`` already), and the
    #: position the step brings the table to
    window: list[Batch] | None = None
    through: int | None = None
    #: the step leaves the table at one source position: False while a keyed table's ranged
    #: snapshot catches up (the range is at the step's position, the other rows further on)
    cut: bool = True

    def end(self) -> int:
        """The position the table holds once the step is applied."""
        if self.kind == "changes":
            return self.batch.end
        return self.position if self.through is None else self.through

    def commit_properties(self, pipeline: str) -> dict[str, str]:
        """What each snapshot of the step records in its summary (``SNAPSHOT_*``)."""
        properties = {SNAPSHOT_PIPELINE: pipeline, SNAPSHOT_BATCH: self.batch.name,
                      SNAPSHOT_FROM_LSN: hex16(self.position if self.kind == "snapshot"
                                               else max(self.position, self.batch.start))}
        if self.cut:
            properties[SNAPSHOT_LSN] = hex16(self.end())
        return properties


def range_predicate(scope: SnapshotScope, batch: str, table: str) -> str | None:
    """The rows a ranged snapshot replaces, as Spark SQL over the target's columns; None = all rows.

    ``key_range = {"column": c, "start": a, "end": b}`` (what a ranged backfill writes) means
    ``a <= c < b``; a null bound is open. A snapshot copied with a PostgreSQL ``extra_where`` and
    no key range is refused: Spark does not evaluate PostgreSQL's SQL.
    """
    spec = scope.key_range
    if spec is not None:
        parts = []
        for bound, operator, value in (("start", ">=", spec.start), ("end", "<", spec.end)):
            if value is not None:
                try:
                    literal = sql_literal(value)
                except TypeError as error:
                    raise ApplyError(f"batch {batch}, table {table}: key_range {bound}: {error}") from None
                parts.append(f"{quote(spec.column)} {operator} {literal}")
        return " AND ".join(parts) or "true"
    if scope.extra_where:
        raise ApplyError(
            f"batch {batch}, table {table}: a ranged snapshot copied with a PostgreSQL filter needs the "
            "range the lakehouse must replace as details.key_range; Spark does not evaluate PostgreSQL's "
            "SQL. Re-run the backfill with key_range, or a backfill of the whole table"
        )
    return None


def is_ranged(batch: Batch, source: str) -> bool:
    return batch.manifest.snapshot_scope(source).ranged


def loading_in_chunks(batch: Batch, source: str) -> bool:
    """The snapshot is a chunked load's empty start or one of its chunks but the table's last: the
    table holds the source at no single position until the last chunk is applied."""
    scope = batch.manifest.snapshot_scope(source)
    if not scope.chunked_load:
        return False
    return scope.chunked_load.empty_start or (scope.key_range is not None and scope.key_range.end is not None)


def plan_table(source: str, batches: list[Batch], state: TableState) -> tuple[list[Step], list[str]]:
    """The steps that bring one table from ``state`` to the end of ``batches`` (name order).

    Returns the steps and the pending snapshot batches made irrelevant by a later full snapshot.
    """
    mine = [batch for batch in batches if source in batch.manifest.tables]
    pending_full = [
        index for index, batch in enumerate(mine)
        if batch.kind == "snapshot" and batch.name not in state.snapshots and not is_ranged(batch, source)
    ]
    first = pending_full[-1] if pending_full else 0
    superseded = [b.name for b in mine[:first] if b.kind == "snapshot" and b.name not in state.snapshots]
    steps: list[Step] = []
    position = state.position
    mixed_until = 0  # a keyed ranged snapshot: the other rows are at the table's position before it
    loading = False  # a chunked load's chunks are still to come: no step leaves the table at a cut
    for index in range(first, len(mine)):
        batch = mine[index]
        if batch.kind == "snapshot":
            if batch.name in state.snapshots:
                continue
            ranged = is_ranged(batch, source)
            # the other rows are where the steps before it left them (the lakehouse's position at the first)
            mixed_until = max(mixed_until, state.position, position) if ranged else 0
            if ranged and batch.manifest.tables[source].is_multiset:
                # Re-applying changes from the snapshot would count the rows outside the range
                # twice (a multiset has no key to make it idempotent): the step folds the range's
                # changes up to where the rest of the table is into the range, in one commit.
                through = max(position, batch.start)
                window = [b for b in mine if b.kind == "changes" and b.end > batch.start and b.start < through]
                steps.append(Step("snapshot", batch, batch.start, window=window, through=through))
                position = through
                continue
            loading = loading_in_chunks(batch, source)
            steps.append(Step("snapshot", batch, batch.start, cut=batch.start >= mixed_until and not loading))
            position = batch.start
            # change batches named before the snapshot that hold commits at or after it
            for earlier in mine[:index]:
                if earlier.kind == "changes" and earlier.end > position:
                    steps.append(Step("changes", earlier, position, cut=earlier.end >= mixed_until and not loading))
                    position = earlier.end
        elif batch.end > position:
            steps.append(Step("changes", batch, position, cut=batch.end >= mixed_until and not loading))
            position = batch.end
    return steps, superseded


def batches_that_matter(batches: list[Batch], states: dict[str, TableState]) -> list[Batch]:
    """The batches whose manifests a run must read: snapshots no table has applied yet, and change
    batches ending after the lowest position or after a pending snapshot (a late backfill)."""
    applied_anywhere = set().union(*(s.snapshots for s in states.values())) if states else set()
    pending = [b.start for b in batches if b.kind == "snapshot" and b.name not in applied_anywhere]
    floor = min([s.position for s in states.values()] + pending) if states else 0
    return [b for b in batches if (b.kind == "snapshot" and b.name not in applied_anywhere) or b.end > floor]


def caught_up(plans: dict[str, list[Step]], states: dict[str, TableState], batches: list[Batch]) -> dict[str, int]:
    """Loaded tables no step moves, with the end of the newest change batch when it is past their
    position: their new position. No committed batch past their position holds them (their plan
    is empty), and the chain of change batches from there is proven whole (``prove_staging``), so
    they have no change before that end. Without this a table no change touches keeps its
    position, and every later run reads every manifest since (``batches_that_matter``)."""
    end = max((batch.end for batch in batches if batch.kind == "changes"), default=0)
    return {source: end for source, steps in plans.items()
            if not steps and source in states and (states[source].position or states[source].snapshots)
            and states[source].position < end}


# --- the chain of change batches (invariant 12) --------------------------------------------------

def chain_intervals(batches: list[Batch]) -> list[tuple[Batch, int, int]]:
    """Each committed change batch (name order) with the WAL range ``[from, end)`` it vouches for:
    from the ``previous_end`` its manifest records (the slot decoded nothing between there and its
    start), else, for a batch staged before that was recorded, from the end of the change batch
    before it (0 for the first): an old chain is taken on trust, as before. A batch whose manifest
    was not read (it ends before anything a table needs) vouches for its own range only."""
    out, before = [], 0
    for batch in batches:
        if batch.kind != "changes":
            continue
        recorded = batch.manifest.previous_end if batch.manifest else None
        start = parse_lsn(recorded) if recorded else (before if batch.manifest else batch.start)
        out.append((batch, min(start, batch.start), batch.end))
        before = batch.end
    return out


def merged(intervals: list[tuple[int, int]]) -> list[list[int]]:
    """``intervals`` as the fewest ``[from, end)`` ranges covering the same positions."""
    out: list[list[int]] = []
    for low, high in sorted(intervals):
        if out and low <= out[-1][1]:
            out[-1][1] = max(out[-1][1], high)
        else:
            out.append([low, high])
    return out


def uncovered(covered: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[start, end)`` that no range of ``covered`` holds."""
    holes, at = [], start
    for low, high in merged(covered):
        if at >= end:
            break
        if low > at:
            holes.append((at, min(low, end)))
        at = max(at, high)
    if at < end:
        holes.append((at, end))
    return holes


def needed_from(steps: list[Step], state: TableState) -> int:
    """The position from which a table needs every change: its first step's (a snapshot's
    position, or where its changes continue), else where it stands."""
    return min((step.position for step in steps), default=state.position)


def chain_holes(pipeline: str, batches: list[Batch], needed: dict[str, int], removed: list[list[int]],
                staged_through: int | None, uncommitted: list[Batch]) -> list[str]:
    """What breaks the chain of change batches between each table's needed position and the end
    of staging (the newest change batch, or the end the pull recorded, whichever is later), each
    with the batches around the hole and the fix.

    :param removed: the ranges of the change batches staging retention removed (``_retention.json``).
    :param uncommitted: batch directories without a manifest: named where they lie in a hole.
    """
    chain = chain_intervals(batches)
    end = max([high for _batch, _low, high in chain] + [staged_through or 0])
    covered = [(low, high) for _batch, low, high in chain] + [(low, high) for low, high in removed]
    problems = []
    for low, high in uncovered(covered, min(needed.values(), default=end), end):
        tables = sorted(source for source, position in needed.items() if position < high)
        if not tables:
            continue
        before = [batch.name for batch, _low, batch_end in chain if batch_end <= low]
        after = [batch.name for batch, batch_low, _high in chain if batch_low >= high]
        where = ", ".join(filter(None, [
            f"after batch {before[-1]}" if before else None,
            f"before batch {after[0]}" if after else
            f"the last pull recorded change batches up to LSN {format_lsn(high)}",
        ]))
        unfinished = [b.name for b in uncommitted if b.kind == "changes" and b.start < high and b.end > low]
        if unfinished:
            where += f"; batch directory {', '.join(unfinished)} has no {MANIFEST} (deleted or never committed)"
        problems.append(
            f"pipeline {pipeline!r}: no committed change batch covers LSN {format_lsn(low)} to {format_lsn(high)} "
            f"({where}), and the slot has moved past those changes, so applying the batches after them would leave "
            f"{', '.join(tables)} silently wrong. Restore the missing batch if you have a copy, or run a backfill of "
            f"the affected tables (PgBackfillOperator(tables={tables!r})): its snapshot supersedes the hole"
        )
    return problems


def files_read(plans: dict[str, list[Step]]) -> dict[str, tuple[Batch, set[str]]]:
    """``{batch name: (batch, the tables whose files the steps read)}``."""
    out: dict[str, tuple[Batch, set[str]]] = {}
    for source, steps in plans.items():
        for step in steps:
            for batch in [step.batch, *(step.window or [])]:
                out.setdefault(batch.name, (batch, set()))[1].add(source)
    return out
