"""Where one table's step goes in a warm Spark session: the job's parts and each Spark job.

    python bench/bench_step_profile.py [--tables 1] [--ticks 4] [--concurrency 4] [--conf KEY=VALUE ...] [--cpu]
                                       [--updates same|spread] [--lakehouse local|s3]

A pipeline of N tables (``bench_tick``'s: 1,000 rows, half with an 8 kB value left unchanged, 100
changes per table per tick with key changes) applied by ``apply_changes.run`` in one long-lived
session. From the third tick on it prints, per tick, the seconds
spent in the job's parts (the reduction with its aggregate, the MERGE statement, the state read
and commit, DataFrame calls) and every Spark job the tick ran, with its duration, stages and
tasks (from Spark's status REST API). ``--conf`` sets Spark properties on the session, for an
A/B against a run without them. ``--cpu`` prints, per tick, the CPU seconds of the driver JVM
and of this process, and the JVM's by thread name (threads that ended during the tick, such as
py4j's per-thread connections, are in the JVM's total only). ``--lakehouse s3`` profiles the
production shape instead (``bench_tick``'s: moto's S3 server on loopback for the warehouse and
staging, Iceberg's JDBC catalog in the bench cluster), with the job's planning parts and the
catalog's table loads timed too, and, per tick, the CPU seconds of the S3 server's process (a
local moto is no real S3: its CPU shares the machine with Spark's).

``--delete-files`` (with e.g. ``--ticks 500``) counts instead each table's live delete files after
every round (its current snapshot's ``total-delete-files``) and prints how they grow: the
figure "delete files per table after 500 streaming rounds" of docs/benchmarks.md, with the apply's
own compaction at ``--compact-deletes-at`` (its default; 0 switches it off) and no housekeeping.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import bench_tick  # noqa: E402  (prepares the environment)
from bench.bench_soak import quiet_logs, spark_session  # noqa: E402
from airflow_provider_pglogical.spark.apply import keyed, lakehouse_tables, lease, state_table, steps  # noqa: E402
from airflow_provider_pglogical.spark.common import hadoop_files  # noqa: E402
from airflow_provider_pglogical.spark.paths import merge  # noqa: E402
from airflow_provider_pglogical.spark.jobs import apply_changes  # noqa: E402
from airflow_provider_pglogical.lakehouse.staging_roots import spark_uri  # noqa: E402
from airflow_provider_pglogical.spark.row_delta import driver_commits, row_deltas  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402
from airflow_provider_pglogical.staging.contract import DEFAULT_COMPACT_DELETES_AT, DEFAULT_CONCURRENCY  # noqa: E402

UI_PORT = 4077
TIMES: dict[str, list[float]] = collections.defaultdict(list)


def timed(owner, name: str, label: str | None = None) -> None:
    """Wrap ``owner.name`` so that each call's seconds go to ``TIMES[label or name]``."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            TIMES[label or name].append(time.perf_counter() - started)

    setattr(owner, name, wrapper)


def instrument() -> None:
    from pyspark.sql import dataframe, session

    timed(state_table.StateTable, "read_state")
    timed(state_table.StateTable, "write_state")
    timed(lakehouse_tables.Lakehouse, "ensure_table")
    timed(steps.StepApplier, "read_batch")
    timed(keyed, "reduce_changes")
    timed(merge, "fetch_moved")
    timed(dataframe.DataFrame, "first", "DataFrame.first (the batch's aggregate)")
    timed(row_deltas.RowDeltas, "apply", "row delta: whole step")
    timed(row_deltas.RowDeltas, "_read_parquet", "row delta: read staged files")
    timed(row_deltas.RowDeltas, "_lakehouse_values", "row delta: kept values from the rows read")
    timed(row_deltas, "lookup_rows", "row delta: the replaced rows read through Iceberg's reader")
    timed(hadoop_files.Staging, "read_bytes", "staging: read a file's bytes")
    timed(driver_commits.DriverCommits, "load", "row delta: load the table")
    timed(driver_commits.DriverCommits, "_write", "row delta: write a file")
    timed(driver_commits.DriverCommits, "row_delta", "row delta: write and commit")
    timed(driver_commits.DriverCommits, "_metrics", "row delta: read a written file's metrics")
    timed(driver_commits.DriverCommits, "_position_deletes", "row delta: write the position delete file")
    timed(driver_commits, "validated_commit", "commit (Iceberg: manifests, metadata, catalog swap)")
    timed(lakehouse_tables.Lakehouse, "iceberg_table", "catalog: load a table")
    timed(lakehouse_tables.Lakehouse, "metadata_locations", "planning: the targets' metadata files")
    timed(hadoop_files.Staging, "committed", "staging: list committed batches")
    timed(hadoop_files.Staging, "read_manifest", "staging: read a manifest")
    timed(hadoop_files.Staging, "damaged_files", "planning: check the staged files (hashes)")
    timed(apply_changes, "prove_staging", "planning: prove staging")
    timed(apply_changes, "check_run", "planning: check identities")
    timed(apply_changes, "apply_retention", "retention")
    timed(lease.ApplyLease, "acquire", "lease: acquire")
    sql = session.SparkSession.sql

    def statement(self, query, *args, **kwargs):
        started = time.perf_counter()
        try:
            return sql(self, query, *args, **kwargs)
        finally:
            TIMES["sql " + " ".join(query.split()[:2])].append(time.perf_counter() - started)

    session.SparkSession.sql = statement


def session(warehouse: Path, conf: dict[str, str], pipeline=None):
    """The long-lived session of the soak benchmark, with Spark's UI (its REST API lists the jobs);
    with ``pipeline`` (an S3 one) the session reaches its S3 warehouse, catalog and staging as
    the apply task's job does (its public properties, then its secrets at run time)."""
    ui = {"spark.ui.enabled": "true", "spark.ui.port": str(UI_PORT)}
    if pipeline is None:
        return spark_session(warehouse, "2g", {**ui, **conf}, "pglogical-step-profile")
    from airflow_provider_pglogical.lakehouse.lakehouse_access import job_access
    from airflow_provider_pglogical.lakehouse.staging_roots import staging_access
    from tests.support.spark_jobs import session_jars, set_private

    iceberg = pipeline.iceberg
    access = job_access(iceberg, staging_access(pipeline.staging, iceberg, iceberg.spark_conf()))
    spark = spark_session(warehouse, "2g", {**access.public, "spark.jars": session_jars(), **ui, **conf},
                          "pglogical-step-profile")
    set_private(spark, access.private)
    return spark


def spark_jobs(spark) -> list[dict]:
    # the UI's own address: another Spark on the machine may hold UI_PORT, and Spark takes the next
    url = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/jobs"
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def seconds(job: dict) -> float:
    def parse(stamp: str) -> datetime:
        return datetime.strptime(stamp.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f")

    return (parse(job["completionTime"]) - parse(job["submissionTime"])).total_seconds()


def jvm_process():
    """The driver JVM this process started (local mode: its child)."""
    import psutil

    return next(p for p in psutil.Process().children(recursive=True) if "java" in p.name())


def thread_cpu(pid: int) -> collections.Counter:
    """CPU seconds so far of each live thread of ``pid``, summed by name (digits folded)."""
    import os
    import re

    seconds = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        seconds[re.sub(r"\d+", "#", name)] += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=1)
    parser.add_argument("--ticks", type=int, default=4)
    parser.add_argument("--conf", action="append", default=[], help="a Spark property KEY=VALUE (repeatable)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help="tables applied at once (1: the parts' times add up to the step's)")
    parser.add_argument("--updates", default="same", choices=["same", "spread"],
                        help="bench_tick's workload: the same rows updated every tick, or rows drawn anew")
    parser.add_argument("--cpu", action="store_true", help="print each tick's CPU seconds by process and JVM thread")
    parser.add_argument("--lakehouse", default="local", choices=bench_tick.LAKEHOUSES,
                        help="local disk (Hadoop catalog), or s3: moto's S3 server and a JDBC catalog")
    parser.add_argument("--delete-files", action="store_true",
                        help="count each table's delete files after every round (no per-part profile)")
    parser.add_argument("--compact-deletes-at", type=int, default=DEFAULT_COMPACT_DELETES_AT,
                        help="the apply's compaction threshold (0: off)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if args.tiny:  # tick 3 is the first one profiled
        args.tables, args.ticks, args.cpu = 1, 3, True
    conf = dict(item.split("=", 1) for item in args.conf)
    quiet_logs()
    instrument()
    with tempfile.TemporaryDirectory() as tmp, bench_tick.cluster("bench_profile") as pg:
        tmp_path = Path(tmp)
        pg.create_database("profile")
        names = bench_tick.create_tables(pg, "profile", args.tables)
        s3 = bench_tick.s3_lakehouse(pg) if args.lakehouse == "s3" else None
        pipeline = bench_tick.Pipeline(pg, "profile", tmp_path, "profile", args.lakehouse)
        pipeline.sync()
        spark = session(tmp_path / "warehouse-profile", conf, pipeline if s3 else None)
        staging = spark_uri(pipeline.staging)
        lake = {"catalog": pipeline.iceberg.catalog, "namespace": pipeline.iceberg.namespace}
        apply_changes.run(spark, ApplyOptions(staging, "p", **lake))  # the snapshot
        walls: list[float] = []
        deletes: list[list[int]] = []  # per round, each table's live delete files
        targets = [row.tableName for row in spark.sql(f"SHOW TABLES IN {lake['catalog']}.{lake['namespace']}").collect()
                   if not row.tableName.startswith("_")]
        for tick in range(1, args.ticks + 1):
            bench_tick.change_tables(pg, "profile", names, tick, args.updates)
            pipeline.pull()
            seen = {job["jobId"] for job in spark_jobs(spark)}
            TIMES.clear()
            if args.cpu:
                jvm = jvm_process()
                cpu_before = (sum(jvm.cpu_times()[:2]), time.process_time(), thread_cpu(jvm.pid))
            server_cpu, requests = s3_server_cpu(s3), s3a_requests(spark, pipeline)
            started = time.perf_counter()
            result = apply_changes.run(spark, ApplyOptions(staging, "p", **lake, concurrency=args.concurrency,
                                                           compact_deletes_at=args.compact_deletes_at))
            wall = time.perf_counter() - started
            walls.append(wall)
            print(f"tick {tick}: {wall:.2f} s, phases {result.get('phases')}"
                  + (f"; the S3 server's CPU {s3_server_cpu(s3) - server_cpu:.2f} s" if s3 else ""), flush=True)
            if s3:
                requests = s3a_requests(spark, pipeline) - requests
                print("   S3A requests (the driver's file system): "
                      + ", ".join(f"{name} {count}" for name, count in sorted(requests.items()) if count), flush=True)
            if args.cpu:
                threads = thread_cpu(jvm.pid)
                threads.subtract(cpu_before[2])
                print(f"   CPU: driver JVM {sum(jvm.cpu_times()[:2]) - cpu_before[0]:.2f} s, this process "
                      f"{time.process_time() - cpu_before[1]:.2f} s; JVM threads: "
                      + ", ".join(f"{name} {seconds:.2f}" for name, seconds in threads.most_common(12)), flush=True)
            if args.delete_files:
                deletes.append(delete_file_counts(spark, lake, targets))
                print(f"   delete files per table after round {tick}: {deletes[-1]}", flush=True)
                continue
            if tick < 3:  # the session's first changes: cold
                continue
            for part, runs in sorted(TIMES.items()):
                print(f"   {part}: {sum(runs):.3f} s over {len(runs)} call(s)")
            for job in sorted((j for j in spark_jobs(spark) if j["jobId"] not in seen), key=lambda j: j["jobId"]):
                print(f"   job {job['jobId']:4d} {seconds(job):6.3f} s, {len(job['stageIds'])} stage(s), "
                      f"{job['numTasks']:3d} tasks: {job['name'][:80]}")
        print(f"rounds: {len(walls)}, median from round 3 on {statistics.median(walls[2:] or walls):.3f} s", flush=True)
        if args.delete_files:
            print_delete_growth(deletes, args.compact_deletes_at)
        print_delete_files(spark, lake)
        spark.stop()
        if s3 is not None:
            s3.close(False)


def delete_file_counts(spark, lake: dict, names: list[str]) -> list[int]:
    """Each table's live delete files now, from its current snapshot's summary (no file is opened)."""
    from airflow_provider_pglogical.spark.housekeeping.delete_compaction import delete_file_count

    catalog = spark.sparkContext._jvm.org.apache.iceberg.spark.Spark3Util
    return [delete_file_count(catalog.loadIcebergTable(spark._jsparkSession, f"{lake['catalog']}.{lake['namespace']}.{name}"))
            for name in names]


def print_delete_growth(deletes: list[list[int]], threshold: int) -> None:
    """How the tables' delete files grew over the rounds: the most any table held after a round,
    the count at every 10th of the run, the rounds whose apply compacted (the count fell)."""
    if not deletes:
        return
    worst = [max(counts) for counts in deletes]
    compactions = sum(1 for before, after in zip(deletes, deletes[1:])
                      for b, a in zip(before, after) if a < b)
    marks = sorted({max(1, len(deletes) * i // 10) for i in range(1, 11)})
    print(f"delete files per table over the rounds (compaction at {threshold or 'off'}): most after a round "
          f"{max(worst)}, after the last round {deletes[-1]} (max {worst[-1]}), mean "
          f"{statistics.mean(worst):.1f}; compactions {compactions}", flush=True)
    print("   after round: " + ", ".join(f"{r}: {worst[r - 1]}" for r in marks), flush=True)


def print_delete_files(spark, lake: dict) -> None:
    """Each table's live delete files now, by kind (position, equality) and in all (the rounds'
    row deltas add one each; the apply's own compaction folds them in at its threshold)."""
    namespace = f"{lake['catalog']}.{lake['namespace']}"
    counts = []
    for row in spark.sql(f"SHOW TABLES IN {namespace}").collect():
        if row.tableName.startswith("_"):
            continue
        kinds = {r.content: r.n for r in spark.sql(
            f"SELECT content, count(*) AS n FROM {namespace}.{row.tableName}.delete_files GROUP BY content").collect()}
        counts.append((row.tableName, kinds.get(1, 0), kinds.get(2, 0)))
    print("delete files per table (position, equality): "
          + ", ".join(f"{name} {position}/{equality}" for name, position, equality in counts), flush=True)
    if counts:
        print(f"   max {max(p + e for _, p, e in counts)}, equality in all {sum(e for _, _, e in counts)}", flush=True)


def s3a_requests(spark, pipeline) -> collections.Counter:
    """S3A's request counters so far (its storage statistics: HEAD, LIST, PUT, DELETE, GET and the
    rest) for the pipeline's bucket; an empty count on local disk."""
    counts = collections.Counter()
    if not pipeline.iceberg.on_s3():
        return counts
    jvm = spark.sparkContext._jvm
    uri = jvm.java.net.URI(pipeline.iceberg.warehouse)
    stats = jvm.org.apache.hadoop.fs.FileSystem.get(uri, spark.sparkContext._jsc.hadoopConfiguration()).getStorageStatistics()
    entries = stats.getLongStatistics()
    while entries.hasNext():
        entry = entries.next()
        name = entry.getName()
        if name.startswith(("object_", "op_", "directories_", "files_")) or "request" in name:
            counts[name] = entry.getValue()
    return counts


def s3_server_cpu(lake) -> float:
    """CPU seconds so far of the S3 server's process (user and system), 0 without one."""
    if lake is None:
        return 0.0
    import psutil

    times = psutil.Process(lake.s3.process.pid).cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    main()
