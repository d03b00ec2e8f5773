"""Apply staged batches to Apache Iceberg: a ``SparkSubmitOperator`` over ``spark/jobs/apply_changes.py``.

The embedded default needs nothing but the Airflow connection ``spark_default`` with host
``local[*]`` (``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}'``), the
jars resolved once by ``python -m airflow_provider_pglogical.lakehouse.jar_cache`` (``scripts/setup.sh``
runs it) and a local warehouse directory: an Iceberg Hadoop catalog named ``lake``. On a cluster, pass
the catalog and the runtime as configuration (``packages=["org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.10.1"]``,
``catalog_type="rest"``, ``extra_conf={...}``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias

from airflow_provider_pglogical.lakehouse.catalog_tables import catalog_metadata_locations
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig, default_warehouse, scheme_of
from airflow_provider_pglogical.spark.launch import APPLY_JOB, with_job_bundle
from airflow_provider_pglogical.lakehouse.lakehouse_access import LakehouseAccess, job_access, private_properties
from airflow_provider_pglogical.lakehouse.lakehouse_access import jars_for_master, spark_environment
from airflow_provider_pglogical.lakehouse.staging_roots import read_job_error, read_result, spark_uri, staging_access
from airflow_provider_pglogical.lakehouse.staging_roots import staging_path, storage_path
from airflow_provider_pglogical.exceptions import ConcurrentApplyError, InvalidInputError, JobResultMissing, SparkJobError
from airflow_provider_pglogical.staging.contract import (
    APPLY_RESULT_PREFIX,
    DEFAULT_COMPACT_DELETES_AT,
    DEFAULT_CONCURRENCY,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_RETENTION_HOURS,
    RESULT_CONF,
    STAGING_FILE_MODE_CONF,
)
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from airflow_provider_pglogical.staging.seam.job_result import LEASE_HELD, result_uri
from airflow_provider_pglogical.staging.apply_marker import (
    pending_batches,
    recorded_targets,
    write_marker,
)
from airflow_provider_pglogical.staging.applied_positions import record_applied
from airflow_provider_pglogical.ui.history import apply_entry, errors_recorded
from airflow_provider_pglogical.ui.metrics import after_apply
from airflow_provider_pglogical.staging.layout import parse_batch_name
from airflow_provider_pglogical.staging.private_files import file_mode
from airflow_provider_pglogical.management.validation import (
    check_count,
    check_seconds,
    check_pipeline_name,
    check_staging_root,
    check_table_map,
)
from airflow_provider_pglogical.operators._errors import fail_permanent_errors

try:
    from airflow.sdk.exceptions import AirflowSkipException
except ImportError:  # Task SDK 1.0 (Airflow 3.0): the class lives in airflow.exceptions
    from airflow.exceptions import AirflowSkipException


if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import Context

#: the job also prints its summary after this prefix, for people reading the log (the operator
#: reads the result file, see :mod:`airflow_provider_pglogical.staging.seam.job_result`)
RESULT_PREFIX = APPLY_RESULT_PREFIX
_DEFAULT_ALIAS = "<pipeline>"


class IcebergApplyOperator(SparkSubmitOperator):
    """Apply every committed, not yet applied batch of a pipeline to its Iceberg tables.

    Idempotent: positions are recorded in ``<catalog>.<namespace>._pglogical_state``, so a retry
    (or two runs over the same batches) changes nothing more than one run.

    Emits one Airflow Asset event per Iceberg table it changed, through the asset alias
    ``asset_alias`` (the table set is known only at run time): the asset URI is
    ``iceberg://<catalog>/<namespace>/<table>`` (:func:`iceberg_table_asset`), its extra holds the
    pipeline, the source table, the last applied batch and LSN, and the rows applied. A DAG
    scheduled on ``iceberg_table_asset("lake", "shop", "public__orders")`` runs after an apply
    that changed that table.

    Nothing is looked up when the DAG is parsed: the Iceberg jar and the Spark properties are
    resolved when the task runs.

    :param staging_root: staging root URI, the one the capture operators write to
        (``file:///data/staging``, ``s3://<aws_conn_id>@bucket/staging``). The task lists it through
        ``ObjectStoragePath``; Spark reads it as ``s3a://bucket/staging`` with the connection's keys
        in the private properties file (docs/lakehouse.md, "Staging on S3"). (templated)
    :param pipeline: pipeline name: the batches are under ``<staging_root>/<pipeline>/``. (templated)
    :param iceberg: the lakehouse; default :class:`IcebergConfig` (embedded Hadoop catalog ``lake``).
        (templated: its ``catalog``, ``warehouse``, ``namespace`` and ``extra_conf``)
    :param table_map: source ``schema.table`` -> target table name; default ``<schema>__<table>``. (templated)
    :param asset_alias: name of the asset alias the table assets are emitted through; default
        ``pglogical_apply_<pipeline>``; ``None`` emits no assets.
    :param skip_when_idle: when every committed batch was seen by an earlier successful apply into
        the same lakehouse (``_apply_marker.json`` under staging), end as *skipped* without starting
        Spark; the Iceberg state table stays the truth, the marker never hides a pending batch.
    :param concurrency: how many tables the job applies at once (default 4; 1 applies them one
        after another). Each table's MERGE is a Spark job of its own; running a few side by side
        overlaps one's planning and commit with another's work.
    :param row_deltas: apply a small change batch that sets whole rows of an unpartitioned
        merge-on-read table, or changes a keyless table's copies, as an Iceberg row delta written
        by the driver (a position delete file and a data file, one commit, no Spark query;
        docs/concepts.md, "Row deltas"); needs pyarrow where the driver runs, else the
        batch is MERGEd. ``False`` MERGEs every batch.
    :param staging_retention: after applying, remove the batches the lakehouse has applied that were
        committed longer ago than this (default a week), so staging and every listing stay bounded;
        ``None`` keeps every batch. A dropped Iceberg table is rebuilt from what is kept, else the
        apply fails naming the backfill that rebuilds it (docs/concepts.md, "Staging retention").
    :param archive_staging: move those batches under ``<staging_root>/<pipeline>/_archive/``
        instead of deleting them (expire that prefix with your storage's lifecycle rules).
    :param keep_running: a streaming window (``timedelta`` or seconds; default off: apply once): after
        applying what is staged, the same Spark session keeps the pipeline's lease and applies each
        newly committed batch (a listing every ``poll_interval``, no Spark job while nothing is new)
        until the window ends, recording each round as a single apply does (docs/streaming.md).
        ``skip_when_idle`` does not apply to a window. (templated)
    :param poll_interval: seconds between two listings of the staging area in a window (default 0.5). (templated)
    :param compact_deletes_at: after applying, fold the deletes of each table the apply wrote that
        holds this many delete files or more into its data (Iceberg's ``rewrite_data_files``; default
        32): every row delta adds one, and reads of the table, the apply's own lookups included,
        slow down with their square (docs/housekeeping.md, "Compaction inside the apply"). A large
        unpartitioned table is rewritten each time: raise it, or ``0`` leaves every delete to
        :class:`IcebergMaintenanceOperator`.
    :param until_loaded: an initial load's apply, started beside ``PgInitialSyncOperator`` instead of
        after it, so the Spark JVM, session, catalog and lease are ready while the copy runs: the
        window ends after the first round that leaves the pipeline's tables in the lakehouse (the
        snapshot applied, now or by an earlier run), and fails if none did within ``keep_running``,
        which is then the most it waits (docs/operators.md, "An initial load beside its sync").
    :param conn_id: Spark connection; ``spark_default`` with host ``local[*]`` for the embedded setup.
    :param conf: more Spark properties, applied over the ones ``iceberg`` produces: the driver JVM's
        options too (``spark.driver.extraJavaOptions``; docs/operators.md, "Tuning the driver JVM"). (templated)
    :param driver_memory: default ``2g``.
    :param kwargs: anything else :class:`SparkSubmitOperator` takes.
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields, "staging_root", "pipeline", "iceberg", "table_map", "keep_running",
        "poll_interval",
    )

    def __init__(
        self,
        *,
        staging_root: str,
        pipeline: str,
        iceberg: IcebergConfig | None = None,
        table_map: dict[str, str] | None = None,
        asset_alias: str | None = _DEFAULT_ALIAS,
        conf: dict[str, Any] | None = None,
        driver_memory: str | None = "2g",
        skip_when_idle: bool = True,
        concurrency: int = DEFAULT_CONCURRENCY,
        row_deltas: bool = True,
        staging_retention: timedelta | None = timedelta(hours=DEFAULT_RETENTION_HOURS),
        archive_staging: bool = False,
        keep_running: timedelta | float | str | None = None,
        poll_interval: float | str = DEFAULT_POLL_INTERVAL,
        compact_deletes_at: int = DEFAULT_COMPACT_DELETES_AT,
        until_loaded: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", f"pglogical-apply-{pipeline}")
        if asset_alias == _DEFAULT_ALIAS:
            asset_alias = f"pglogical_apply_{pipeline}"
        if asset_alias:
            outlets = kwargs.get("outlets") or []
            outlets = list(outlets) if isinstance(outlets, (list, tuple)) else [outlets]
            kwargs["outlets"] = [*outlets, AssetAlias(asset_alias)]
        super().__init__(application=str(APPLY_JOB), conf=dict(conf or {}), driver_memory=driver_memory, **kwargs)
        self.iceberg = iceberg or IcebergConfig()
        self.staging_root = staging_root
        self.pipeline = pipeline
        self.table_map = table_map
        self.asset_alias = asset_alias
        self.skip_when_idle = skip_when_idle
        self.concurrency = check_count(concurrency, "concurrency")
        self.row_deltas = row_deltas
        if staging_retention is not None and staging_retention < timedelta(0):
            raise ValueError(f"staging_retention must not be negative, not {staging_retention}; None keeps every batch")
        self.staging_retention = staging_retention
        self.archive_staging = archive_staging
        self.keep_running = keep_running
        self.poll_interval = poll_interval
        if isinstance(compact_deletes_at, bool) or not isinstance(compact_deletes_at, int) or compact_deletes_at < 0:
            raise ValueError(f"compact_deletes_at must be a whole number of delete files, 0 or more (0 leaves "
                             f"them to housekeeping), not {compact_deletes_at!r}")
        self.compact_deletes_at = compact_deletes_at
        if until_loaded and keep_running in (None, 0, ""):
            raise InvalidInputError(f"IcebergApplyOperator {kwargs.get('task_id')!r}: until_loaded waits for the "
                                    "initial snapshot, but keep_running is unset: give keep_running, the most time "
                                    "to wait for it (e.g. timedelta(hours=1))")
        self.until_loaded = until_loaded
        self.application_args = self.job_args()

    def apply_options(self, lease_holder: str | None = None) -> ApplyOptions:
        """What the job does, as one value (the job's ``--options``): the one place the operator's
        keywords become the job's options."""
        # at parse time a templated window is not rendered yet: execute() builds the options again
        unrendered = isinstance(self.keep_running, str) and "{{" in self.keep_running
        window = None if unrendered else check_seconds(self.keep_running, "keep_running", optional=True)
        retention = self.staging_retention
        return ApplyOptions(
            staging_root=spark_uri(str(self.staging_root)), pipeline=str(self.pipeline),
            catalog=self.iceberg.catalog, namespace=self.iceberg.namespace, table_map=self.table_map or None,
            write_mode=self.iceberg.write_mode, bucket_count=self.iceberg.bucket_count, concurrency=self.concurrency,
            format_version=self.iceberg.format_version, upgrade_format_version=self.iceberg.upgrade_format_version,
            retention_hours=None if retention is None else retention.total_seconds() / 3600,
            archive=self.archive_staging, row_deltas=self.row_deltas, lease_holder=lease_holder,
            keep_running=window or 0.0,
            poll_interval=check_seconds(self.poll_interval, "poll_interval") if window else DEFAULT_POLL_INTERVAL,
            compact_deletes_at=self.compact_deletes_at, until_loaded=self.until_loaded)

    def job_args(self, lease_holder: str | None = None) -> list[str]:
        """The job's command line: its options as one JSON argument."""
        return ["--options", self.apply_options(lease_holder).to_json()]

    def execute(self, context: Context) -> dict[str, Any]:
        """Run the job; returns the pipeline, the state table and how many steps and rows were applied."""
        with fail_permanent_errors():
            # staging_root and pipeline are rendered by now: check them, then build the command line
            root = staging_path(check_staging_root(str(self.staging_root)))  # its file system is installed
            self.iceberg.check()
            check_pipeline_name(self.pipeline)
            check_table_map(self.table_map)
            window = check_seconds(self.keep_running, "keep_running", optional=True)
            check_seconds(self.poll_interval, "poll_interval")
            staging = staging_access(str(self.staging_root), self.iceberg, self.iceberg.spark_conf())
            lakehouse = self.lakehouse_identity()
            pending = pending_batches(root, str(self.pipeline), lakehouse)
            if self.skip_when_idle and window is None:  # a window waits for batches: it never skips
                self.skip_if_idle(pending, lakehouse, root)
            self.py_files = with_job_bundle(self.py_files)
            started = time.monotonic()
            with errors_recorded(root, str(self.pipeline), "apply", self.log.warning):
                result = self.run_spark_submit(context, staging)
            steps = result.get("steps", [])
            record_applied(root, str(self.pipeline), steps)
            if "result_missing" not in result:  # else the old marker stays: the next tick starts Spark
                write_marker(root, str(self.pipeline), lakehouse, result.get("seen", []), result.get("targets"))
            # the UI's chart of freshness (commit to queryable, per table; a window's job recorded each
            # round) and the metrics (docs/metrics.md)
            after_apply(root, str(self.pipeline), None if window is not None else
                        lambda: apply_entry(root, str(self.pipeline), steps, time.monotonic() - started),
                        self.log.warning, seconds=time.monotonic() - started)
            self._applied_steps = steps
            self._job_seconds = result.get("seconds")
            self._job_phases = result.get("phases", {})
            if self.asset_alias and context.get("outlet_events") is not None:  # absent when called by hand
                emit_table_assets(context, self.asset_alias, self.iceberg, str(self.pipeline), steps)
            return {
                "pipeline": str(self.pipeline),
                "state_table": f"{self.iceberg.catalog}.{self.iceberg.namespace}._pglogical_state",
                "steps": len(steps),
                "rows": sum(step["rows"] for step in steps),
                "tables": sorted({step["table"] for step in steps}),
                **({"window": result["window"]} if "window" in result else {}),
            }

    def run_spark_submit(self, context: Context, staging: LakehouseAccess | None = None) -> dict:
        """The apply as its own spark-submit; returns the job's result.

        :param staging: what Spark needs to reach an object-store staging root (:func:`staging_access`).
        """
        result_at = result_uri(str(self.staging_root), str(self.pipeline), "apply")
        access = job_access(self.iceberg, staging)  # credentials: never on the command line
        self.conf = jars_for_master({**access.public, **(self.conf or {}), RESULT_CONF: spark_uri(result_at),
                                     STAGING_FILE_MODE_CONF: f"{file_mode():o}"}, self._conn_id)
        self.application_args = self.job_args(lease_holder(context))
        given, given_env, self._hook = self.properties_file, self.env_vars, None  # the hook reads them when made
        self.env_vars = spark_environment(access, given_env, self._conn_id)
        with private_properties(access.private, given) as self.properties_file:
            try:
                super().execute(context)
            except Exception:
                # the job's own error, not the Spark provider's "Cannot execute: spark-submit …" (a
                # command line, which says nothing of why): a permanent one fails without retries
                error = read_job_error(result_at)
                if error is None:  # killed before it could say: the provider's error stands
                    raise
                if error.kind == LEASE_HELD:  # wrote nothing
                    applying = None if self.keep_running else window_applies(error.lease, str(self.pipeline))
                    if applying:  # a window that runs on applies this task's batches: nothing to do here
                        raise AirflowSkipException(applying) from None
                    raise ConcurrentApplyError(error.message, error.lease) from None  # retried
                raise SparkJobError.of("apply", error) from None
            finally:
                self.properties_file, self.env_vars = given, given_env
        try:
            return read_result(result_at, job="apply")
        except JobResultMissing as missing:  # the job ended well, so every commit landed (hadoop_files.write_result)
            self.log.warning("%s. The job succeeded, so its commits landed: reported as applied, without its "
                             "figures", missing)
            return {"steps": [], "result_missing": str(missing)}

    def lakehouse_identity(self) -> dict:
        """What the apply writes into (no credentials): a marker for another lakehouse means nothing."""
        return {"catalog": self.iceberg.catalog, "catalog_type": self.iceberg.catalog_type,
                "catalog_impl": self.iceberg.catalog_impl, "namespace": self.iceberg.namespace,
                "warehouse": self.iceberg.warehouse or default_warehouse(), "table_map": self.table_map or {}}

    def skip_if_idle(self, pending: list[str] | None, lakehouse: dict, root) -> None:
        """End as skipped, without spark-submit, when no committed batch is new to the lakehouse and
        every target table the last run left is still there."""
        if pending is None:
            self.log.info("no apply marker for this lakehouse yet: starting Spark to find what is pending")
            return
        if pending:
            self.log.info("%d committed batch(es) not applied yet (first %s): starting Spark", len(pending), pending[0])
            return
        targets = recorded_targets(root, str(self.pipeline), lakehouse)
        if targets is None:
            self.log.info("the apply marker records no target tables (an older version wrote it): starting Spark")
            return
        # a JDBC catalog is asked (a DROP TABLE leaves the files); a Hadoop catalog's local metadata file
        # is looked at; any other catalog is trusted to the marker (docs/lakehouse.md, "The idle tick")
        listed = catalog_metadata_locations(self.iceberg, targets)
        if listed is not None:
            gone = sorted(name for name, location in listed.items() if targets[name] and location is None)
        else:
            local = {name: location for name, location in targets.items()
                     if location and scheme_of(location) in ("", "file")}
            gone = sorted(name for name, location in local.items() if not storage_path(location).exists())
        if gone:
            self.log.warning("Iceberg table(s) %s are gone from the catalog or lost their metadata file since the "
                             "last apply (dropped?): starting Spark, which rebuilds them from staging", ", ".join(gone))
            return
        raise AirflowSkipException(
            f"nothing to apply: every committed batch of pipeline {self.pipeline} was applied to "
            f"{lakehouse['catalog']}.{lakehouse['namespace']} by an earlier run (apply marker under staging); "
            "Spark was not started"
        )

    def get_openlineage_facets_on_complete(self, task_instance):
        """Staged tables → the Iceberg tables this run changed (with their columns)."""
        from airflow_provider_pglogical.lineage import apply_lineage

        return apply_lineage(staging_path(str(self.staging_root)), str(self.pipeline),
                             self.iceberg.warehouse or default_warehouse(), self.iceberg.namespace,
                             getattr(self, "_applied_steps", []))


#: how long a keep-running window holding the lease must still run for another apply to leave its
#: batches to it: clocks of different hosts agree to within this
WINDOW_MARGIN_SECONDS = 30.0


def window_applies(lease: dict | None, pipeline: str, now: float | None = None) -> str | None:
    """Why an apply that met ``lease`` (held) has nothing to do, or None: the lease is a keep-running
    window's (``window_until``: the earliest it ends, ``spark/apply/lease.py``) that runs for at least
    :data:`WINDOW_MARGIN_SECONDS` more, so its last listing comes after every batch committed now."""
    until = (lease or {}).get("window_until")
    now = time.time() if now is None else now
    if not isinstance(until, (int, float)) or until < now + WINDOW_MARGIN_SECONDS:
        return None
    ends = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until))
    return (f"pipeline {pipeline!r}: the apply window of {lease.get('holder', 'another apply')} holds the lease "
            f"and runs until {ends} at least; it applies every batch committed before then, this task's "
            "included, so nothing is applied here. Should that window fail, its retry or the next apply "
            "applies them")


def lease_holder(context) -> str | None:
    """The task instance, which a second apply of the pipeline shows as the lease's holder."""
    ti = context.get("ti") if context else None
    if ti is None:
        return None
    return f"task {ti.dag_id}.{ti.task_id}, run {ti.run_id}, try {ti.try_number}"


def iceberg_table_asset(catalog: str, namespace: str, table: str) -> Asset:
    """The Airflow Asset of one Iceberg table: ``iceberg://<catalog>/<namespace>/<table>``.

    Schedule a downstream DAG on it: ``schedule=[iceberg_table_asset("lake", "shop", "public__orders")]``.
    """
    return Asset(uri=f"iceberg://{catalog}/{namespace}/{table}", group="iceberg")


def emit_table_assets(context, alias: str, iceberg: IcebergConfig, pipeline: str, steps: list[dict]) -> list[Asset]:
    """Add one asset event per changed target table to the alias; returns the assets."""
    by_target: dict[str, dict] = {}
    for step in steps:
        entry = by_target.setdefault(step["target"], {"pipeline": pipeline, "source_table": step["table"],
                                                      "steps": 0, "rows": 0})
        entry["steps"] += 1
        entry["rows"] += step["rows"]
        entry["batch"] = step["batch"]
        parsed = parse_batch_name(step["batch"])
        entry["lsn"] = str(parsed[1]) if parsed else None
    assets = []
    for target, extra in sorted(by_target.items()):
        asset = iceberg_table_asset(iceberg.catalog, iceberg.namespace, target)
        context["outlet_events"][AssetAlias(alias)].add(asset, extra=extra)
        assets.append(asset)
    return assets
