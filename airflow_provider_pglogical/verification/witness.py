"""Verify: compare the source's published projection with the lakehouse, an independent witness.

Library code (the operator, the demo and the tests call it): PostgreSQL digests the projection in
one snapshot (``capture/source_projection.py``), ``spark/jobs/verify_tables.py`` digests Iceberg and
compares per bucket (spark-submitted through the Spark provider's hook), and PostgreSQL compares
the rows of the buckets that differ. No step reads the source through the capture's code.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture import source_projection
from airflow_provider_pglogical.exceptions import PgLogicalError, SparkJobError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.lakehouse_access import (
    LakehouseAccess,
    jars_for_master,
    job_access,
    private_properties,
    spark_environment,
)
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.staging_roots import (
    read_job_error,
    read_result,
    spark_uri,
    staging_access,
    staging_path as staging_path_of,
    storage_path,
)
from airflow_provider_pglogical.staging.contract import RESULT_CONF, STAGING_FILE_MODE_CONF, default_target_name, table_key
from airflow_provider_pglogical.staging.pipeline_record import read_record
from airflow_provider_pglogical.staging.private_files import file_mode, make_dirs
from airflow_provider_pglogical.spark.launch import VERIFY_JOB, with_job_bundle

#: the job also prints its result after this prefix, for people reading the log
RESULT_PREFIX = "PGLOGICAL_VERIFY_RESULT "


class LakehouseDiffers(PgLogicalError):
    """verify found rows that differ between the source and the lakehouse."""

    permanent = True


def run_verify_job(plan_uri: str, iceberg: IcebergConfig, *, conn_id: str = "spark_default",
                   driver_memory: str = "2g", staging: LakehouseAccess | None = None) -> dict:
    """spark-submit the comparison job through the Spark provider's hook; returns its JSON result.

    The job writes the result next to its plan, read back through ObjectStoragePath: the driver's
    stdout is not needed (cluster deploy modes).

    :param plan_uri: the plan as Airflow reaches it (``s3://<conn>@bucket/…`` on S3; Spark gets
        :func:`spark_uri` of it).
    :param staging: what Spark needs to reach an object-store staging root (``staging_access``).
    """
    result_at = f"{plan_uri.rsplit('/', 1)[0]}/_result-{uuid.uuid4().hex}.json"
    access = job_access(iceberg, staging)  # credentials: never on the command line
    with private_properties(access.private) as properties_file:
        hook = SparkSubmitHook(
            conf=jars_for_master({**access.public, RESULT_CONF: spark_uri(result_at),
                                  STAGING_FILE_MODE_CONF: f"{file_mode():o}"}, conn_id),
            conn_id=conn_id, name="pglogical-verify", properties_file=properties_file,
            driver_memory=driver_memory, py_files=with_job_bundle(None),
            env_vars=spark_environment(access, None, conn_id),
            application_args=["--plan", spark_uri(plan_uri)],
        )
        try:
            hook.submit(application=str(VERIFY_JOB))
        except Exception:
            error = read_job_error(result_at)  # the job's own error, not the spark-submit command line
            if error is None:
                raise
            raise SparkJobError.of("verify", error) from None
    return read_result(result_at, job="verify")


def verify_tables(connect_kwargs: Mapping[str, Any], tables: list[source_projection.SourceTable],
                  root: ObjectStoragePath, pipeline: str, compare: Callable[[str], dict], *, limit: int = 10) -> dict:
    """Digest the source in PostgreSQL, have ``compare`` (the Spark job) digest Iceberg, explain differences.

    :param compare: runs the Spark comparison on a plan file (its URI as Airflow reaches it) and
        returns the job's result. The plan names its output directory as Spark reaches it
        (``s3a://…`` for an ``s3://<conn>@…`` root); the rows written there are read back here
        through ``root``'s own path, so with its connection.
    :returns: the job's result, each differing table completed by PostgreSQL's row comparison
        (``missing_rows``, ``extra_rows``, ``only_in_source``, ``only_in_target``, ``first_differing_keys``).
    """
    directory = root / source_projection.VERIFY_DIR / pipeline / uuid.uuid4().hex
    try:
        with source_projection.source_snapshot(connect_kwargs) as (cursor, lsn):
            for table in tables:
                source_projection.bucket_sums(cursor, table)
            make_dirs(directory)  # private (0700) on a local file system: the job writes source rows under it
            plan = directory / "plan.json"
            rows, output = directory / "rows", spark_uri(str(directory / "rows"))
            plan.write_text(json.dumps({"output": output, "tables": [table.spec() for table in tables]}))
            result = compare(str(plan))
            for table, verdict in zip(tables, result["tables"]):
                if verdict.get("buckets"):
                    written = verdict["rows_at"]  # <output>/table-<i>, as Spark named it
                    at = rows / written[len(output):].lstrip("/") if written.startswith(output) \
                        else storage_path(written)
                    verdict.update(source_projection.differences(
                        cursor, table, verdict["buckets"], _target_rows(at), limit))
    finally:
        if directory.exists():
            directory.rmdir(recursive=True)
    result["source_lsn"] = str(lsn)
    result["summary"] = source_projection.describe_differences(result)
    return result


def _target_rows(directory: ObjectStoragePath) -> dict[str, list]:
    """The Spark job's rows of the differing buckets (Parquet parts in ``directory``), column by column."""
    parts = []
    for part in sorted(directory.iterdir(), key=str):
        if part.name.endswith(".parquet"):
            with part.open("rb") as fh:
                parts.append(pq.read_table(fh))
    if not parts:
        return {"kd": [], "rd": [], "n": [], "row": []}
    table = pa.concat_tables(parts)
    return {name: table[name].to_pylist() for name in ("kd", "rd", "n", "row")}


def followed_renames(root, pipeline: str, tables, table_map: dict[str, str] | None) -> dict[str, str]:
    """``table_map`` with each renamed table's current name mapped to the target of its identity
    (the name the pipeline first snapshotted it by: the apply follows the table by OID)."""
    record = read_record(root, pipeline)
    mapped = dict(table_map or {})
    for table in tables:
        entry = (record.relations if record else {}).get(str(table.oid))
        identity = table_key(*entry["identity"]) if entry else table.qualified_name
        if identity != table.qualified_name and table.qualified_name not in mapped:
            mapped[table.qualified_name] = mapped.get(identity) or default_target_name(identity)
    return mapped


def verify_pipeline(
    *, postgres_conn_id: str, publications: Sequence[str], staging_path: str, pipeline: str,
    iceberg: IcebergConfig | None = None, table_map: dict[str, str] | None = None,
    source_conn_id: str | None = None, spark_conn_id: str = "spark_default", report=print,
    type_overrides: dict[str, str] | None = None, limit: int = 10,
    compare: Callable[[str], dict] | None = None,
) -> dict:
    """Compare the published projection (read from ``source_conn_id`` or the publisher) with Iceberg.

    The source is read by PostgreSQL itself (row digests in one snapshot), never through the
    capture's COPY parser, so a capture bug cannot hide from the comparison (docs/reliability.md).

    :param compare: runs the Spark side on the plan's URI in a session the caller already has
        (see :func:`compare_in_session`); by default the verify job is spark-submitted.
    """
    iceberg = iceberg or IcebergConfig()
    publisher = PgLogicalHook(postgres_conn_id=postgres_conn_id)
    published = publisher.published_tables(list(publications))
    root = staging_path_of(staging_path)
    table_map = followed_renames(root, pipeline, published, table_map)
    tables = source_projection.source_tables(
        published, iceberg.catalog, iceberg.namespace, table_map=table_map,
        type_overrides=type_overrides, apply_row_filters=source_conn_id is None)
    source = PgLogicalHook(postgres_conn_id=source_conn_id) if source_conn_id else publisher
    report(f"verify: digesting {len(tables)} table(s) in PostgreSQL, then comparing them with Iceberg in Spark")
    if compare is None:
        staging = staging_access(staging_path, iceberg, iceberg.spark_conf())
        compare = lambda plan: run_verify_job(plan, iceberg, conn_id=spark_conn_id, staging=staging)  # noqa: E731
    return verify_tables(source.connect_kwargs(), tables, root, pipeline, compare, limit=limit)


def compare_in_session(spark) -> Callable[[str], dict]:
    """A ``compare`` for :func:`verify_pipeline` that runs the verify job's comparison in ``spark``,
    an open session whose catalog is the lakehouse's (no spark-submit: a JVM start saved)."""
    from airflow_provider_pglogical.spark.jobs import verify_tables as verify_job

    return lambda plan: verify_job.run(spark, json.loads(storage_path(plan).read_text()))
