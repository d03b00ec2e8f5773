"""Keep the Iceberg tables the apply job writes small and fast (a PySpark job; no Airflow import).

    spark-submit maintenance.py --catalog lake --namespace sales [--table orders ...] \\
        [--min-input-files 5] [--delete-file-threshold 1] [--older-than-hours 24] [--retain-last 5] \\
        [--orphan-older-than-hours 72] [--concurrency 4] [--no-compact-data-files] [--no-compact-delete-files] \\
        [--no-rewrite-manifests] [--no-expire-snapshots] [--no-remove-orphan-files]

For each table (default: every table of the namespace, the ``_pglogical_state`` table included)
it calls Iceberg's procedures in the order that frees most (:mod:`.housekeeping`):
``rewrite_data_files`` (compacts the small files a MERGE leaves, and rewrites the data files that
merge-on-read deletes apply to; then the equality deletes an earlier version's row deltas left,
now applying to nothing, are removed: :mod:`.dead_deletes`),
``rewrite_position_delete_files`` (rewrites every delete file, dropping the deletes of data files
that are gone; skipped on a table with a list or map column, where Iceberg 1.10's procedure fails:
:mod:`.position_delete_rewrite`), ``rewrite_manifests`` (one commit adds one manifest; regroup them),
``expire_snapshots`` (removes the snapshots, and the files only they referenced, older than the
cut-off, keeping ``retain_last`` and never the newest one an apply committed nor any after it:
:mod:`.pipeline_commits`), then ``remove_orphan_files`` (files no snapshot references,
older than a cut-off of at least a day, so a write still in flight keeps its files).

It may run beside an apply (the streaming pipeline's housekeeping DAG runs it beside the windows):
every commit of either validates what it read, so when the two meet on the same files one of them
commits nothing. A step of this job that meets another commit (Iceberg's ``ValidationException``,
or a commit that lost every retry) is reported as ``{"conflict": …}`` and left for the next run;
the table's other steps go on. An apply round that meets one of this job's commits is applied again
by its window (``apply_window.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor, wait

from airflow_provider_pglogical.spark.common.session import activate_in_thread, small_shuffles, tune_session
from airflow_provider_pglogical.spark.housekeeping.steps import (
    DEFAULT_CONCURRENCY,
    Housekeeping,
    HousekeepingError,
    procedure_call,
)
from airflow_provider_pglogical.spark.housekeeping.dead_deletes import remove_dead_deletes
from airflow_provider_pglogical.spark.housekeeping.pipeline_commits import newest_pipeline_commit
from airflow_provider_pglogical.spark.housekeeping.position_delete_rewrite import rewrite_blocked
from airflow_provider_pglogical.spark.common.identifiers import qualified, quote
from airflow_provider_pglogical.spark.common.java_classes import java_class

RESULT_PREFIX = "PGLOGICAL_MAINTENANCE_RESULT "
#: Iceberg's exceptions of a commit refused because another writer committed first
CONFLICTS = ("org.apache.iceberg.exceptions.ValidationException", "org.apache.iceberg.exceptions.CommitFailedException")
log = logging.getLogger("pglogical.maintenance")
#: how many orphan file paths the summary lists (it counts them all)
ORPHAN_SAMPLE = 5


def run(spark, catalog: str, namespace: str, tables: list[str] | None,
        housekeeping: Housekeeping | None = None, concurrency: int = DEFAULT_CONCURRENCY) -> dict:
    """Run the switched-on procedures on each table; returns what each reported, per table.

    Tables are independent (each procedure commits to its own table), so ``concurrency`` of them
    are kept at once, each table's steps in order: a small table's procedures are mostly the
    driver's planning and commits, which leave the executors idle."""
    housekeeping = housekeeping or Housekeeping()
    if not tables:
        rows = spark.sql(f"SHOW TABLES IN {qualified(catalog, namespace)}").collect()
        tables = sorted(row.tableName for row in rows if not row.isTemporary)

    def keep(table: str) -> dict:
        activate_in_thread(spark)  # refresh's table lookup runs in this worker's own JVM thread
        results = {}
        for step in housekeeping.steps():
            name = f"{qualified(catalog, namespace)}.{quote(table)}"
            if step == "rewrite_position_delete_files" and (skipped := rewrite_blocked(spark, name)):
                results[step] = {"skipped": skipped}
                continue
            loaded = refresh(spark, name)
            # a killed apply's landed commit is found by its snapshot: never expired (pipeline_commits.py)
            keep_from = newest_pipeline_commit(loaded) if step == "expire_snapshots" else None
            now = dt.datetime.now(dt.timezone.utc)  # cut-offs count back from the call, not the job's start
            call = procedure_call(step, catalog, qualified(namespace, table), housekeeping, now, keep_from)
            try:
                results[step] = report(step, spark.sql(call).collect())
                if step == "rewrite_data_files":  # delete files it left applying to nothing
                    results["remove_dead_deletes"] = remove_dead_deletes(spark, name)
            except Exception as error:
                conflict = commit_conflict(error)
                if conflict is None:
                    raise
                log.warning("%s.%s: %s met another writer's commit and committed nothing; left for the next run: %s",
                            namespace, table, step, conflict)
                results.setdefault(step, {"conflict": conflict})
        return results

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="pglogical-maintenance") as pool:
        futures = {table: pool.submit(keep, table) for table in tables}
        wait(futures.values())
        # every table ran (committed or failed) before the first failure, in table order, is raised
        results = {table: future.result() for table, future in futures.items()}
    return {"namespace": namespace, "steps": housekeeping.steps(), "tables": results}


def commit_conflict(error: BaseException) -> str | None:
    """The message of the Iceberg conflict behind a procedure's error (a ``ValidationException``, or
    a ``CommitFailedException`` after the commit's retries), or None when it is something else."""
    cause = getattr(error, "java_exception", None)
    while cause is not None:
        if cause.getClass().getName() in CONFLICTS:
            return f"{cause.getClass().getSimpleName()}: {cause.getMessage()}"
        cause = cause.getCause()
    return None


def refresh(spark, name: str):
    """Bring the catalog's cached copy of the table up to its latest commit before a procedure; returns it.

    Spark's Iceberg catalog keeps each table it loaded (``cache-enabled``, the default), and a
    procedure starts from that copy without refreshing it. ``expire_snapshots`` finds the files to
    delete, and counts what it expired, from the snapshots the copy knows; its commit, though, expires
    from the table's latest metadata. So when another writer (an apply) committed since the table's
    first step loaded it, the snapshots of those commits that the expiry removed were reported as
    nothing and their files left behind (``remove_orphan_files`` would take them only days later)."""
    table = java_class(spark, "org.apache.iceberg.spark.Spark3Util").loadIcebergTable(spark._jsparkSession, name)
    table.refresh()
    return table


def report(step: str, rows: list) -> dict:
    """A procedure's output as counts: ``remove_orphan_files`` returns one row per file removed."""
    if step == "remove_orphan_files":
        paths = [row.orphan_file_location for row in rows]
        return {"orphan_files_count": len(paths), "orphan_files": paths[:ORPHAN_SAMPLE]}
    return rows[0].asDict() if rows else {}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default="lake")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--table", action="append", dest="tables", help="a table of the namespace (repeatable)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="tables maintained at once")
    Housekeeping.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        args.housekeeping = Housekeeping.from_args(args)
    except HousekeepingError as error:  # name the option as it is spelt here
        parser.error(str(error).replace(error.option, "--" + error.option.replace("_", "-"), 1))
    return args


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    args = parse_args(argv)
    spark = SparkSession.builder.appName(f"pglogical-maintenance-{args.namespace}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    tune_session(spark, small_shuffles(spark.sparkContext.defaultParallelism))
    summary = run(spark, args.catalog, args.namespace, args.tables, args.housekeeping, args.concurrency)
    print(RESULT_PREFIX + json.dumps(summary, default=str), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
