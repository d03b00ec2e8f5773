"""Keep the lakehouse tables fast: compaction and snapshot expiry as a ``SparkSubmitOperator``.

Merge-on-read MERGEs leave small data files and position-delete files behind; schedule this
operator (daily, say) next to :class:`~airflow_provider_pglogical.operators.iceberg_apply.IcebergApplyOperator`
with the same :class:`~airflow_provider_pglogical.operators.iceberg_apply.IcebergConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.lakehouse.job_bundle import with_job_bundle

MAINTENANCE_JOB = Path(__file__).resolve().parent.parent / "spark" / "maintenance.py"


class IcebergMaintenanceOperator(SparkSubmitOperator):
    """Run ``rewrite_data_files``, ``rewrite_position_delete_files`` and ``expire_snapshots``.

    :param iceberg: the lakehouse (the same config as the apply task); default :class:`IcebergConfig`. (templated)
    :param tables: tables of ``iceberg.namespace`` to maintain; default all of them. (templated)
    :param min_input_files: compact a file group once it has this many files.
    :param older_than_hours: expire snapshots older than this (time travel stays possible within it).
    :param retain_last: always keep this many snapshots.
    :param conf: more Spark properties, applied over the ones ``iceberg`` produces.
    :param kwargs: anything else :class:`SparkSubmitOperator` takes.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "tables", "iceberg")

    def __init__(
        self,
        *,
        iceberg: IcebergConfig | None = None,
        tables: list[str] | None = None,
        min_input_files: int = 5,
        older_than_hours: float = 24,
        retain_last: int = 5,
        conf: dict[str, Any] | None = None,
        driver_memory: str | None = "2g",
        **kwargs: Any,
    ) -> None:
        iceberg = iceberg or IcebergConfig()
        kwargs.setdefault("name", f"pglogical-maintenance-{iceberg.namespace}")
        super().__init__(application=str(MAINTENANCE_JOB), conf=dict(conf or {}), driver_memory=driver_memory, **kwargs)
        self.iceberg = iceberg
        self.tables = tables
        self.min_input_files = min_input_files
        self.older_than_hours = older_than_hours
        self.retain_last = retain_last
        self.application_args = self.job_args()

    def job_args(self) -> list[str]:
        args = ["--catalog", self.iceberg.catalog, "--namespace", self.iceberg.namespace,
                "--min-input-files", str(self.min_input_files), "--older-than-hours", str(self.older_than_hours),
                "--retain-last", str(self.retain_last)]
        for table in self.tables or ():
            args += ["--table", str(table)]
        return args

    def execute(self, context) -> None:
        # resolved when the task runs, not when the DAG is parsed (the jar lookup, templated values)
        self.conf = {**self.iceberg.spark_conf(), **(self.conf or {})}
        self.application_args = self.job_args()
        self.py_files = with_job_bundle(self.py_files)
        super().execute(context)
