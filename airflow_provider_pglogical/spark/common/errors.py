"""The one error a job raises for input it refuses: the job writes its message to its result
file, and the operator turns it into an ``AirflowFailException``."""

from __future__ import annotations


class ApplyError(RuntimeError):
    """A batch cannot be applied as staged; the message names the batch, the table and the fix."""
