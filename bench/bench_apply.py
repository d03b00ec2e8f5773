"""Benchmark of the Spark apply job: one 100k-change batch into a 500k-row and a 5M-row Iceberg table.

    python bench/bench_apply.py [--sizes 500000,5000000] [--changes 100000] [--repeats 5]
                                [--layouts plain,bucket16] [--write-docs]

For each table size and layout: stage a snapshot of the table and one change batch (60% updates,
20% inserts, 20% deletes, keys uniform over the table, 10 changes per transaction) with
``BatchWriter``, apply the snapshot, then apply the change batch ``--repeats`` times through the
job's own ``run()`` in one local[2] Spark session (rolling the table and the state back to the
snapshot between runs), and report the median apply time of the batch. The fixed cost of a
``spark-submit`` (JVM, Spark and catalog start-up: a run that finds no batch) is measured apart.
With ``--write-docs`` the results replace the "Apply (Spark → Iceberg)" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.environment import prepare  # noqa: E402

prepare()  # spark-submit beside this interpreter, Spark on loopback

from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.lakehouse.jar_sets import ICEBERG_VERSION  # noqa: E402
from tests.support.spark_jobs import apply_args, run_job, submit_command  # noqa: E402
from airflow_provider_pglogical.spark.jobs import apply_changes as job  # noqa: E402
from airflow_provider_pglogical.spark.paths import merge  # noqa: E402
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402
from tests.support.accounts_batches import SNAPSHOT_LSN, SOURCE, stage  # noqa: E402

SECTION = "## Apply (Spark → Iceberg)"


def session(warehouse: Path, driver_memory: str, extra: dict[str, str]):
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master("local[2]").appName("bench-apply")
    conf = {**IcebergConfig(warehouse=warehouse.as_uri()).spark_conf(), "spark.driver.memory": driver_memory,
            "spark.sql.session.timeZone": "UTC", "spark.sql.caseSensitive": "true", "spark.ui.enabled": "false",
            **extra}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    job.tune_session(spark)  # the job's own defaults, where --conf did not set a value
    return spark


class Table:
    """One staged table of one size and layout, applied once, ready to be rolled back and re-applied."""

    def __init__(self, spark, root: Path, pipeline: str, namespace: str, bucket_count: int | None):
        self.spark, self.root, self.pipeline, self.namespace = spark, root, pipeline, namespace
        self.bucket_count = bucket_count
        first = job.run(spark, ApplyOptions(root.as_uri(), pipeline, "lake", namespace, bucket_count=bucket_count))
        self.snapshot_seconds = first["steps"][0]["seconds"]
        self.first_apply = first["steps"][1]["seconds"]
        self.changes = first["steps"][1]["rows"]
        table = f"lake.{namespace}.public__accounts"
        history = spark.sql(f"SELECT snapshot_id FROM {table}.snapshots ORDER BY committed_at").collect()
        self.base = history[0].snapshot_id  # the table as the snapshot batch left it
        self.lakehouse = Lakehouse(spark, "lake", namespace, "merge-on-read", bucket_count)
        self.times: list[float] = []

    def apply_again(self) -> float:
        self.spark.sql(f"CALL lake.system.rollback_to_snapshot('{self.namespace}.public__accounts', {self.base})")
        states = self.lakehouse.state.read_state(self.pipeline)
        states[SOURCE].position = SNAPSHOT_LSN
        self.lakehouse.state.write_state(self.pipeline, states)
        again = job.run(self.spark, ApplyOptions(self.root.as_uri(), self.pipeline, "lake", self.namespace,
                        bucket_count=self.bucket_count))
        assert [s["kind"] for s in again["steps"]] == ["changes"], again
        return again["steps"][0]["seconds"]

    def result(self) -> dict:
        return {"snapshot_seconds": self.snapshot_seconds, "first_apply": self.first_apply,
                "apply_seconds": self.times, "median": statistics.median(self.times), "changes": self.changes}


@contextlib.contextmanager
def pruning(layout: str):
    """``<layout>-unpruned``: the job without the bloom-filter source (``merge.pruning_source``),
    as it was before it: every MERGE shuffles the whole table."""
    saved = merge.prunes
    if layout.endswith("-unpruned"):
        merge.prunes = lambda *sizes: False
    try:
        yield
    finally:
        merge.prunes = saved


def submit_seconds(warehouse: Path, root: Path, pipeline: str, namespace: str, repeats: int = 3) -> tuple[float, str]:
    """Median wall time of the last 3 spark-submits of the job (which find nothing to apply)."""
    command = submit_command(APPLY_JOB, apply_args(root.as_uri(), pipeline, namespace=namespace),
                             IcebergConfig(warehouse=warehouse.as_uri()), conf={"spark.driver.extraJavaOptions": ""})
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        code, output = run_job(command)
        assert code == 0, output[-5000:]
        times.append(time.monotonic() - started)
    times = times[-3:]
    shown = (f"spark-submit --master local[2] --driver-memory 2g --conf <IcebergConfig().spark_conf()> "
             f"apply_changes.py --staging-root <root> --pipeline {pipeline} --namespace {namespace}")
    return statistics.median(times), shown


def write_docs(text: str) -> None:
    path = REPO / "docs" / "benchmarks.md"
    path.parent.mkdir(exist_ok=True)
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    if SECTION in current:
        before, rest = current.split(SECTION, 1)
        after = rest[rest.find("\n## "):] if "\n## " in rest else ""
        current = before + text.rstrip() + "\n" + after
    else:
        current = current.rstrip() + "\n\n" + text.rstrip() + "\n"
    path.write_text(current)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500000,5000000")
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmups", type=int, default=5, help="applies before the measured ones (JIT warm-up)")
    parser.add_argument("--layouts", default="plain,bucket16",
                        help="plain | plain-unpruned | bucketN, comma separated")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--skip-submit", action="store_true", help="do not measure the fixed spark-submit cost")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="Spark property over the job's defaults (repeatable)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if args.tiny:
        args.sizes, args.changes, args.repeats, args.warmups, args.layouts = "2000", 200, 1, 0, "plain"
    sizes = [int(s) for s in args.sizes.split(",")]
    layouts = args.layouts.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-apply-"))
    root, warehouse = work / "staging", work / "warehouse"
    results = {}
    try:
        for size in sizes:
            started = time.monotonic()
            stage(root, f"n{size}", size, args.changes)
            print(f"staged {size} rows + {args.changes} changes in {time.monotonic() - started:.1f}s", flush=True)
        # the fixed cost first, while no other JVM runs: nothing staged, then everything applied
        stage(root, "tiny", 1000, 100)
        if args.skip_submit:
            empty = applied = (float("nan"), "not measured (--skip-submit)")
        else:
            empty = submit_seconds(warehouse, root, "empty", "bench_empty", repeats=1 if args.tiny else 3)
            applied = empty if args.tiny else submit_seconds(  # the 1st of the 4 runs applies
                warehouse, root, "tiny", "bench_tiny", repeats=4)
        print(f"spark-submit, no batch: {empty[0]:.2f}s; all batches applied: {applied[0]:.2f}s", flush=True)
        spark = session(warehouse, args.driver_memory, dict(c.split("=", 1) for c in args.conf))
        loads = [os.getloadavg()[0]]
        tables = {}
        for layout in layouts:
            buckets = int(layout[len("bucket"):]) if layout.startswith("bucket") else None
            for size in sizes:
                with pruning(layout):
                    tables[(layout, size)] = Table(spark, root, f"n{size}", f"{layout.replace('-', '_')}_{size}",
                                                   buckets)
        # layouts and sizes alternate, so that whatever else the machine does weighs on all alike
        for round_ in range(args.warmups + args.repeats):
            for (layout, size), table in tables.items():
                with pruning(layout):
                    seconds = table.apply_again()
                if round_ >= args.warmups:
                    table.times.append(seconds)
            loads.append(os.getloadavg()[0])
        for (layout, size), table in tables.items():
            results[(layout, size)] = table.result()
            print(layout, size, json.dumps(results[(layout, size)]), flush=True)
        spark.stop()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    command = "python bench/bench_apply.py " + " ".join(sys.argv[1:])
    lines = [SECTION, "",
             f"Command: `{command.strip()}` (2 cores, local[2], driver memory {args.driver_memory}, "
             f"Iceberg {ICEBERG_VERSION} Hadoop catalog on local disk, pyspark "
             f"{__import__('pyspark').__version__}).", "",
             f"One change batch of {args.changes:,} changes (60% updates, 20% inserts, 20% deletes, keys uniform "
             "over the table, 10 changes per transaction) applied to a table of each size, merge-on-read, in one "
             f"Spark session: {args.warmups} warm-up applies, then the median of {args.repeats}, layouts and sizes "
             "alternating (table and state rolled back to the snapshot in between), timed inside the job (read + "
             "reduce + one MERGE; the state commit excluded). 1-minute load average during the runs: "
             f"{', '.join(f'{x:.1f}' for x in loads)} (other work shared the machine when above ~2). \"first\" is the first apply of that table in the session; only the first row's "
             "ran in a fresh JVM, which is what a lone spark-submit pays on top of the fixed cost below.", "",
             "| layout | table rows | apply median (s) | measured runs (s) | first (s) | changes/s | snapshot load (s) |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for (layout, size), r in results.items():
        lines.append(f"| {layout} | {size:,} | {r['median']:.2f} | {', '.join(f'{t:.2f}' for t in r['apply_seconds'])} "
                     f"| {r['first_apply']:.2f} | {args.changes / r['median']:,.0f} | {r['snapshot_seconds']:.1f} |")
    lines.append("")
    for layout in layouts:
        if len(sizes) >= 2:
            small, big = results[(layout, sizes[0])]["median"], results[(layout, sizes[-1])]["median"]
            lines.append(f"- {layout}: ratio {sizes[-1]:,} / {sizes[0]:,} rows = **{big / small:.2f}×**")
    lines += [f"- fixed spark-submit cost, median of 3: **{empty[0]:.1f} s** with no batch staged "
              f"(`{empty[1]}`), **{applied[0]:.1f} s** when every batch is already applied (it reads the state "
              "table: the first Iceberg queries of a fresh JVM)",
              "",
              "What the ratio is made of. Spark 3.5 plans the MERGE as `target RIGHT OUTER JOIN batch`, a "
              "sort-merge join, and the batch side cannot be broadcast for a right outer join, so without more "
              "every target row's key and row position (`_file`, `_pos`) is shuffled and sorted: that grows with "
              "the table (`plain-unpruned`, the job before 2026-11-26). The job now prunes the target's scan with "
              "Spark's own runtime filter (`merge.pruning_source`, `session_defaults`): the reduced batch is "
              "computed once into the executors (a scan, `localCheckpoint`), and Spark adds a bloom filter of its "
              "keys (`bloom_filter_agg`, `might_contain`) to the target's scan, so only rows that may match reach "
              "the shuffle. It does so only for a join it expects to shuffle, so the job plans no broadcast from "
              "size estimates (`spark.sql.autoBroadcastJoinThreshold=-1`; adaptive execution still broadcasts a "
              "side that turns out small at run time). Pruning costs two Spark jobs and about 3 µs per batch row, "
              "so the job prunes only a table that has at least 500,000 rows more than ten per batch row "
              "(`merge.prunes`): here the 500k-row table is applied unpruned and the 5M-row one pruned; `plain` is "
              "the default. tests/integration/test_pruned_merge.py checks the plan and the result. (An earlier "
              "try, a materialised batch behind a filter with a low application-side threshold, got no filter: "
              "a batch small enough to broadcast by its size estimate made Spark skip the join.)",
              "",
              "The bucketed layout (`--bucket-count N`, `IcebergConfig(bucket_count=N)`: tables partitioned by "
              "`bucket(N, first key column)`) removes that shuffle: the job writes the reduced batch into a "
              "temporary Iceberg table bucketed the same way and MERGEs from it, and with storage-partitioned joins "
              "on (the job's session defaults) Spark joins the two bucket by bucket without shuffling the target "
              "(the plan has no Exchange below the join). Writing and dropping that table costs ~1 s per MERGE, "
              "so small tables apply faster plain, large ones bucketed; the ratio stays well under 2x. With keys "
              "spread over the whole table each commit writes up to N files, so keep N small and compact "
              "(`IcebergMaintenanceOperator`).",
              "",
              "Tried and dropped (A/B in one session each, `--warmups 2 --repeats 3`): "
              "`spark.sql.adaptive.maxShuffledHashJoinLocalMapThreshold=256m` (AQE did not turn the join into a "
              "shuffled hash join: 2.21x against 2.15x without); a MERGE with only WHEN MATCHED clauses (an inner join, the batch broadcast) "
              "plus an INSERT of the absent keys (ratio 1.82x, but 3x slower in absolute terms, and two commits, "
              "which would need a WAP branch to stay atomic for readers). Also tried on 2026-11-25 (same command "
              "with `--sizes 500000,5000000 --layouts plain --skip-submit`, with and without `--conf "
              "spark.sql.join.preferSortMergeJoin=false`, alternating twice): a shuffled hash join built on the "
              "batch, so that the target is shuffled but not sorted: 5M rows 2.37 and 2.35 s against 2.36 and "
              "2.58 s, ratios 2.24x and 1.96x against 2.06x and 2.30x, no difference beyond the noise. "
              "On this 2-core machine timings move by "
              "about ±25% between runs and with other jobs' load (see the load average above).",
              ""]
    text = "\n".join(lines)
    print(text)
    if args.write_docs:
        write_docs(text)


if __name__ == "__main__":
    main()
