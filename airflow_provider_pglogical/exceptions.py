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
