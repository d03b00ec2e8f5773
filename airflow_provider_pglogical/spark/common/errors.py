"""The one error a job raises for input it refuses, and how any error of a job becomes the typed
:class:`JobError` its result file carries (the operator raises it as the task's error:
``AirflowFailException`` when it is permanent)."""

from __future__ import annotations

from airflow_provider_pglogical.staging.seam.job_result import FAILED, LEASE_HELD, REFUSED, JobError, short_message


class ApplyError(RuntimeError):
    """A batch cannot be applied as staged; the message names the batch, the table and the fix.

    :param fix: the fix on its own, when it is one sentence the task can show apart.
    :param permanent: retrying the same task cannot help (the default: the input stays as it is);
        False for what another try may find gone (a lease lost, a concurrent commit).
    """

    #: the class default, overridable per error
    permanent: bool = True

    def __init__(self, message: str, *, fix: str | None = None, permanent: bool | None = None) -> None:
        super().__init__(message)
        self.fix = fix
        if permanent is not None:
            self.permanent = permanent


def job_error(error: BaseException) -> JobError:
    """What the task is told of ``error``, the exception that ended a job."""
    lease = getattr(error, "lease", None)
    if isinstance(error, ApplyError):
        return JobError(kind=LEASE_HELD if lease is not None else REFUSED, error_class=type(error).__name__,
                        message=short_message(str(error)), fix=error.fix, permanent=error.permanent, lease=lease)
    java = getattr(error, "java_exception", None)  # py4j: its str() starts with the call, not the cause
    message = str(java.toString()) if java is not None else f"{error}"
    return JobError(kind=FAILED, error_class=type(error).__name__, message=short_message(message), permanent=False)
