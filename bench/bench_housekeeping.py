"""Benchmark of the housekeeping job over a small pipeline's tables: Spark's shuffles, tables at once.

    python bench/bench_housekeeping.py [--ticks 3] [--repeats 3]

The demo's four tables are synced, changed for ``--ticks`` ticks (the demo's workload) and
applied (``apply_changes.run`` in-process): five Iceberg tables with the state table, each with a
few snapshots, data files and delete files, as the example DAG's six-hourly run finds them. The
warehouse is then copied once per run, and each run keeps its copy with ``maintenance.run`` in a
fresh Spark session of its own process (local[2], as spark-submit would start it):

- ``spark-defaults, 1 at a time``: 200 shuffle partitions, one table after another (the job
  before 2026-11-27);
- ``small shuffles, 1 at a time``: ``apply_changes.small_shuffles`` (a few partitions per core);
- ``small shuffles, 4 at a time``: the job now (``--concurrency 4``).

Reported: the job's run, session start excluded; medians over ``--repeats``, variants interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import bench_tick  # noqa: E402  (prepares the environment, as bench_tick does)
from bench.bench_soak import quiet_logs, spark_session  # noqa: E402
from airflow_provider_pglogical.embedded import demo  # noqa: E402
from airflow_provider_pglogical.spark.jobs import apply_changes  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402

RESULT = "BENCH_HOUSEKEEPING "
VARIANTS = {
    "spark-defaults, 1 at a time": (False, 1),
    "small shuffles, 1 at a time": (True, 1),
    "small shuffles, 4 at a time": (True, 4),
}


def keep(warehouse: Path, small: bool, concurrency: int) -> float:
    """One run of the maintenance job over the copy; returns its seconds (session start excluded)."""
    from pyspark.sql import SparkSession

    from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
    from airflow_provider_pglogical.spark.jobs import maintenance

    builder = SparkSession.builder.master("local[2]").appName("bench-housekeeping")
    conf = {**IcebergConfig(warehouse=warehouse.as_uri(), namespace="bench").spark_conf(),
            "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if small:
        apply_changes.tune_session(spark, apply_changes.small_shuffles(spark.sparkContext.defaultParallelism))
    started = time.monotonic()
    summary = maintenance.run(spark, "lake", "bench", None, concurrency=concurrency)
    seconds = time.monotonic() - started
    assert len(summary["tables"]) == 5, summary["tables"].keys()
    spark.stop()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    parser.add_argument("--child", nargs=3, metavar=("WAREHOUSE", "SMALL", "CONCURRENCY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        warehouse, small, concurrency = args.child
        print(RESULT + json.dumps({"seconds": keep(Path(warehouse), small == "1", int(concurrency))}), flush=True)
        return
    variants = dict(VARIANTS)
    if args.tiny:  # one tick, one run of the job as it is
        args.ticks, args.repeats = 1, 1
        variants = {name: setting for name, setting in VARIANTS.items() if name == "small shuffles, 4 at a time"}
    quiet_logs()
    with tempfile.TemporaryDirectory() as tmp, bench_tick.cluster("bench_housekeeping") as pg:
        tmp_path = Path(tmp)
        pg.create_database("shop")
        rng = random.Random(42)
        demo.load(pg, "shop", rng)
        pg.execute("CREATE PUBLICATION bench FOR TABLE customers, orders, products, events "
                   "WITH (publish_via_partition_root = true)", dbname="shop")
        pipeline = bench_tick.Pipeline(pg, "shop", tmp_path, "shop")
        pipeline.sync()
        warehouse = tmp_path / "warehouse-shop"
        spark = spark_session(warehouse, "2g")
        apply_changes.run(spark, ApplyOptions(pipeline.staging, "p", namespace="bench"))
        for tick in range(1, args.ticks + 1):
            demo.workload(pg, "shop", rng, tick)
            pipeline.pull()
            apply_changes.run(spark, ApplyOptions(pipeline.staging, "p", namespace="bench"))
        spark.stop()
        print(f"warehouse: 5 tables after a snapshot and {args.ticks} ticks (load {bench_tick.load()})", flush=True)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for repeat in range(args.repeats):
            for name, (small, concurrency) in variants.items():
                copy = tmp_path / f"copy-{repeat}-{concurrency}-{int(small)}"
                shutil.copytree(warehouse, copy)
                out = subprocess.run([sys.executable, __file__, "--child", str(copy), "1" if small else "0",
                                      str(concurrency)], check=True, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}).stdout
                line = next(line for line in out.splitlines() if line.startswith(RESULT))
                times[name].append(json.loads(line[len(RESULT):])["seconds"])
                print(f"run {repeat + 1}: {name}: {times[name][-1]:.2f} s (load {bench_tick.load()})", flush=True)
        base = statistics.median(times[next(iter(variants))])
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(f"{name}: median {median:.2f} s ({median / base:.2f}x {next(iter(variants))}); runs "
                  + ", ".join(f"{s:.1f}" for s in seconds))


if __name__ == "__main__":
    main()
