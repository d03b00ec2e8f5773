"""Where a Spark job leaves its result: a small JSON file under staging, read through ObjectStoragePath.

The job (``spark/jobs/apply_changes.py``, ``spark/jobs/verify_tables.py``) writes its summary with Spark's
Hadoop FileSystem to the URI given in the Spark property ``contract.RESULT_CONF`` (first to a
temporary name, then renamed), so the result reaches the task in every deploy mode: the driver's
stdout, which YARN and Kubernetes cluster modes never hand back to ``spark-submit``, is not used.
"""

from __future__ import annotations

import json
import uuid

from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import PgLogicalError


#: Hadoop FileSystem schemes and the fsspec protocol that reads the same objects
_HADOOP_SCHEMES = {"s3a": "s3", "s3n": "s3"}


class JobResultMissing(PgLogicalError):
    """The Spark job ended without leaving its result file."""


def result_uri(staging_root: str, pipeline: str, job: str) -> str:
    """A fresh result location for one run of ``job``: ``<root>/<pipeline>/_results/<job>-<uuid>.json``.

    :param staging_root: the staging root as Spark reads it (``file:///…``, ``s3a://…``).
    """
    return f"{str(staging_root).rstrip('/')}/{pipeline}/_results/{job}-{uuid.uuid4().hex}.json"


def storage_path(uri: str) -> ObjectStoragePath:
    """The ObjectStoragePath of a Hadoop URI (``s3a://b/k`` is ``s3://b/k``)."""
    scheme, sep, rest = uri.partition("://")
    if sep and scheme in _HADOOP_SCHEMES:
        uri = f"{_HADOOP_SCHEMES[scheme]}://{rest}"
    return ObjectStoragePath(uri)


def read_result(uri: str, *, job: str, remove: bool = True) -> dict:
    """Read (and by default remove) the result file the job wrote at ``uri``.

    :raises JobResultMissing: the job finished without writing it (it died, or is an older job).
    """
    path = storage_path(uri)
    if not path.exists():
        raise JobResultMissing(
            f"the {job} job ended without writing its result to {uri}: see the spark-submit log above "
            "(the job may have been killed, or the driver cannot write to the staging root)"
        )
    with path.open("rb") as fh:
        result = json.loads(fh.read().decode())
    if remove:
        path.unlink()
    return result


def job_error(uri: str) -> dict | None:
    """The ``error`` a failed job left in its result file at ``uri`` (``kind``, ``message``, …);
    None when it left no result, or one without an error. The file is removed either way."""
    path = storage_path(uri)
    if not path.exists():
        return None
    return read_result(uri, job="failed").get("error")
