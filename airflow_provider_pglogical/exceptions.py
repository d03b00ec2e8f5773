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

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"the publisher is not ready for logical replication ({len(problems)} problem(s)):\n{lines}")
