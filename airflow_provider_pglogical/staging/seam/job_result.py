"""Where a Spark job leaves its result, and the typed error it leaves when it fails (standard library only).

The job (``spark/jobs/apply_changes.py``, ``spark/jobs/verify_tables.py``) writes its summary with Spark's
Hadoop FileSystem to the URI given in the Spark property ``contract.RESULT_CONF`` (first to a
temporary name, then renamed), so the result reaches the task in every deploy mode: the driver's
stdout, which YARN and Kubernetes cluster modes never hand back to ``spark-submit``, is not used.

A job that fails writes the same file with an ``error`` (:class:`JobError`): its own exception's
class, message and fix, and whether a retry can help. The task raises that error as its own
(``operators/_job_results.py``) instead of the Spark provider's "Cannot execute: spark-submit …",
so the user reads the job's words and Airflow does not retry what no retry can fix. This module
ships in the jobs' bundle, so both sides read and write one definition.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from airflow_provider_pglogical.staging.contract import APPLY_LEASE_HELD

#: ``JobError.kind`` of an error the job raised for input it refuses (``spark/common/errors.ApplyError``)
REFUSED = "refused"
#: ``JobError.kind``: another apply of the pipeline holds the lease; nothing was written (retry later)
LEASE_HELD = APPLY_LEASE_HELD
#: ``JobError.kind`` of any other failure inside the job (a lost executor, a catalog outage, a bug)
FAILED = "failed"
#: the longest message a result carries (a Java stack trace is the log's, not the task's)
MAX_MESSAGE = 4000


@dataclasses.dataclass(frozen=True)
class JobError:
    """A Spark job's own error, as the task raises it.

    :param kind: :data:`REFUSED`, :data:`LEASE_HELD` or :data:`FAILED`.
    :param error_class: the exception's class in the job (``ApplyError``, ``Py4JJavaError``, …).
    :param message: its message: the object, the problem and (for a refusal) the fix.
    :param fix: the fix on its own, when the job knows one.
    :param permanent: retrying the same task cannot help (Airflow must not retry it).
    :param lease: for :data:`LEASE_HELD`, what the lease's holder recorded (holder, expires_at, …).
    """

    kind: str
    error_class: str
    message: str
    fix: str | None = None
    permanent: bool = False
    lease: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``error`` member of a result file."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> JobError:
        """Read an ``error`` member; one written before the error was typed (``kind`` and ``message``
        only) reads as a retryable error of class ``unknown``."""
        return cls(kind=str(value.get("kind") or FAILED), error_class=str(value.get("error_class") or "unknown"),
                   message=str(value.get("message") or ""), fix=value.get("fix"),
                   permanent=bool(value.get("permanent", False)), lease=value.get("lease"))


def result_uri(staging_root: str, pipeline: str, job: str) -> str:
    """A fresh result location for one run of ``job``: ``<root>/<pipeline>/_results/<job>-<uuid>.json``.

    :param staging_root: the staging root as Spark reads it (``file:///…``, ``s3a://…``).
    """
    return f"{str(staging_root).rstrip('/')}/{pipeline}/_results/{job}-{uuid.uuid4().hex}.json"


def short_message(text: str) -> str:
    """``text`` cut to :data:`MAX_MESSAGE` characters (a result is not a log)."""
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
