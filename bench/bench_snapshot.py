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
import tempfile
import time
import uuid

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
        for workers in (1, 2):
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
            name = "snapshot -> queryable Iceberg (1 worker + apply job)"
            seconds = measured(name, lambda: to_iceberg(hook, applied))
            results.append((name, seconds, f"{raw / seconds:.2f}x raw"))
            print(results[-1], "apply steps:", json.dumps(applied), flush=True)
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
                         + (f"  peak RSS +{memory[n]:.0f} MB" if n.startswith(("our", "snapshot on")) else ""))
                for n, sec, note in results])
        ours1 = results[1][1]
        ours2 = results[2][1]
        print(f"two workers vs one: {ours1 / ours2:.2f}x")
        for name, seconds, _ in results[3:]:
            if name.startswith("snapshot"):
                continue
            print(f"one worker vs {name}: {seconds / ours1:.2f}x faster; two workers: {seconds / ours2:.2f}x")


def to_iceberg(hook: PgLogicalHook, applied: list[dict]) -> None:
    """The snapshot into a fresh staging root, then the apply job into a fresh warehouse."""
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(repo))
    from tests.support.environment import prepare

    prepare()  # spark-submit beside this interpreter, Spark on loopback
    from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
    from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX
    from tests.support.spark_jobs import job_result, run_job, submit_command

    slot, base = f"bench_{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp(prefix="bench-iceberg-"))
    try:
        run_initial_sync(hook, slot=slot, publications=["pub"], root=ObjectStoragePath((base / "staging").as_uri()),
                         pipeline="bench", parallelism=1, report=lambda m: None)
        started = time.perf_counter()
        command = submit_command(APPLY_JOB, ["--staging-root", (base / "staging").as_uri(), "--pipeline", "bench",
                                             "--namespace", "bench", "--keep-staging"],
                                 IcebergConfig(warehouse=(base / "warehouse").as_uri()), driver_memory="2g",
                                 conf={"spark.driver.extraJavaOptions": ""})  # C2 too: a large step
        code, output = run_job(command)
        assert code == 0, output[-5000:]
        result = job_result(output, RESULT_PREFIX)
        applied.extend({"wall": round(time.perf_counter() - started, 2), "in_job": result["seconds"],
                        **{k: step.get(k) for k in ("seconds", "adopted_files", "spark_jobs")}}
                       for step in result["steps"])
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
