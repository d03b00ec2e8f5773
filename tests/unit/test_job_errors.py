"""A job's error as its result file carries it (``staging/seam/job_result.JobError``), and as the task raises it."""

from __future__ import annotations

import json

import pytest

from airflow_provider_pglogical.exceptions import SparkJobError
from airflow_provider_pglogical.operators._errors import PermanentError, fail_permanent_errors
from airflow_provider_pglogical.spark.apply.lease import ApplyLeaseHeld
from airflow_provider_pglogical.spark.common.errors import ApplyError, job_error
from airflow_provider_pglogical.staging.seam.job_result import FAILED, LEASE_HELD, MAX_MESSAGE, REFUSED, JobError


def test_a_refusal_is_permanent_and_carries_its_fix_through_json():
    error = job_error(ApplyError("table t: gap. Nothing was applied", fix="run a backfill"))
    assert error == JobError(REFUSED, "ApplyError", "table t: gap. Nothing was applied", "run a backfill", True)
    assert JobError.from_json(json.loads(json.dumps(error.to_json()))) == error


def test_a_held_lease_and_an_unexpected_failure_are_retried():
    held = job_error(ApplyLeaseHeld("another apply is running", {"holder": "task a"}))
    assert (held.kind, held.permanent, held.lease) == (LEASE_HELD, False, {"holder": "task a"})
    lost = job_error(ApplyError("lease expired", permanent=False))
    assert (lost.kind, lost.permanent) == (REFUSED, False)
    crashed = job_error(MemoryError("x" * (MAX_MESSAGE * 2)))
    assert (crashed.kind, crashed.error_class, crashed.permanent) == (FAILED, "MemoryError", False)
    assert len(crashed.message) == MAX_MESSAGE


def test_an_older_jobs_error_reads_as_retryable():
    old = JobError.from_json({"kind": LEASE_HELD, "message": "held", "lease": {"holder": "x"}})
    assert (old.kind, old.error_class, old.permanent, old.lease) == (LEASE_HELD, "unknown", False, {"holder": "x"})


@pytest.mark.parametrize("permanent", [True, False])
def test_the_task_raises_the_jobs_error_failing_without_retry_only_when_permanent(permanent):
    error = JobError(REFUSED, "ApplyError", "table t is owned by q", "table_map", permanent)
    with pytest.raises(SparkJobError) as raised, fail_permanent_errors():
        raise SparkJobError.of("apply", error)
    assert isinstance(raised.value, PermanentError) is permanent
    assert str(raised.value) == f"the apply job {'refused' if permanent else 'failed'} with ApplyError: table t is owned by q"
    assert (raised.value.error_class, raised.value.fix, raised.value.job) == ("ApplyError", "table_map", "apply")
