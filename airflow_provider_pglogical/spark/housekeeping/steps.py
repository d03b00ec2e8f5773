"""What the maintenance job does to each Iceberg table: the steps, their thresholds, their ``CALL``s.

Pure (no Spark, no Airflow): the operator builds a :class:`Housekeeping` to check its arguments
when the DAG is parsed and to write the job's command line; the job parses that command line
back and runs :func:`procedure_calls`. Argument names are those of Iceberg's Spark procedures (1.9 and 1.10 alike).
"""

from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import asdict, dataclass

from airflow_provider_pglogical.spark.common.identifiers import quote, sql_string

#: how many tables the maintenance job keeps at once (each table's steps in order)
DEFAULT_CONCURRENCY = 4

#: Iceberg's ``remove_orphan_files`` refuses a cut-off younger than a day: a file written by a
#: commit still in flight is not referenced yet, and removing it would corrupt that table
MIN_ORPHAN_AGE_HOURS = 24.0

#: the steps in the order they run: compaction first (it frees the most), then the metadata, then
#: expiry (it deletes what compaction and the manifest rewrite replaced), orphans last
STEPS = ("rewrite_data_files", "rewrite_position_delete_files", "rewrite_manifests", "expire_snapshots",
         "remove_orphan_files")


class HousekeepingError(ValueError):
    """A maintenance option is out of range; the message names the option (also ``.option``) and the fix."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"{option} {problem}")
        self.option = option


@dataclass(frozen=True)
class Housekeeping:
    """The steps to run and their thresholds; the defaults hold a table's file count flat.

    :param compact_data_files: ``rewrite_data_files``: bin-pack small data files.
    :param min_input_files: a group of small data files is compacted once it has this many.
    :param delete_file_threshold: a data file with this many delete files against it is rewritten
        with its merge-on-read deletes applied, whatever its size. Iceberg's Spark writers (1.9, 1.10)
        keep one delete file per data file, so 1 folds every delete into the data at each run.
    :param compact_delete_files: ``rewrite_position_delete_files`` on every position delete file:
        merge them and drop the deletes of data files that are gone.
    :param rewrite_manifests: ``rewrite_manifests``: regroup the small manifests every commit adds.
    :param expire_snapshots: ``expire_snapshots``: forget old snapshots and delete the files only they used.
    :param older_than_hours: expire snapshots older than this (time travel stays possible within it).
    :param retain_last: always keep this many snapshots.
    :param remove_orphan_files: ``remove_orphan_files``: delete files under the table's location
        that no snapshot references (left by failed writes, old metadata files).
    :param orphan_older_than_hours: only files older than this are orphans; at least 24.
    """

    compact_data_files: bool = True
    min_input_files: int = 5
    delete_file_threshold: int = 1
    compact_delete_files: bool = True
    rewrite_manifests: bool = True
    expire_snapshots: bool = True
    older_than_hours: float = 24.0
    retain_last: int = 5
    remove_orphan_files: bool = True
    orphan_older_than_hours: float = 72.0

    def __post_init__(self) -> None:
        for name in ("min_input_files", "delete_file_threshold", "retain_last"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HousekeepingError(name, f"must be a whole number, 1 or more (got {value!r})")
        if not _number(self.older_than_hours) or self.older_than_hours < 0:
            raise HousekeepingError("older_than_hours",
                                    f"must be a number of hours, 0 or more (got {self.older_than_hours!r})")
        hours = self.orphan_older_than_hours
        if self.remove_orphan_files and (not _number(hours) or hours < MIN_ORPHAN_AGE_HOURS):
            raise HousekeepingError(
                "orphan_older_than_hours",
                f"must be at least {MIN_ORPHAN_AGE_HOURS:g} hours (got {hours!r}): a younger file may belong to a "
                "write that has not committed yet, and removing it would corrupt the table (Iceberg's "
                "remove_orphan_files refuses it too); raise it, or switch the step off",
            )

    def steps(self) -> list[str]:
        """The procedures switched on, in the order they run."""
        switches = {"rewrite_data_files": self.compact_data_files,
                    "rewrite_position_delete_files": self.compact_delete_files,
                    "rewrite_manifests": self.rewrite_manifests, "expire_snapshots": self.expire_snapshots,
                    "remove_orphan_files": self.remove_orphan_files}
        return [step for step in STEPS if switches[step]]

    def args(self) -> list[str]:
        """The job's command line for these settings (every value, so the job's defaults never matter)."""
        args: list[str] = []
        for name, value in asdict(self).items():
            option = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(option if value else "--no-" + option[2:])
            else:
                args += [option, str(value)]
        return args

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Declare one option per field on the job's parser, with the field's default."""
        defaults = cls()
        for name, value in asdict(defaults).items():
            option = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                parser.add_argument(option, dest=name, action=argparse.BooleanOptionalAction, default=value)
            else:
                parser.add_argument(option, dest=name, type=type(value), default=value)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Housekeeping:
        return cls(**{name: getattr(args, name) for name in asdict(cls())})


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def timestamp(moment: dt.datetime) -> str:
    """A Spark SQL timestamp literal with its zone, so the session time zone cannot shift it."""
    return "TIMESTAMP " + sql_string(moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f") + "Z")


def procedure_call(step: str, catalog: str, table: str, housekeeping: Housekeeping, now: dt.datetime,
                   keep_from: dt.datetime | None = None) -> str:
    """The ``CALL`` statement of one step on one table (``namespace.table``, quoted).

    :param now: the time the cut-offs count back from: take it just before the call, so that
        ``older_than_hours=0`` expires the snapshots the compaction steps have just replaced.
    :param keep_from: ``expire_snapshots`` keeps every snapshot committed at or after this moment,
        whatever ``older_than_hours`` says (``pipeline_commits.newest_pipeline_commit``).
    """
    system = f"{quote(catalog)}.system"
    target = sql_string(table)
    if step == "rewrite_data_files":
        return (f"CALL {system}.rewrite_data_files(table => {target}, options => map("
                f"'min-input-files', {sql_string(str(housekeeping.min_input_files))}, "
                f"'delete-file-threshold', {sql_string(str(housekeeping.delete_file_threshold))}, "
                "'remove-dangling-deletes', 'true'))")
    if step == "rewrite_position_delete_files":
        # all of them (they are small): a rewrite drops the rows of data files that are gone, which
        # Iceberg kept (seen on 1.9) in an unpartitioned table after the data compaction replaced their
        # files. Iceberg 1.10 fails it on a table with a list or map column: the job skips it there
        # (position_delete_rewrite.py)
        return (f"CALL {system}.rewrite_position_delete_files(table => {target}, "
                "options => map('rewrite-all', 'true'))")
    if step == "rewrite_manifests":
        return f"CALL {system}.rewrite_manifests(table => {target})"
    if step == "expire_snapshots":
        cut = now - dt.timedelta(hours=housekeeping.older_than_hours)
        if keep_from is not None:  # a snapshot is expired when it is older than the cut: 1 ms before keeps it
            cut = min(cut, keep_from - dt.timedelta(milliseconds=1))
        return (f"CALL {system}.expire_snapshots(table => {target}, "
                f"older_than => {timestamp(cut)}, "
                f"retain_last => {int(housekeeping.retain_last)})")
    if step == "remove_orphan_files":
        return (f"CALL {system}.remove_orphan_files(table => {target}, "
                f"older_than => {timestamp(now - dt.timedelta(hours=housekeeping.orphan_older_than_hours))})")
    raise ValueError(f"unknown maintenance step {step!r}; the steps are {', '.join(STEPS)}")


def procedure_calls(catalog: str, table: str, housekeeping: Housekeeping, now: dt.datetime) -> list[tuple[str, str]]:
    """``(step, CALL statement)`` of every switched-on step for one table, in order."""
    return [(step, procedure_call(step, catalog, table, housekeeping, now)) for step in housekeeping.steps()]
