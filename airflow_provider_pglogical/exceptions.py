"""Errors raised by the provider. Each message names the object, the problem and the fix.

Each error says whether it is *permanent*: retrying the same task cannot fix it (a bad argument,
an invalidated slot, a lakehouse that differs from its source). Operators turn permanent errors
into ``AirflowFailException`` so Airflow does not retry them; the others (a slot held by another
consumer, a lost connection) are left to Airflow's retries.
"""

from __future__ import annotations

from airflow_provider_pglogical.staging.contract import override_key
from airflow_provider_pglogical.staging.seam.job_result import JobError


class PgLogicalError(Exception):
    """Base class of the provider's errors.

    :param permanent: override the class's :attr:`permanent` for this one error.
    """

    #: retrying the task cannot help; the class default, overridable per error
    permanent: bool = False

    def __init__(self, *args, permanent: bool | None = None) -> None:
        super().__init__(*args)
        if permanent is not None:
            self.permanent = permanent


class PublicationError(PgLogicalError):
    """A publication is missing, empty, or its tables cannot be resolved consistently."""

    permanent = True


class ColumnListConflict(PublicationError):
    """A table is published with different column lists by the publications of one pipeline."""


class SlotError(PgLogicalError):
    """A replication slot is missing, in use, invalidated or of the wrong kind.

    Transient by default (a slot in use frees up); missing, invalidated or foreign slots are
    raised with ``permanent=True``.
    """


class SubscriptionError(PgLogicalError):
    """A subscription could not be created, changed or dropped."""

    permanent = True


class PublisherCheckError(PgLogicalError):
    """``check_publisher`` found problems; ``problems`` lists each one with its fix."""

    permanent = True

    def __init__(self, problems: list[str], rolled_back: str | None = None) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        undone = (f" Publication {rolled_back!r} was left exactly as it was before this run (the change was "
                  "rolled back)." if rolled_back else "")
        super().__init__(
            f"the publisher is not ready for logical replication ({len(problems)} problem(s)):\n{lines}\n{undone}".rstrip()
        )


class InvalidInputError(PgLogicalError, ValueError):
    """An argument is unusable (a name, a number, a path, an SQL fragment); found before any change."""

    permanent = True


class PipelineStateError(PgLogicalError):
    """The pipeline's record forbids the run: no committed snapshot yet, another publication set,
    another slot, or a slot the pipeline cannot prove it created."""

    permanent = True


class SlotLostError(SlotError):
    """The pipeline's slot was invalidated or dropped: the changes since its last batch are gone.

    Permanent: retrying cannot bring them back. The fix is a resync (``on_slot_lost="resync"``).
    """

    permanent = True


class ConcurrentRunError(SlotError):
    """Another pull, initial sync or backfill of the same slot holds the pipeline's lock."""

    permanent = False

class ConcurrentApplyError(PgLogicalError):
    """Another apply of the pipeline holds its lease (``spark/apply/lease.ApplyLease``); this one
    wrote nothing. Transient: Airflow's retry runs it once the other ends, or once a killed one's
    lease expired. ``lease`` is what the holder recorded (holder, taken_at, expires_at)."""

    permanent = False

    def __init__(self, message: str, lease: dict | None = None) -> None:
        super().__init__(message)
        self.lease = lease or {}
        self.fix = "max_active_tis_per_dag=1 on the apply task (or max_active_runs=1 on the DAG)"


class JobResultMissing(PgLogicalError):
    """The Spark job ended without leaving its result file (killed, or unable to write to staging)."""


class SparkJobError(PgLogicalError):
    """A Spark job's own error, raised by the task in its place (``staging/seam/job_result.JobError``):
    the job's class, message and fix, and whether a retry can help (``permanent``, per error).

    :param job: which job (``apply``, ``verify``).
    """

    def __init__(self, job: str, error_class: str, message: str, fix: str | None, permanent: bool) -> None:
        super().__init__(f"the {job} job refused with {error_class}: {message}" if permanent
                         else f"the {job} job failed with {error_class}: {message}", permanent=permanent)
        self.job, self.error_class, self.job_message, self.fix = job, error_class, message, fix

    @classmethod
    def of(cls, job: str, error: JobError) -> SparkJobError:
        """The task's error for the error ``job`` left in its result file."""
        return cls(job, error.error_class, error.message, error.fix, error.permanent)


class UnrepresentableValue(PgLogicalError):
    """A PostgreSQL value has no exact form in its column's lakehouse type (``±infinity``, a
    ``numeric`` NaN, a timestamp past Spark's range, an array with non-default bounds, …).

    Permanent: retrying reads the same value again. ``fix`` is the ``type_overrides`` entry that
    stages the column as PostgreSQL's exact text output instead.
    """

    permanent = True

    def __init__(self, table: str, column: str, value: str, reason: str, lakehouse_type: str) -> None:
        self.table, self.column, self.value, self.reason = table, column, value, reason
        self.override = {override_key(table, column): "string"}
        self.fix = f"type_overrides={self.override!r}"
        shown = value if len(value) <= 80 else value[:77] + "..."
        super().__init__(
            f"table {table}, column {column}: value {shown!r} cannot be stored exactly as {lakehouse_type} "
            f"({reason}). To stage this column as text (PostgreSQL's exact text output, a string column "
            f"in Iceberg), set {self.fix} on PgInitialSyncOperator, PgBackfillOperator and "
            "PgSlotPullOperator alike (if the Iceberg table exists already with another type for this "
            "column: drop it and run PgBackfillOperator for the table with the override; see docs/types.md)."
        )


class TypeOverrideError(PgLogicalError):
    """``type_overrides`` names a column that is not published, or a type that is not supported."""

    permanent = True


class DistributedCopyError(PgLogicalError):
    """A work unit of a snapshot copy run on Spark failed; the batch was not committed.

    Permanent when the unit's own error is (an unrepresentable value); a lost connection or
    executor is left to Airflow's retries, which start the snapshot over.
    """


class StagingFullError(PgLogicalError):
    """The staging area ran out of space (``ENOSPC``) while a batch was written; nothing was lost.

    Transient: the uncommitted files are removed and the slot was not advanced, so once space is
    freed a retry stages the same changes. ``path`` is where the write failed, ``free_bytes`` what
    its file system had left (None on an object store).
    """

    permanent = False

    def __init__(self, path: str, free_bytes: int | None, what: str) -> None:
        self.path, self.free_bytes = path, free_bytes
        free = "unknown free space" if free_bytes is None else f"{free_bytes:,} bytes free"
        super().__init__(
            f"no space left on the staging file system at {path} ({free}) while {what}: nothing was lost (the "
            "unfinished batch was removed and the slot was not advanced). Free space there (the apply removes "
            "applied batches after their retention), or give the pipeline a staging_root with more room; the "
            "next run stages the same changes"
        )
