"""Snapshot benchmark: our initial sync vs raw COPY and dlt's sql_database, on one table, one run.

    .venv/bin/python bench/bench_snapshot.py --rows 5000000 [--dlt-python bench/.venv-dlt/bin/python] [--iceberg]

With ``--spark-cluster 1,2``, also the copy run as Spark tasks (``copy_on_spark``) on a standalone
cluster on loopback of 1, then 2 workers of one core each, started per worker count (its start is
not timed; each run's spark-submit is); peak memory of the executors' Python workers from the batch
manifest. With ``--iceberg``, also from the exported snapshot to a queryable Iceberg table: the snapshot
(one worker) then the apply job by spark-submit (the operators' command line, local[2]), both
timed, into a fresh warehouse each run.

Baselines in the same run: ``psql -c "COPY t TO STDOUT" > /dev/null`` (raw COPY), and, when a
Python with dlt and connectorx is given, dlt's ``sql_database`` source with the pyarrow and the
connectorx backends into local Parquet (``bench/dlt_baseline.py``; see docs/benchmarks.md for
how that virtualenv is made: dlt is not a dependency of the provider).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from psycopg2 import sql

from common import client_cpu, cluster, peak_rss_growth, psql, report, server_cpu, timed

from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402

TABLE = """
CREATE TABLE bench(id bigint PRIMARY KEY, customer int, status text, total numeric(12,2),
                   created timestamptz, note text, flag bool);
INSERT INTO bench SELECT g, g % 100000, (ARRAY['new','paid','shipped'])[1 + g % 3], (g % 100000) / 100.0,
       timestamptz '2024-01-01' + g * interval '1 second', md5(g::text), g % 2 = 0
  FROM generate_series(1, {rows}) g;
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dlt-python", default=None, help="a Python with dlt[parquet] and connectorx installed")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    parser.add_argument("--iceberg", action="store_true", help="also snapshot -> queryable Iceberg (spark-submit)")
    parser.add_argument("--spark-cluster", default=None,
                        help="also the copy as Spark tasks on a standalone cluster of these worker counts, e.g. 1,2")
    parser.add_argument("--workers", default="1,2", help="ctid worker counts of the snapshot-only runs")
    parser.add_argument("--baseline", default=None,
                        help="with --iceberg: also apply the same staged snapshot with this checkout's job (before/after)")
    parser.add_argument("--c1", action="store_true", help="with --iceberg: also apply with the driver JVM at C1 only")
    parser.add_argument("--overlap", action="store_true",
                        help="with --iceberg: also the apply started beside the snapshot (--keep-running "
                             "--until-loaded, as IcebergApplyOperator(until_loaded=True) runs it), timed from the "
                             "start of both to the apply's end")
    parser.add_argument("--cds", default=None, metavar="ARCHIVE",
                        help="with --iceberg: also apply at C1 only with this class-data-sharing archive "
                             "(written by an untimed apply first when it does not exist)")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.repeat = 2000, 1
    with cluster("benchsnap") as pg:
        pg.execute(sql.SQL(TABLE).format(rows=sql.Literal(args.rows)))
        pg.execute("VACUUM ANALYZE bench")
        pg.execute("CREATE PUBLICATION pub FOR TABLE bench")
        hook = PgLogicalHook(postgres_conn_id="benchsnap")
        results = []
        cpu: dict[str, tuple[float, float]] = {}
        memory: dict[str, float] = {}

        def measured(name: str, fn) -> float:
            """Median wall time of ``fn``; its mean client and server CPU seconds per run, and the
            most this process's resident memory grew during any run."""
            client, server = client_cpu(), server_cpu(pg)
            runs = []
            for _ in range(args.repeat):
                with peak_rss_growth() as grown:
                    runs.append(timed(fn, 1)[0])
                memory[name] = max(memory.get(name, 0.0), grown())
            time.sleep(0.5)  # let the postmaster reap the sessions that just closed
            cpu[name] = ((client_cpu() - client) / args.repeat, (server_cpu(pg) - server) / args.repeat)
            return statistics.median(runs)

        name = "raw COPY TO STDOUT (psql > /dev/null)"
        raw = measured(name, lambda: psql(pg, "COPY bench TO STDOUT"))
        results.append((name, raw, "1.00x raw"))
        for workers in [int(n) for n in args.workers.split(",") if n]:
            def snapshot():
                slot = f"bench_{uuid.uuid4().hex[:8]}"
                staging = tempfile.mkdtemp(prefix="bench-staging-")
                try:
                    run_initial_sync(hook, slot=slot, publications=["pub"], root=ObjectStoragePath(f"file://{staging}"),
                                     pipeline="bench", parallelism=workers, report=lambda m: None)
                finally:
                    hook.drop_slot(slot)
                    shutil.rmtree(staging, ignore_errors=True)
            name = f"our snapshot, {workers} ctid worker(s)"
            seconds = measured(name, snapshot)
            results.append((name, seconds, f"{raw / seconds:.2f}x raw"))
            print(results[-1], flush=True)
        for workers in [int(n) for n in (args.spark_cluster or "").split(",") if n]:
            executors: list[float] = []
            name = f"snapshot on Spark, {workers} worker(s) x 1 core"
            seconds, bare = on_spark_cluster(hook, workers, lambda fn: measured(name, fn), executors)
            results.append((name, seconds, f"{raw / seconds:.2f}x raw  executors' Python peak RSS "
                                           f"{max(executors):.0f} MB; a one-task spark-submit there: {bare:.1f} s"))
            print(results[-1], flush=True)
        if args.iceberg:
            applied: list[dict] = []
            variants = apply_variants(args.baseline, args.c1, args.cds)
            measured("snapshot -> Iceberg, every variant", lambda: to_iceberg(hook, applied, variants))
            if args.overlap:
                overlaps: list[dict] = []
                besides = [(label, options) for label, checkout, options in variants if checkout is None]
                measured("snapshot beside its apply", lambda: [beside(hook, overlaps, label, options)
                                                               for label, options in besides])
            print("apply steps:", json.dumps(applied), flush=True)
            name = "snapshot to a staged batch (1 worker), in the runs below"
            copy = statistics.median(step["snapshot"] for step in applied)
            results.append((name, copy, f"{raw / copy:.2f}x raw  {args.rows / copy:,.0f} rows/s"))
            for label, _, _ in variants:
                mine = [step for step in applied if step["variant"] == label]
                seconds = statistics.median(step["snapshot"] + step["wall"] for step in mine)
                results.append((f"snapshot -> queryable Iceberg, apply of {label}", seconds,
                                f"{raw / seconds:.2f}x raw  {args.rows / seconds:,.0f} rows/s  apply wall "
                                f"{statistics.median(step['wall'] for step in mine):.2f} s, in its JVM "
                                f"{statistics.median(step['in_job'] for step in mine):.2f} s, step "
                                f"{statistics.median(step['seconds'] for step in mine):.2f} s, driver peak RSS "
                                f"{max(step['driver_peak_rss_mb'] for step in mine)} MB"))
            if args.overlap:
                print("beside:", json.dumps(overlaps), flush=True)
                for label, _ in besides:
                    mine = [run for run in overlaps if run["variant"] == label]
                    seconds = statistics.median(run["wall"] for run in mine)
                    results.append((f"snapshot -> queryable Iceberg, apply ({label}) started beside the snapshot "
                                    "(until_loaded)", seconds,
                                    f"{raw / seconds:.2f}x raw  {args.rows / seconds:,.0f} rows/s  snapshot committed "
                                    f"at {statistics.median(run['snapshot'] for run in mine):.2f} s, apply's JVM "
                                    f"started its apply at {statistics.median(run['timeline'].get('start', 0) for run in mine):.2f} s, "
                                    f"in its JVM {statistics.median(run['in_job'] for run in mine):.2f} s, snapshot "
                                    f"step {statistics.median(run['seconds'] for run in mine):.2f} s, driver peak RSS "
                                    f"{max(run['driver_peak_rss_mb'] for run in mine)} MB"))
                print(f"Airflow-side peak RSS growth (snapshots beside their apply): "
                      f"+{memory['snapshot beside its apply']:.0f} MB")
            print(f"Airflow-side peak RSS growth (snapshot in this process): "
                  f"+{memory['snapshot -> Iceberg, every variant']:.0f} MB")
        if args.dlt_python:
            for backend in ("pyarrow", "connectorx"):
                def dlt_run():
                    out = tempfile.mkdtemp(prefix="bench-dlt-")
                    try:
                        # The URI (with the throwaway cluster's password) goes by environment, not argv.
                        subprocess.run([args.dlt_python, os.path.join(os.path.dirname(__file__), "dlt_baseline.py"),
                                        backend, out], check=True, env={**os.environ, "DLT_SOURCE_URI": pg.connection_uri()})
                    finally:
                        shutil.rmtree(out, ignore_errors=True)
                name = f"dlt sql_database, {backend} backend"
                seconds = measured(name, dlt_run)
                results.append((name, seconds, f"{raw / seconds:.2f}x raw"))
        print(f"rows: {args.rows:,}; medians of {args.repeat} runs")
        report([(n, sec, f"{note}  CPU per run: client {cpu[n][0]:.1f} s + server {cpu[n][1]:.1f} s"
                         + (f"  peak RSS +{memory[n]:.0f} MB" if n.startswith(("our", "snapshot on")) else "")
                         if n in cpu else note)
                for n, sec, note in results])
        ours = {name: seconds for name, seconds, _ in results if name.startswith("our snapshot")}
        ours1 = ours.get("our snapshot, 1 ctid worker(s)")
        ours2 = ours.get("our snapshot, 2 ctid worker(s)")
        if ours1 and ours2:
            print(f"two workers vs one: {ours1 / ours2:.2f}x")
        for name, seconds, _ in results:
            if not name.startswith("dlt") or not (ours1 and ours2):
                continue
            print(f"one worker vs {name}: {seconds / ours1:.2f}x faster; two workers: {seconds / ours2:.2f}x")


_PEAK_PREFIX = "PEAK_RSS "
#: run argv, then print the largest resident memory any process of its tree reached (Linux: a
#: reaped child's peak includes its own reaped children's)
_PEAK_RSS = ("import json, resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
             f"print({_PEAK_PREFIX!r} + json.dumps({{'mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024}}), "
             "flush=True); sys.exit(code)")


#: the driver JVM options of docs/operators.md "Tuning the driver JVM" (C1 only)
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def apply_variants(baseline: str | None, c1: bool, cds: str | None) -> list[tuple[str, str | None, str]]:
    """(label, another checkout whose apply job runs instead of this one's, driver JVM options)."""
    variants = [("this checkout, JVM defaults", None, "")]
    if c1:
        variants.append(("this checkout, C1 only", None, C1_ONLY))
    if cds:
        variants.append(("this checkout, C1 only + CDS archive", None, f"{C1_ONLY} -XX:SharedArchiveFile={cds}"))
    if baseline:
        variants.insert(0, (f"{baseline}, JVM defaults", baseline, ""))
    return variants


def timeline(output: str, launched: float, wall: float, in_job: float) -> dict:
    """Where a spark-submit's wall went: before the job's apply began (launcher and driver JVMs,
    Python, the session), the apply itself (its ``seconds``), and after it (the result file,
    ``spark.stop``, the JVMs' exit), from the job's own log line that ends the apply (wall clock,
    ms) against ``launched`` (``time.time()`` at the launch)."""
    import datetime as dt

    for line in output.splitlines():
        if " pglogical.apply: apply of " in line and " took " in line:
            ended = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")  # local time, as the job logs it
            until_end = ended.timestamp() - launched
            return {"start": round(until_end - in_job, 2), "after": round(wall - until_end, 2)}
    return {}


def snapshot_apply_args(staging: str, checkout: str | None) -> list[str]:
    """The apply job's command line for this checkout's job or another's (one written before the
    job took its options as one JSON argument takes them as flags)."""
    from tests.support.spark_jobs import apply_args

    job = Path(checkout or Path(__file__).resolve().parent.parent) / "airflow_provider_pglogical" / "spark" / "jobs" / "apply_changes.py"
    if "--options" not in job.read_text():
        return ["--staging-root", staging, "--pipeline", "bench", "--namespace", "bench", "--keep-staging"]
    return apply_args(staging, "bench", namespace="bench", retention_hours=None)


def checkout_job(checkout: str) -> tuple[str, str]:
    """Another checkout's apply job and its ``--py-files`` bundle (built by that checkout's code)."""
    code = ("from airflow_provider_pglogical.spark.launch import APPLY_JOB, job_bundle; "
            "print(APPLY_JOB); print(job_bundle())")
    out = subprocess.run([sys.executable, "-c", code], cwd=checkout, env={**os.environ, "PYTHONPATH": checkout},
                         check=True, capture_output=True, text=True).stdout.split()
    return out[-2], out[-1]


def to_iceberg(hook: PgLogicalHook, applied: list[dict], variants: list[tuple[str, str | None, str]]) -> None:
    """The snapshot into a fresh staging root, then each variant's apply job of that same staged
    snapshot into a fresh warehouse of its own, one after another."""
    from pathlib import Path

    from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
    from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX
    from tests.support.spark_jobs import job_result, run_job, submit_command

    slot, base = f"bench_{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp(prefix="bench-iceberg-"))
    try:
        started = time.perf_counter()
        run_initial_sync(hook, slot=slot, publications=["pub"], root=ObjectStoragePath((base / "staging").as_uri()),
                         pipeline="bench", parallelism=1, report=lambda m: None)
        copied = round(time.perf_counter() - started, 2)
        for index, (label, checkout, java_options) in enumerate(variants):
            command = submit_command(APPLY_JOB, snapshot_apply_args((base / "staging").as_uri(), checkout),
                                     IcebergConfig(warehouse=(base / f"warehouse{index}").as_uri()), driver_memory="2g",
                                     conf={"spark.driver.extraJavaOptions": java_options})
            if checkout:
                job, bundle = checkout_job(checkout)
                command[command.index("--py-files") + 1:command.index("--py-files") + 3] = [bundle, job]
            archive = java_options.partition("-XX:SharedArchiveFile=")[2]
            if archive and not os.path.exists(archive):  # written by an untimed run first (docs/operators.md)
                training = [arg.replace(f"SharedArchiveFile={archive}", f"ArchiveClassesAtExit={archive}")
                            .replace(f"warehouse{index}", "warehouse-training") for arg in command]
                code, output = run_job(training)
                assert code == 0 and os.path.exists(archive), output[-5000:]
            started, launched = time.perf_counter(), time.time()
            # through a wrapper whose children's peak RSS is the job's largest process (the driver JVM)
            code, output = run_job([sys.executable, "-c", _PEAK_RSS, *command])
            assert code == 0, output[-5000:]
            result = job_result(output, RESULT_PREFIX)
            peak = job_result(output, _PEAK_PREFIX)
            wall = round(time.perf_counter() - started, 2)
            applied.extend({"variant": label, "snapshot": copied, "wall": wall,
                            "in_job": result["seconds"], "phases": result.get("phases"),
                            "timeline": timeline(output, launched, wall, result["seconds"]),
                            "driver_peak_rss_mb": peak["mb"],
                            **{k: step.get(k) for k in ("seconds", "adopted_files", "spark_jobs")}}
                           for step in result["steps"])
    finally:
        hook.drop_slot(slot)
        shutil.rmtree(base, ignore_errors=True)


def beside(hook: PgLogicalHook, runs: list[dict], label: str, java_options: str) -> None:
    """The shape of an initial load DAG whose apply does not wait for the sync: the apply job
    (``--keep-running --until-loaded``) is spark-submitted, and at the same moment the snapshot
    starts in this process; timed from that moment to the job's exit (the table is queryable),
    so both tasks' start costs are in it."""
    from pathlib import Path

    from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
    from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX
    from tests.support.spark_jobs import apply_args, job_result, start_job, submit_command

    slot, base = f"bench_{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp(prefix="bench-beside-"))
    command = submit_command(APPLY_JOB, apply_args((base / "staging").as_uri(), "bench", namespace="bench",
                                                   retention_hours=None, keep_running=600, poll_interval=0.2,
                                                   until_loaded=True),
                             IcebergConfig(warehouse=(base / "warehouse").as_uri()), driver_memory="2g",
                             conf={"spark.driver.extraJavaOptions": java_options})
    try:
        started, launched = time.perf_counter(), time.time()
        job = start_job([sys.executable, "-c", _PEAK_RSS, *command])
        run_initial_sync(hook, slot=slot, publications=["pub"], root=ObjectStoragePath((base / "staging").as_uri()),
                         pipeline="bench", parallelism=1, report=lambda m: None)
        copied = round(time.perf_counter() - started, 2)
        output, _ = job.communicate(timeout=900)
        wall = round(time.perf_counter() - started, 2)
        assert job.returncode == 0, output[-5000:]
        result, peak = job_result(output, RESULT_PREFIX), job_result(output, _PEAK_PREFIX)
        step = next(step for step in result["steps"] if step["kind"] == "snapshot")
        runs.append({"variant": label, "snapshot": copied, "wall": wall, "in_job": result["seconds"], "phases": result.get("phases"),
                     "timeline": timeline(output, launched, wall, result["seconds"]),
                     "window": result.get("window"), "driver_peak_rss_mb": peak["mb"],
                     **{k: step.get(k) for k in ("seconds", "adopted_files", "spark_jobs")}})
    finally:
        hook.drop_slot(slot)
        shutil.rmtree(base, ignore_errors=True)


def on_spark_cluster(hook: PgLogicalHook, workers: int, measured, executors: list[float]) -> tuple[float, float]:
    """Median seconds of the initial sync with ``copy_on_spark`` on a fresh standalone cluster of
    ``workers`` one-core workers, and the seconds of a spark-submit running one Python task there
    (the fixed cost); appends each run's executors' peak Python RSS (MB)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.environment import prepare
    from tests.support.spark_cluster import standalone_cluster

    prepare()
    from airflow_provider_pglogical.operators.spark_copy import SparkCopy
    from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest

    base = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        with standalone_cluster(base / "cluster", workers=workers, cores=1, memory="1g") as (port, _env):
            os.environ["AIRFLOW_CONN_BENCH_SPARK"] = json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1",
                                                                 "port": port})
            spark = SparkCopy(conn_id="bench_spark", conf={"spark.ui.enabled": "false", "spark.executor.cores": "1"},
                              env_vars={"SPARK_LOCAL_IP": "127.0.0.1"})

            def snapshot() -> None:
                slot, staging = f"bench_{uuid.uuid4().hex[:8]}", base / uuid.uuid4().hex
                root = ObjectStoragePath(staging.as_uri())
                try:
                    run_initial_sync(hook, slot=slot, publications=["pub"], root=root, pipeline="bench",
                                     parallelism=workers, report=lambda m: None,
                                     copier=spark.copier(hook.connect_kwargs(), root, workers, report=lambda m: None))
                    manifest = read_manifest(root, "bench", committed_batches(root, "bench")[0][0])
                    executors.append(manifest.details["spark_copy"]["peak_python_worker_mb"])
                finally:
                    hook.drop_slot(slot)
                    shutil.rmtree(staging, ignore_errors=True)

            job = base / "one_task.py"
            job.write_text("from pyspark.sql import SparkSession\nspark = SparkSession.builder.getOrCreate()\n"
                           "spark.sparkContext.parallelize([1], 1).map(lambda x: x).collect()\nspark.stop()\n")
            started = time.perf_counter()
            subprocess.run(["spark-submit", "--master", f"spark://127.0.0.1:{port}", "--conf", "spark.ui.enabled=false",
                            str(job)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            bare = time.perf_counter() - started
            return measured(snapshot), bare
    finally:
        os.environ.pop("AIRFLOW_CONN_BENCH_SPARK", None)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
