"""A staging root seen from both sides: Airflow's ``ObjectStoragePath`` and Spark's Hadoop FileSystem.

Every operator of a pipeline takes the same staging root, ``s3://<aws_conn_id>@<bucket>/<prefix>`` on
S3 (the connection in the URI, as Airflow documents for ``ObjectStoragePath``). The capture tasks
write through ``ObjectStoragePath`` with that connection; the apply job reads the same objects
through Hadoop's S3A as ``s3a://<bucket>/<prefix>`` (:func:`spark_uri`, the one place ``s3://``
becomes ``s3a://``), with the connection's keys in the private properties file, never on a command
line. A root whose file system is not installed, or an S3 root without a connection, is refused
before anything is written (:func:`check_staging_store`). A Spark job's result file under the
root is read here too (:func:`read_result`; the file's format is ``staging/seam/job_result.py``).
"""

from __future__ import annotations

import importlib.util
import json
from urllib.parse import urlsplit

from airflow_provider_pglogical.exceptions import InvalidInputError, JobResultMissing
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig, s3a_jars, scheme_of
from airflow_provider_pglogical.lakehouse.lakehouse_access import LakehouseAccess, get_connection, storage_properties
from airflow_provider_pglogical.staging.seam.job_result import JobError

#: the schemes of S3 on both sides: Airflow's Amazon provider reads all three, Spark reads them as S3A
S3_SCHEMES = ("s3", "s3a", "s3n")
#: what to install for a scheme's file system on the Airflow side
_INSTALL = {
    **{scheme: "pip install 'airflow-provider-pglogical[s3]' (apache-airflow-providers-amazon and s3fs)"
       for scheme in S3_SCHEMES},
    "gs": "pip install apache-airflow-providers-google", "gcs": "pip install apache-airflow-providers-google",
    **{scheme: "pip install apache-airflow-providers-microsoft-azure"
       for scheme in ("abfs", "abfss", "az", "adl", "wasb", "wasbs")},
}


def _split(root: str) -> tuple[str, str | None, str, str]:
    """(scheme, connection id, bucket, key) of an object store URI ``scheme://[conn@]bucket/key``."""
    parts = urlsplit(str(root))
    conn_id, _at, bucket = parts.netloc.rpartition("@")
    return parts.scheme.lower(), conn_id or None, bucket, parts.path


def on_s3(root: str) -> bool:
    """The staging root is on S3 (``s3://``, ``s3a://`` or ``s3n://``)."""
    return scheme_of(str(root)) in S3_SCHEMES


def staging_conn_id(root: str) -> str | None:
    """The Airflow connection named in the root (``s3://<conn_id>@bucket/...``), if any."""
    return _split(root)[1] if "://" in str(root) else None


def spark_uri(root: str) -> str:
    """The root as Spark's Hadoop FileSystem reads it: an S3 root becomes ``s3a://<bucket><key>``
    (its connection is not part of a Hadoop URI); any other root is unchanged."""
    if not on_s3(root):
        return str(root)
    _scheme, _conn, bucket, key = _split(root)
    return f"s3a://{bucket}{key}"


def check_staging_store(root: str) -> str:
    """Refuse, before anything is written, a root whose file system Airflow cannot open: a scheme
    no installed provider registers, S3 without ``s3fs``, or S3 without a connection that exists.
    Returns the root."""
    try:
        from airflow.sdk.io.fs import has_fs
    except ModuleNotFoundError:  # Airflow 3.0 keeps it in airflow.io
        from airflow.io import has_fs

    scheme = scheme_of(str(root))
    if scheme in ("", "file", "local"):
        return root
    install = _INSTALL.get(scheme, f"install the Airflow provider that registers a file system for {scheme}://")
    if not has_fs(scheme) or (scheme in S3_SCHEMES and importlib.util.find_spec("s3fs") is None):
        raise InvalidInputError(
            f"staging root {root}: no file system for {scheme}:// is installed on this Airflow worker, so "
            f"nothing can be staged there. Fix: {install}"
        )
    if scheme in S3_SCHEMES:
        _scheme, conn_id, bucket, key = _split(root)
        if not conn_id:
            raise InvalidInputError(
                f"staging root {root} names no Airflow connection, so the worker and Spark would reach the bucket "
                f"with whatever credentials each finds. Fix: name an aws connection in the root, "
                f"s3://<aws_conn_id>@{bucket}{key} (docs/lakehouse.md, 'Staging on S3')"
            )
        _existing_connection(conn_id, root)
    return root


def _existing_connection(conn_id: str, root: str) -> None:
    from airflow.exceptions import AirflowNotFoundException  # the Task SDK's class in Airflow 3

    try:
        get_connection(conn_id)
    except AirflowNotFoundException:
        raise InvalidInputError(
            f"staging root {root}: Airflow connection {conn_id!r} is not defined. Fix: create it (an aws "
            "connection: access key as login, secret as password, extra endpoint_url for an S3-compatible store)"
        ) from None


def staging_path(root: str):
    """The checked root as an ``ObjectStoragePath`` (its connection taken from the URI)."""
    from airflow.sdk import ObjectStoragePath

    return ObjectStoragePath(check_staging_store(root))


def staging_access(root: str, iceberg: IcebergConfig, conf: dict[str, str]) -> LakehouseAccess:
    """What Spark needs, beyond the lakehouse's own properties ``conf``, to read and write an S3 staging
    root: S3A's jars, and the root's connection as per-bucket S3A properties (the keys private),
    unless it is the warehouse's ``storage_conn_id`` already. Refuses one bucket reached by two
    connections: S3A would use the staging one for the warehouse too."""
    access = LakehouseAccess()
    if not on_s3(root):
        return access
    _scheme, conn_id, bucket, _key = _split(root)
    jars = [jar for jar in conf.get("spark.jars", "").split(",") if jar]
    if iceberg.jars is None and not iceberg.packages and not iceberg.on_s3():
        access.public["spark.jars"] = ",".join([*jars, *s3a_jars()])
    if conn_id == iceberg.storage_conn_id:
        return access
    if iceberg.on_s3() and iceberg.storage_conn_id and _split(iceberg.warehouse or "")[2] == bucket:
        raise InvalidInputError(
            f"staging root {root} and the warehouse {iceberg.warehouse} share bucket {bucket!r} but name different "
            f"connections ({conn_id!r} and storage_conn_id {iceberg.storage_conn_id!r}). Fix: use one connection "
            f"for both (s3://{iceberg.storage_conn_id}@{bucket}/...), or stage in another bucket"
        )
    storage_properties(str(conn_id), access, prefix=f"spark.hadoop.fs.s3a.bucket.{bucket}.")
    return access


#: Hadoop FileSystem schemes and the fsspec protocol that reads the same objects
_HADOOP_SCHEMES = {"s3a": "s3", "s3n": "s3"}


def storage_path(uri: str):
    """The ObjectStoragePath of a Hadoop URI (``s3a://b/k`` is ``s3://b/k``): a job's result file."""
    from airflow.sdk import ObjectStoragePath

    scheme, sep, rest = uri.partition("://")
    if sep and scheme in _HADOOP_SCHEMES:
        uri = f"{_HADOOP_SCHEMES[scheme]}://{rest}"
    return ObjectStoragePath(uri)


def read_result(uri: str, *, job: str, remove: bool = True) -> dict:
    """Read (and by default remove) the result file a Spark job wrote at ``uri``
    (``staging/seam/job_result.py``).

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


def read_job_error(uri: str) -> JobError | None:
    """The :class:`JobError` a failed job left in its result file at ``uri``; None when it left no
    result, or one without an error. The file is removed either way."""
    if not storage_path(uri).exists():
        return None
    error = read_result(uri, job="failed").get("error")
    return JobError.from_json(error) if error else None
