"""Run a snapshot's ctid-range copy on a Spark cluster: ``PgInitialSyncOperator(copy_on_spark=SparkCopy(...))``.

The operator keeps the replication session that exported the snapshot open and spark-submits
``capture/copy_job.py`` through the Spark provider's hook; each executor task imports the snapshot
and copies one work unit into the batch directory, with the same code as a local copy. The
operator adds the files the job reports to the manifest and commits the batch, so the apply
(adoption included) lands it as any snapshot. The publisher's password reaches the job only
through a private properties file (0600, removed after), never a command line or the plan.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_pglogical.capture.copy_job import CONNECTION_CONF, plan_document
from airflow_provider_pglogical.capture.snapshot import Copier, CopyPlan
from airflow_provider_pglogical.exceptions import DistributedCopyError, InvalidInputError
from airflow_provider_pglogical.lakehouse.lakehouse_access import jars_for_master, private_properties
from airflow_provider_pglogical.spark.launch import COPY_JOB, COPY_MEMBERS, job_bundle
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.contract import STAGING_FILE_MODE_CONF
from airflow_provider_pglogical.staging.layout import FileEntry
from airflow_provider_pglogical.staging.private_files import file_mode, local_path, make_dirs, open_new


@dataclass
class SparkCopy:
    """Where and how the snapshot's work units run as Spark tasks.

    The executors need the provider's Python dependencies (psycopg2, pyarrow), network access to
    the publisher, and the staging root at the same local path as the Airflow worker (one machine,
    or a shared file system such as NFS); an object-store staging root is refused before anything
    is created. The operator's ``parallelism`` is how many units run at once (give the cluster's
    executor cores).

    :param conn_id: the Spark connection (``spark://host:7077``, ``yarn``, ``local[*]``).
    :param conf: more Spark properties (deployment settings: memory, cores, Python).
    :param driver_memory: the job's driver memory; it holds no rows (default ``1g``).
    :param executor_memory: memory per executor; each running unit holds a few 8 MB chunks.
    :param properties_file: the spark-submit properties file to start from (default: spark-defaults).
    :param env_vars: environment of spark-submit (e.g. ``SPARK_LOCAL_IP``).
    """

    conn_id: str = "spark_default"
    conf: dict[str, str] = field(default_factory=dict)
    driver_memory: str = "1g"
    executor_memory: str | None = None
    properties_file: str | None = None
    env_vars: dict[str, str] | None = None

    def check(self, root: Any, task: str) -> str:
        """The staging root's local path, or a clear error before any slot exists."""
        local = local_path(root)
        if local is None:
            raise InvalidInputError(
                f"{task}: copy_on_spark needs a staging root the Spark executors reach as a local path (a local "
                f"or shared file system, file://), not {root}: the executors write the snapshot's files there "
                "themselves. Fix: stage on a shared file system, or drop copy_on_spark to copy on the Airflow "
                "worker. Nothing was changed"
            )
        return local

    def copier(self, connect_kwargs: Mapping[str, Any], root: Any, parallelism: int, task: str = "the snapshot",
               report: Callable[[str], None] = print) -> Copier:
        """A ``copy_tables`` copier that runs the plan's units as tasks of one spark-submit."""
        self.check(root, task)

        def run(plan: CopyPlan, writer: BatchWriter, snapshot_name: str, _report: Callable[[str], None]) -> dict:
            results = writer.pipeline_dir / "_results"
            make_dirs(results)
            run_id = uuid.uuid4().hex
            plan_file, result_file = results / f"copy-{run_id}-plan.json", results / f"copy-{run_id}.json"
            local_root = os.path.dirname(str(local_path(writer.pipeline_dir)))
            document = plan_document(plan, writer, local_root, snapshot_name, parallelism, local_path(result_file))
            try:
                with open_new(plan_file) as out:
                    out.write(json.dumps(document).encode())
                report(f"copying on Spark ({self.conn_id}): {len(plan.units)} work unit(s), {parallelism} at once")
                self._submit(local_path(plan_file), dict(connect_kwargs))
                outcome = json.loads(result_file.read_text()) if result_file.exists() else None
            except Exception as failure:
                outcome = json.loads(result_file.read_text()) if result_file.exists() else None
                if not outcome or "error" not in outcome:
                    raise
                raise _unit_error(outcome["error"]) from failure
            finally:
                for path in (plan_file, result_file):
                    if path.exists():
                        path.unlink()
            if outcome is None:
                raise DistributedCopyError("the snapshot copy job ended without writing its result: see the "
                                           "spark-submit log above. Nothing was committed")
            if "error" in outcome:
                raise _unit_error(outcome["error"])
            return add_files(writer, outcome["files"], report)

        return run

    def _submit(self, plan_path: str, connect_kwargs: dict) -> None:
        conf = jars_for_master({**self.conf, STAGING_FILE_MODE_CONF: f"{file_mode():o}", "spark.speculation": "false"},
                               self.conn_id)
        private = {CONNECTION_CONF: json.dumps(connect_kwargs)}
        with private_properties(private, self.properties_file) as properties_file:
            hook = SparkSubmitHook(
                conf=conf, conn_id=self.conn_id, name="pglogical-snapshot-copy", properties_file=properties_file,
                driver_memory=self.driver_memory, executor_memory=self.executor_memory,
                py_files=str(job_bundle(members=COPY_MEMBERS)), application_args=["--plan", plan_path],
                env_vars=self.env_vars,
            )
            hook.submit(application=str(COPY_JOB))


def add_files(writer: BatchWriter, finished: list[dict], report: Callable[[str], None] = print) -> dict[str, int]:
    """Record the units' files in the batch's manifest (in name order); returns rows per source table."""
    rows: dict[str, int] = {}
    peak = 0.0
    for outcome in finished:
        table = writer.manifest.tables[outcome["staged_as"]]
        entry = FileEntry.from_dict(outcome["file"])
        table.files.append(entry)
        table.rows += entry.rows
        rows[outcome["table"]] = rows.get(outcome["table"], 0) + entry.rows
        peak = max(peak, outcome.get("peak_rss_mb", 0.0))
    for table in writer.manifest.tables.values():
        table.files.sort(key=lambda entry: entry.path)
    writer.manifest.details["spark_copy"] = {"units": len(finished), "peak_python_worker_mb": round(peak, 1)}
    report(f"the Spark copy wrote {len(finished)} file(s); peak memory of an executor's Python worker {peak:,.0f} MB")
    return rows


def _unit_error(error: dict) -> DistributedCopyError:
    where = f" in {error['table']} (blocks {error['blocks'][0]} to {error['blocks'][1] or 'the end'})" \
        if error.get("table") else ""
    return DistributedCopyError(
        f"the snapshot copy on Spark failed{where}: {error['type']}: {error['message']}. Nothing was committed",
        permanent=bool(error.get("permanent")),
    )
