"""Permanent provider errors fail the task without retries (a retry would meet the same value)."""

from __future__ import annotations

import contextlib
from typing import Iterator

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.exceptions import PgLogicalError


@contextlib.contextmanager
def permanent_errors_fail_the_task() -> Iterator[None]:
    """Re-raise a ``PgLogicalError`` whose class is ``permanent`` as ``AirflowFailException``."""
    try:
        yield
    except PgLogicalError as err:
        if getattr(err, "permanent", False):
            raise AirflowFailException(f"{err} [permanent: retrying cannot help]") from err
        raise
