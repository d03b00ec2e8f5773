"""The snapshot copy as a Spark job: each work unit is a Spark task that imports the exported snapshot.

The operator (``operators/spark_copy.py``) plans the work units as for a local copy
(``snapshot.copy_tables``), writes the plan here (:func:`plan_document`, no secrets) and
spark-submits this file while it holds the session that exported the snapshot. The driver runs one
Spark job per unit, at most ``parallelism`` at once; each task opens its own session with
``SET TRANSACTION SNAPSHOT`` and runs the same code as the local copy (``snapshot._copy_unit``:
COPY streamed through a pipe into Arrow and Parquet, memory bounded by a few chunks), writing the
unit's part file (its number fixed by the plan) into the batch directory. The driver prints
progress per finished unit and writes the file entries to the result file; the operator adds them
to the manifest and commits the batch. Nothing here imports Airflow; the executors need psycopg2
and pyarrow, and the staging root at the same path as the operator (a local or shared file system).

The publisher's libpq keywords reach the driver in the Spark property :data:`CONNECTION_CONF`
(from the private 0600 properties file; its name matches ``spark.redaction.regex``) and the
executors inside the tasks' closures: never on a command line, in a log or in the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from airflow_provider_pglogical.capture import snapshot
from airflow_provider_pglogical.management.published import ColumnInfo, ResolvedTable
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.contract import STAGING_FILE_MODE_CONF, STAGING_FILE_MODE_ENV
from airflow_provider_pglogical.staging.layout import BatchManifest
from airflow_provider_pglogical.staging.typemap import map_column

#: the Spark property holding the publisher's libpq keywords as JSON (private properties file only)
CONNECTION_CONF = "spark.pglogical.copy.connection.password"
#: what the driver prints before each progress line
PROGRESS_PREFIX = "PGLOGICAL_COPY "


def plan_document(plan: snapshot.CopyPlan, writer: BatchWriter, root: str, snapshot_name: str,
                  parallelism: int, result: str) -> dict:
    """The plan the job reads: units with their part numbers, the batch's manifest, no secrets.

    :param root: the staging root as a local path the executors reach.
    """
    tables = {u.table.qualified_name: u.table for u in plan.units}
    parts: dict[str, int] = {}
    units = []
    for unit in plan.units:
        name = unit.table.qualified_name
        parts[name] = parts.get(name, -1) + 1
        units.append({"table": name, "source": list(unit.source), "first_block": unit.first_block,
                      "end_block": unit.end_block, "blocks": unit.blocks, "part": parts[name]})
    return {
        "root": root, "manifest": json.loads(writer.manifest.to_json()), "snapshot": snapshot_name,
        "table_order": list(writer.manifest.tables),  # the manifest's JSON sorts them; file names follow this
        "parallelism": parallelism, "result": result, "trusted_utf8": plan.trusted_utf8,
        "extra_where": plan.extra_where, "staged_as": plan.staged_as, "units": units,
        "tables": {name: {**asdict(table), "publish": sorted(table.publish)} for name, table in tables.items()},
    }


def _resolved(raw: dict) -> ResolvedTable:
    return ResolvedTable(**{**raw, "columns": [ColumnInfo(**c) for c in raw["columns"]],
                            "publish": set(raw["publish"])})


def work_units(document: dict) -> list[tuple[snapshot.WorkUnit, int]]:
    """The plan's units (with their part numbers), as the local copy plans them."""
    tables = {name: _resolved(raw) for name, raw in document["tables"].items()}
    return [(snapshot.WorkUnit(tables[u["table"]], tuple(u["source"]), u["first_block"], u["end_block"], u["blocks"]),
             u["part"]) for u in document["units"]]


def _writer(document: dict) -> BatchWriter:
    """A writer of the plan's batch whose tables have the operator's positions (so its file names)."""
    manifest = BatchManifest.from_json(json.dumps(document["manifest"]))
    tables, manifest.tables = manifest.tables, {}
    writer = BatchWriter(Path(document["root"]), manifest)
    for table in (tables[name] for name in document["table_order"]):
        table.files, table.rows = [], 0
        writer.add_table(table)
    return writer


def copy_unit(document: dict, index: int, connect_kwargs: dict) -> dict:
    """Run one unit of the plan (on an executor): its file entry, row and byte counts, or its error."""
    unit, part = work_units(document)[index]
    name = unit.table.qualified_name
    staged_as = document["staged_as"][name]
    writer = _writer(document)
    mapping = {c.name: map_column(c) for c in writer.manifest.tables[staged_as].columns}
    progress = snapshot.Progress([unit], lambda line: None, every=float("inf"))
    started = time.monotonic()
    try:
        conn = snapshot._session(connect_kwargs, document["snapshot"])
        try:
            snapshot._copy_unit(conn, unit, writer, document["extra_where"].get(name), progress,
                                document["trusted_utf8"], mapping, staged_as, part)
        finally:
            conn.close()
    except Exception as err:  # noqa: BLE001 - reported to the driver, which fails the job with it
        return {"unit": index, "error": {"type": type(err).__name__, "message": str(err),
                                         "permanent": bool(getattr(err, "permanent", False))}}
    return {"unit": index, "table": name, "staged_as": staged_as, "file": writer.manifest.tables[staged_as].files[0].to_dict(),
            "rows": progress.rows[name], "bytes": progress.bytes[name], "seconds": time.monotonic() - started,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_units(document: dict, run_one: Callable[[int], dict], report: Callable[[str], None],
              cancel: Callable[[], None] = lambda: None) -> dict:
    """Run every unit through ``run_one`` (a Spark job each), ``parallelism`` at once, reporting
    progress per finished unit; at the first failed unit, ``cancel`` stops the running ones and
    no other starts. Returns the job's result: the file entries, or the first error."""
    pairs = work_units(document)
    progress = snapshot.Progress([unit for unit, _ in pairs], report, every=0.0)
    report(f"copying {len(progress.rows)} table(s) in {len(pairs)} work unit(s) on Spark, "
           f"{document['parallelism']} at once")
    done: list[dict] = []
    stop = threading.Event()

    def guarded(index: int) -> dict:
        if stop.is_set():
            return {"unit": index, "skipped": True}  # a unit failed: the batch will not be committed
        try:
            outcome = run_one(index)
        except BaseException:
            stop.set()
            raise
        if "error" in outcome:
            stop.set()
        return outcome

    with ThreadPoolExecutor(max(1, int(document["parallelism"]))) as pool:
        pending = {pool.submit(guarded, index) for index in range(len(pairs))}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                failure = future.exception()
                outcome = {"unit": -1} if failure else future.result()
                if failure or "error" in outcome:
                    cancel()  # the running units' jobs: their threads end, so the pool's exit is quick
                    if failure:
                        raise failure
                    unit = pairs[outcome["unit"]][0]
                    return {"error": {**outcome["error"], "table": unit.table.qualified_name,
                                      "blocks": [unit.first_block, unit.end_block]}, "files": done}
                if outcome.get("skipped"):
                    continue
                done.append(outcome)
                unit = pairs[outcome["unit"]][0]
                progress.add(outcome["table"], outcome["rows"], outcome["bytes"], blocks_done=unit.blocks)
    return {"files": done}


def _write_result(path: str, result: dict) -> None:
    partial = f"{path}.tmp"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump(result, out)
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: ``copy_job.py --plan <local path>``."""
    from pyspark.sql import SparkSession

    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--plan", required=True)
    plan_path = args.parse_args(argv).plan
    document = json.loads(Path(plan_path).read_text())
    spark = SparkSession.builder.appName("pglogical-snapshot-copy").getOrCreate()
    context = spark.sparkContext
    connect_kwargs = json.loads(context.getConf().get(CONNECTION_CONF))
    mode = context.getConf().get(STAGING_FILE_MODE_CONF, None)
    if mode:
        os.environ[STAGING_FILE_MODE_ENV] = mode
    lock = threading.Lock()

    def report(line: str) -> None:
        with lock:
            print(PROGRESS_PREFIX + line, flush=True)

    def run_one(index: int) -> dict:
        context.setJobDescription(f"copy unit {index}")

        def task(_: Any) -> Any:
            if mode:
                os.environ[STAGING_FILE_MODE_ENV] = mode
            yield copy_unit(document, index, connect_kwargs)

        return context.parallelize([index], 1).mapPartitions(task).collect()[0]

    try:
        result = run_units(document, run_one, report, cancel=context.cancelAllJobs)
    except Exception as err:  # noqa: BLE001 - the operator reads it from the result file
        result = {"error": {"type": type(err).__name__, "message": str(err)[-4000:], "permanent": False}}
    _write_result(document["result"], result)
    spark.stop()
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
