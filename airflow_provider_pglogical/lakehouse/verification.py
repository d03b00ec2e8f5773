"""Verify: compare the source's published projection with the lakehouse, through the Spark comparison job.

Library code (the operator, the demo and the tests call it): stage the projection at one snapshot,
spark-submit ``spark/verify_tables.py`` through the Spark provider's hook, read its result file.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Sequence

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture import source_projection
from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.staging.contract import RESULT_CONF
from airflow_provider_pglogical.staging.job_result import read_result
from airflow_provider_pglogical.lakehouse.job_bundle import with_job_bundle

VERIFY_JOB = Path(__file__).resolve().parent.parent / "spark" / "verify_tables.py"
#: the job also prints its result after this prefix, for people reading the log
RESULT_PREFIX = "PGLOGICAL_VERIFY_RESULT "


class LakehouseDiffers(PgLogicalError):
    """verify found rows that differ between the source and the lakehouse."""

    permanent = True


def run_verify_job(specs: list[dict], snapshot_dir: str, iceberg: IcebergConfig, *, conn_id: str = "spark_default",
                   driver_memory: str = "2g", limit: int = 10) -> dict:
    """spark-submit the comparison job through the Spark provider's hook; returns its JSON result.

    The job writes the result next to the snapshot it compares (``<snapshot_dir>/_result.json``),
    read back through ObjectStoragePath: the driver's stdout is not needed (cluster deploy modes).
    """
    result_at = f"{snapshot_dir.rstrip('/')}/_result-{uuid.uuid4().hex}.json"
    hook = SparkSubmitHook(
        conf={**iceberg.spark_conf(), RESULT_CONF: result_at}, conn_id=conn_id, name="pglogical-verify",
        driver_memory=driver_memory, py_files=with_job_bundle(None),
        application_args=["--snapshot-dir", snapshot_dir, "--tables", json.dumps(specs), "--limit", str(limit)],
    )
    hook.submit(application=str(VERIFY_JOB))
    return read_result(result_at, job="verify")


def verify_pipeline(
    *, postgres_conn_id: str, publications: Sequence[str], staging_path: str, pipeline: str,
    iceberg: IcebergConfig | None = None, table_map: dict[str, str] | None = None,
    source_conn_id: str | None = None, spark_conn_id: str = "spark_default", report=print,
    type_overrides: dict[str, str] | None = None,
) -> dict:
    """Compare the published projection (read from ``source_conn_id`` or the publisher) with Iceberg."""
    iceberg = iceberg or IcebergConfig()
    publisher = PgLogicalHook(postgres_conn_id=postgres_conn_id)
    tables = publisher.published_tables(list(publications))
    source = PgLogicalHook(postgres_conn_id=source_conn_id) if source_conn_id else publisher
    root = ObjectStoragePath(staging_path)
    directory, manifest = source_projection.stage_source_projection(
        source.connect_kwargs(), tables, root, pipeline, apply_row_filters=source_conn_id is None,
        type_overrides=type_overrides, report=report,
    )
    specs = source_projection.comparison_specs(manifest, iceberg.catalog, iceberg.namespace, table_map)
    result = run_verify_job(specs, directory, iceberg, conn_id=spark_conn_id)
    result["source_lsn"] = manifest.start_lsn
    result["summary"] = source_projection.describe_differences(result)
    return result
