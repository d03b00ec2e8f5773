"""Keep the lakehouse tables small and fast: Iceberg housekeeping as a ``SparkSubmitOperator``.

Every MERGE of the apply adds small data files, merge-on-read delete files, a manifest, a snapshot
and a metadata file. This operator runs ``spark/jobs/maintenance.py`` over the pipeline's tables to
compact them, expire old snapshots and remove orphan files, so a table's file count stays flat
(docs/housekeeping.md). Run it where nothing else commits to the same tables: the example DAG
``pglogical_lakehouse_sync`` runs it after the apply, every few hours, in the same DAG run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_pglogical.lakehouse.lakehouse_access import jars_for_master, job_access, private_properties, spark_environment
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.spark.launch import MAINTENANCE_JOB, with_job_bundle
from airflow_provider_pglogical.management.validation import check_count
from airflow_provider_pglogical.operators._errors import fail_permanent_errors
from airflow_provider_pglogical.spark.housekeeping.steps import DEFAULT_CONCURRENCY, Housekeeping

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import Context


class IcebergMaintenanceOperator(SparkSubmitOperator):
    """Compact, expire and clean the Iceberg tables of a namespace, one step switchable at a time.

    Per table, in this order: ``rewrite_data_files``, ``rewrite_position_delete_files``,
    ``rewrite_manifests``, ``expire_snapshots``, ``remove_orphan_files`` (Iceberg's Spark
    procedures). The defaults hold a table's file count and metadata flat under an apply every few
    minutes when the operator runs every few hours. Out-of-range values fail when the DAG is parsed.

    :param iceberg: the lakehouse (the same config as the apply task); default :class:`IcebergConfig`.
        (templated: its ``catalog``, ``warehouse``, ``namespace`` and ``extra_conf``)
    :param tables: tables of ``iceberg.namespace`` to maintain; default all of them, the
        ``_pglogical_state`` table included. (templated)
    :param compact_data_files: run ``rewrite_data_files``: bin-pack small data files (default True).
    :param min_input_files: compact a group of small data files once it has this many (default 5).
    :param delete_file_threshold: rewrite a data file once this many delete files apply to it,
        whatever its size (Iceberg's ``delete-file-threshold``; default 1), so merge-on-read deletes
        are folded into the data instead of piling up. Iceberg's Spark writers (1.9, 1.10) keep one
        delete file per data file: with 1, a table has no delete files after each run; a higher value
        leaves deletes to Iceberg's ``delete-ratio-threshold`` (a file with 30% of its rows deleted).
    :param compact_delete_files: run ``rewrite_position_delete_files`` with ``rewrite-all``: merge
        the position delete files and drop the deletes of data files that are gone (default True;
        skipped on a table with a list or map column, where Iceberg 1.10's procedure fails).
    :param rewrite_manifests: run ``rewrite_manifests``: every commit adds a manifest; regroup them
        so query planning reads a few (default True).
    :param expire_snapshots: run ``expire_snapshots``: forget snapshots older than
        ``older_than_hours`` and delete the files only they referenced (default True).
    :param older_than_hours: expire snapshots older than this; time travel stays possible within it
        (default 24).
    :param retain_last: always keep this many snapshots (default 5).
    :param remove_orphan_files: run ``remove_orphan_files``: delete files under the table location
        that no snapshot references, such as those of a failed write (default True).
    :param orphan_older_than_hours: only files older than this are orphans (default 72, at least 24:
        a file that young may belong to a commit still in flight; Iceberg refuses less too).
    :param concurrency: how many tables are maintained at once, each table's steps in order
        (default 4; 1 keeps them one after another).
    :param conf: more Spark properties, applied over the ones ``iceberg`` produces. (templated)
    :param driver_memory: default ``2g``.
    :param kwargs: anything else :class:`SparkSubmitOperator` takes.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "tables", "iceberg")

    def __init__(
        self,
        *,
        iceberg: IcebergConfig | None = None,
        tables: list[str] | None = None,
        compact_data_files: bool = True,
        min_input_files: int = 5,
        delete_file_threshold: int = 1,
        compact_delete_files: bool = True,
        rewrite_manifests: bool = True,
        expire_snapshots: bool = True,
        older_than_hours: float = 24,
        retain_last: int = 5,
        remove_orphan_files: bool = True,
        orphan_older_than_hours: float = 72,
        concurrency: int = DEFAULT_CONCURRENCY,
        conf: dict[str, Any] | None = None,
        driver_memory: str | None = "2g",
        **kwargs: Any,
    ) -> None:
        iceberg = iceberg or IcebergConfig()
        kwargs.setdefault("name", f"pglogical-maintenance-{iceberg.namespace}")
        super().__init__(application=str(MAINTENANCE_JOB), conf=dict(conf or {}), driver_memory=driver_memory, **kwargs)
        self.iceberg = iceberg
        self.tables = tables
        self.concurrency = check_count(concurrency, "concurrency")
        # checked now: a cut-off that could remove a file still being written fails the DAG's import
        self.housekeeping = Housekeeping(
            compact_data_files=compact_data_files, min_input_files=min_input_files,
            delete_file_threshold=delete_file_threshold, compact_delete_files=compact_delete_files,
            rewrite_manifests=rewrite_manifests, expire_snapshots=expire_snapshots,
            older_than_hours=older_than_hours, retain_last=retain_last,
            remove_orphan_files=remove_orphan_files, orphan_older_than_hours=orphan_older_than_hours,
        )
        self.application_args = self.job_args()

    def job_args(self) -> list[str]:
        args = ["--catalog", self.iceberg.catalog, "--namespace", self.iceberg.namespace, *self.housekeeping.args()]
        for table in self.tables or ():
            args += ["--table", str(table)]
        if self.concurrency != DEFAULT_CONCURRENCY:
            args += ["--concurrency", str(self.concurrency)]
        return args

    def execute(self, context: Context) -> None:
        # resolved when the task runs, not when the DAG is parsed (the jar lookup, templated values)
        with fail_permanent_errors():  # a refused lakehouse is not retried
            access = job_access(self.iceberg)  # credentials: never on the command line
            self.conf = jars_for_master({**access.public, **(self.conf or {})}, self._conn_id)
        self.application_args = self.job_args()
        self.py_files = with_job_bundle(self.py_files)
        given, self._hook = self.properties_file, None  # the hook reads the file's path when it is made
        given_env = self.env_vars
        self.env_vars = spark_environment(access, given_env, self._conn_id)
        with private_properties(access.private, given) as self.properties_file:
            try:
                super().execute(context)
            finally:
                self.properties_file, self.env_vars = given, given_env
