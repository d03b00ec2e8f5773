"""Errors raised by the provider. Each message names the object, the problem and the fix."""

from __future__ import annotations


class PgLogicalError(Exception):
    """Base class of the provider's errors."""


class PublicationError(PgLogicalError):
    """A publication is missing, empty, or its tables cannot be resolved consistently."""


class ColumnListConflict(PublicationError):
    """A table is published with different column lists by the publications of one pipeline."""


class SlotError(PgLogicalError):
    """A replication slot is missing, in use, invalidated or of the wrong kind."""


class SubscriptionError(PgLogicalError):
    """A subscription could not be created, changed or dropped."""


class PublisherCheckError(PgLogicalError):
    """``check_publisher`` found problems; ``problems`` lists each one with its fix."""

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


class PipelineStateError(PgLogicalError):
    """The pipeline's record forbids the run: no committed snapshot yet, another publication set,
    another slot, or a slot the pipeline cannot prove it created."""


class SlotLostError(SlotError):
    """The pipeline's slot was invalidated or dropped: the changes since its last batch are gone.

    Permanent: retrying cannot bring them back. The fix is a resync (``on_slot_lost="resync"``).
    """


class ConcurrentRunError(SlotError):
    """Another pull, initial sync or backfill of the same slot holds the pipeline's lock."""


class UnrepresentableValue(PgLogicalError):
    """A PostgreSQL value has no exact form in its column's lakehouse type (``±infinity``, a
    ``numeric`` NaN, a timestamp past Spark's range, an array with non-default bounds, …).

    Permanent: retrying reads the same value again. ``fix`` is the ``type_overrides`` entry that
    stages the column as PostgreSQL's exact text output instead.
    """

    permanent = True

    def __init__(self, table: str, column: str, value: str, reason: str, lakehouse_type: str) -> None:
        self.table, self.column, self.value, self.reason = table, column, value, reason
        self.override = {f"{table}.{column}": "string"}
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
