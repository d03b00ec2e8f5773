"""Turn the provider's permanent errors into ``AirflowFailException``, so Airflow does not retry them."""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

try:
    from airflow.sdk.exceptions import AirflowFailException
except ImportError:  # Task SDK 1.0 (Airflow 3.0): the class lives in airflow.exceptions
    from airflow.exceptions import AirflowFailException

from airflow_provider_pglogical.exceptions import PgLogicalError


class PermanentError(AirflowFailException):
    """Base of the permanent twins of the provider's errors: ``PermanentSlotError`` is both an
    ``AirflowFailException`` (the task fails without retry) and a ``SlotError`` (``except SlotError``
    still catches it). The message is the original's; the original is ``__cause__``."""


@functools.lru_cache(maxsize=None)
def permanent_class(cls: type[PgLogicalError]) -> type:
    """The class that is both ``cls`` and :class:`PermanentError`."""
    return type(f"Permanent{cls.__name__}", (PermanentError, cls), {"__module__": cls.__module__})


def as_permanent(err: PgLogicalError) -> PermanentError:
    """A copy of ``err`` (same message and attributes) that Airflow does not retry."""
    cls = permanent_class(type(err))
    twin = cls.__new__(cls, *err.args)
    twin.args = err.args
    twin.__dict__.update(err.__dict__)
    return twin


@contextlib.contextmanager
def fail_permanent_errors() -> Iterator[None]:
    """Re-raise a permanent :class:`PgLogicalError` as its :class:`PermanentError` twin
    (``AirflowFailException``); every other error passes unchanged and is retried as usual."""
    try:
        yield
    except PermanentError:
        raise
    except PgLogicalError as err:
        if err.permanent:
            raise as_permanent(err) from err
        raise
