"""Verify the lakehouse against the source: a PostgreSQL snapshot compared in a Spark job."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from airflow.sdk import BaseOperator

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.verification.witness import LakehouseDiffers, verify_pipeline
from airflow_provider_pglogical.management.validation import check_pipeline_name, check_staging_root
from airflow_provider_pglogical.operators._capture import staging_root_argument
from airflow_provider_pglogical.operators._errors import fail_permanent_errors


if TYPE_CHECKING:
    from airflow.sdk import Context



class PgVerifyOperator(BaseOperator):
    """Fail unless every published table's projection equals its Iceberg table.

    An independent witness: PostgreSQL digests each row of the published projection itself (no
    capture code reads the source), Spark digests the Iceberg rows the same way, and only the
    buckets whose digests differ are compared row by row, naming the first differing keys. Run it
    when the source is quiet and every change was applied (the demo's last step), or against a
    native subscriber of the same publications (``source_conn_id``).

    :param publications: the pipeline's publications (their row filters and column lists define the projection).
    :param staging_root: staging root; the comparison's plan and differing rows are written under
        ``_verify/<pipeline>/`` and removed after the run (``staging_path``, its old name, is deprecated).
    :param pipeline: the pipeline's name.
    :param iceberg: the lakehouse (default: the embedded Hadoop catalog).
    :param table_map: source ``schema.table`` -> Iceberg table name, as given to the apply operator.
    :param source_conn_id: read the source rows here instead of the publisher (e.g. a native subscriber).
    :param postgres_conn_id: the publisher's Airflow connection. (templated)
    :param spark_conn_id: the Spark connection.
    :param type_overrides: the pipeline's ``type_overrides`` (as given to the sync and pull operators).
    """

    template_fields: Sequence[str] = (
        "publications", "staging_root", "pipeline", "iceberg", "table_map", "source_conn_id", "postgres_conn_id",
        "spark_conn_id", "type_overrides",
    )

    def __init__(
        self, *, publications: Sequence[str], pipeline: str, staging_root: str | None = None,
        iceberg: IcebergConfig | None = None, table_map: dict[str, str] | None = None,
        source_conn_id: str | None = None, postgres_conn_id: str = PgLogicalHook.default_conn_name,
        spark_conn_id: str = "spark_default", type_overrides: dict[str, str] | None = None,
        staging_path: str | None = None, **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Airflow renders templated fields by attribute name when the task runs: every argument is kept as given.
        self.publications = publications
        self.staging_root = staging_root_argument(staging_root, staging_path, self.task_id)
        self.pipeline = pipeline
        self.iceberg = iceberg
        self.table_map = table_map
        self.source_conn_id = source_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.spark_conn_id = spark_conn_id
        self.type_overrides = type_overrides

    def execute(self, context: Context) -> dict:
        with fail_permanent_errors():
            check_staging_root(str(self.staging_root))
            check_pipeline_name(self.pipeline)
            result = verify_pipeline(
                postgres_conn_id=self.postgres_conn_id, publications=list(self.publications),
                staging_path=self.staging_root, pipeline=self.pipeline, iceberg=self.iceberg, table_map=self.table_map,
                source_conn_id=self.source_conn_id, spark_conn_id=self.spark_conn_id, report=self.log.info,
                type_overrides=self.type_overrides,
            )
            self.log.info("verify:\n%s", result["summary"])
            if not result["equal"]:
                raise LakehouseDiffers(f"the lakehouse differs from the source:\n{result['summary']}")
            return {"equal": True, "source_lsn": result["source_lsn"],
                    "tables": {t["table"]: t["source_rows"] for t in result["tables"]}}
