"""Benchmark of one sync tick by number of tables, and of freshness over a steady workload.

    python bench/bench_tick.py ticks [--tables 1,10,50,200] [--ticks 3] [--concurrency 1,4]
                                     [--driver-jvm none,c1,cds,c1+cds] [--updates same|spread]
                                     [--lakehouse local,s3]
    python bench/bench_tick.py freshness [--tables 5] [--ticks 20]

``ticks``: for each table count, N tables of 1,000 rows (half of them with an 8 kB value that
the changes leave unchanged, so its TOAST is not sent), one initial sync and a first apply; then
per tick 100 changes per table (updates, key changes, inserts, deletes), one pull and the apply
task (``IcebergApplyOperator.execute``, spark-submit included), timed. The baseline, measured in
the same run, is a bare spark-submit of an empty PySpark job. Prints the medians, the ratios the
issue asks for, and the job's own apply time (sum of its steps, JVM start excluded).
``--driver-jvm`` compares driver JVM options a deployment sets as Spark conf (docs/operators.md,
"Tuning the driver JVM"), tick by tick: none, C1 only, a class-data-sharing archive (written by
the warm-up apply), or both. ``--lakehouse local,s3`` runs a second pipeline over the same tables
and changes with the production-shaped lakehouse (moto's S3 server on loopback, Iceberg's JDBC
catalog in the bench cluster, staging on the same bucket) and prints its ratio to the local one,
with the phases of each job and what an idle tick's staging listing costs on each store.

``freshness``: a writer commits a small transaction every 50 ms on N tables while ticks (pull,
then apply) run back to back; a change's freshness is the end of the apply that made it readable
minus its commit time. Prints p50 and p95, each tick's duration split into the pull, the job's
own apply time and the rest of the apply task (spark-submit's JVM start, the task around it), a
bare spark-submit measured in the same run, and the load averages (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.environment import prepare  # noqa: E402

prepare()  # spark-submit beside this interpreter, Spark on loopback
os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))

from airflow.sdk import ObjectStoragePath  # noqa: E402

from bench.common import cluster  # noqa: E402
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402
from airflow_provider_pglogical.capture.pull import run_pull  # noqa: E402
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.lsn import Lsn  # noqa: E402
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator  # noqa: E402
from airflow_provider_pglogical.staging.apply_marker import read_marker  # noqa: E402
from airflow_provider_pglogical.staging.layout import committed_batches  # noqa: E402
from tests.support.spark_jobs import bare_spark_submit_seconds  # noqa: E402

ROWS = 1000


def create_tables(pg, db: str, count: int) -> list[str]:
    names = [f"t{i:03d}" for i in range(count)]
    statements = []
    for i, name in enumerate(names):
        big = i % 2 == 0
        statements.append(f"CREATE TABLE {name} (id int PRIMARY KEY, qty int, note text"
                          + (", doc text" if big else "") + ")")
        statements.append(f"ALTER TABLE {name} ALTER COLUMN note SET STORAGE EXTERNAL")
        doc = ", (SELECT string_agg(md5(random()::text || g::text || s::text), '') FROM generate_series(1, 256) s)" \
            if big else ""
        statements.append(f"INSERT INTO {name} SELECT g, g % 97, 'n' || g{doc} FROM generate_series(1, {ROWS}) g")
    statements.append(f"CREATE PUBLICATION bench FOR TABLE {', '.join(names)}")
    pg.execute("; ".join(statements), dbname=db)
    return names


def change_tables(pg, db: str, names: list[str], tick: int, updates: str = "same") -> int:
    """100 changes per table: 70 updates (the big value unchanged), 10 key changes, 10 inserts, 10 deletes
    (keys stay unique however many ticks run).
    ``updates``: ``same`` updates the same 70 rows every tick, ``spread`` 70 rows drawn anew each
    tick (so the last tick's commit rarely holds them: their kept values are read from the table)."""
    base = 100_000 * tick
    order = "id" if updates == "same" else f"md5(id::text || '-{tick}')"
    statements = []
    for name in names:
        statements += [
            f"UPDATE {name} SET qty = qty + 1 WHERE id IN (SELECT id FROM {name} ORDER BY {order} LIMIT 70 OFFSET 100)",
            # moved keys get numbers of their own tick's band (base + 60001..), never an existing
            # key's: ``id + base`` collided with a key inserted or moved earlier after ~130 ticks
            f"UPDATE {name} SET id = moved.to_id FROM (SELECT id AS from_id, {base} + 60000 + row_number() "
            f"OVER (ORDER BY id) AS to_id FROM {name} WHERE id < {base} ORDER BY id LIMIT 10 OFFSET 300) moved "
            f"WHERE {name}.id = moved.from_id",
            f"INSERT INTO {name} (id, qty, note) SELECT {base} + 50000 + g, g, 'new' FROM generate_series(1, 10) g",
            f"DELETE FROM {name} WHERE id IN (SELECT id FROM {name} WHERE id < {base} ORDER BY id LIMIT 10 OFFSET 500)",
        ]
    pg.execute("; ".join(statements), dbname=db)
    return 100 * len(names)


#: where a pipeline's lakehouse is: ``local`` (a Hadoop catalog and staging on the local disk) or
#: ``s3`` (moto's S3 server on loopback for the warehouse and staging, Iceberg's JDBC catalog in the
#: bench cluster: the demo's ``--lakehouse s3``, started by :func:`s3_lakehouse`)
LAKEHOUSES = ("local", "s3")


def s3_lakehouse(pg):
    """Start the S3 server and create the JDBC catalog's database, named in ``AIRFLOW_CONN_*``
    variables of this process; ``.close(False)`` stops the server."""
    from airflow_provider_pglogical.embedded.demo_lakehouse import s3_lakehouse as start

    lake = start(pg)
    os.environ.update(lake.env)
    return lake


class Pipeline:
    """One pipeline over a throwaway database: initial sync, pulls and applies by the library calls.

    :param lake: ``local``, ``s3`` (:data:`LAKEHOUSES`; ``s3`` needs :func:`s3_lakehouse` first) or ``rest``
        (``bench_catalogs.py``: the demo's REST lakehouse started first).
    """

    def __init__(self, pg, db: str, tmp: Path, tag: str, lake: str = "local", s3=None) -> None:
        self.s3 = s3  # the S3 server's lakehouse (:func:`s3_lakehouse`), for its CPU time
        self.submit_seconds = self.server_cpu = 0.0
        os.environ[f"AIRFLOW_CONN_BENCH_{tag.upper()}"] = pg.connection_uri(db)
        self.hook = PgLogicalHook(postgres_conn_id=f"bench_{tag}")
        if lake in ("s3", "rest"):  # rest: bench_catalogs.py's REST catalog, the warehouse through S3FileIO
            from airflow_provider_pglogical.embedded.demo_lakehouse import (
                BUCKET,
                CATALOG_CONN_ID,
                STORAGE_CONN_ID,
                WAREHOUSE_PREFIX,
            )

            self.staging = f"s3://{STORAGE_CONN_ID}@{BUCKET}/staging-{tag}"
            self.iceberg = IcebergConfig(catalog_type="jdbc" if lake == "s3" else "rest", catalog_conn_id=CATALOG_CONN_ID,
                                         warehouse=f"s3a://{BUCKET}/warehouse-{tag}" if lake == "s3"
                                         else f"s3://{BUCKET}/{WAREHOUSE_PREFIX}", storage_conn_id=STORAGE_CONN_ID,
                                         namespace=f"bench_{tag}")
        else:
            self.staging = (tmp / f"staging-{tag}").as_uri()
            self.iceberg = IcebergConfig(warehouse=(tmp / f"warehouse-{tag}").as_uri(), namespace="bench")
        self.root = ObjectStoragePath(self.staging)
        self.slot = f"bench_{tag}"

    def sync(self) -> None:
        run_initial_sync(self.hook, slot=self.slot, publications=["bench"], root=self.root, pipeline="p",
                         report=lambda message: None)

    def pull(self) -> dict:
        return run_pull(self.hook, slot=self.slot, publications=["bench"], root=self.root, pipeline="p",
                        report=lambda message: None)

    def apply(self, concurrency: int = 4, java_options: str = "",
              conf: dict[str, str] | None = None) -> tuple[float, float]:
        """Wall time of the apply task, and the job's own apply time (JVM start excluded); the Spark
        jobs and stages of each step go to ``self.work``."""
        operator = IcebergApplyOperator(task_id="apply", staging_root=self.staging, pipeline="p",
                                        iceberg=self.iceberg, skip_when_idle=False, concurrency=concurrency,
                                        conf={**(conf or {}), **({"spark.driver.extraJavaOptions": java_options}
                                                                 if java_options else {})})
        submit = operator.run_spark_submit

        def timed_submit(*args, **kwargs):  # the spark-submit (JVM start to exit, its result read)
            begun = time.perf_counter()
            try:
                return submit(*args, **kwargs)
            finally:
                self.submit_seconds = time.perf_counter() - begun

        operator.run_spark_submit = timed_submit
        server_cpu = self.s3_server_cpu()
        started = time.perf_counter()
        operator.execute({})
        wall = time.perf_counter() - started
        self.server_cpu = self.s3_server_cpu() - server_cpu
        self.work = [(step.get("spark_jobs", 0), step.get("spark_stages", 0)) for step in operator._applied_steps]
        self.steps = operator._applied_steps
        self.phases = operator._job_phases
        return wall, operator._job_seconds

    def s3_server_cpu(self) -> float:
        """CPU seconds so far of the S3 server's process (0 on local disk): a local moto shares the
        machine's cores with Spark, which a real S3 does not."""
        if self.s3 is None:
            return 0.0
        import psutil

        times = psutil.Process(self.s3.s3.process.pid).cpu_times()
        return times.user + times.system

    def listing_seconds(self) -> float:
        """What an idle tick pays before it decides not to start Spark: listing the committed
        batches and reading the apply marker (``pending_batches``), on this pipeline's staging."""
        started = time.perf_counter()
        read_marker(self.root, "p")
        committed_batches(self.root, "p")
        return time.perf_counter() - started


def ticks(args: argparse.Namespace) -> None:
    lakes = args.lakehouse.split(",")
    with tempfile.TemporaryDirectory() as tmp, cluster("bench_tick") as pg:
        tmp_path = Path(tmp)
        s3 = s3_lakehouse(pg) if "s3" in lakes else None
        # --tiny: no baseline (bench_idle_apply's tiny run covers it), one JVM fewer in CI
        baseline_runs = [] if args.tiny else [bare_spark_submit_seconds(tmp_path) for _ in range(args.ticks)]
        baseline = statistics.median(baseline_runs) if baseline_runs else float("nan")
        print(f"bare spark-submit of an empty PySpark job: median {baseline:.2f} s "
              f"({', '.join(f'{r:.2f}' for r in baseline_runs)}); load {load()}")
        jvm = driver_jvm_settings(tmp_path)
        settings = [(int(c), name) for c in args.concurrency.split(",") for name in args.driver_jvm.split(",")]
        medians: dict[tuple[int, tuple, str], float] = {}
        for count in [int(c) for c in args.tables.split(",")]:
            db = f"tick{count}"
            pg.create_database(db)
            names = create_tables(pg, db, count)
            # one pipeline (slot, staging, lakehouse) per lakehouse over the same tables and changes
            pipelines = {lake: Pipeline(pg, db, tmp_path, db if lake == "local" else f"{db}_{lake}", lake,
                                        s3 if lake == "s3" else None)
                         for lake in lakes}
            runs = {(s, lake): {"wall": [], "job": [], "phases": [], "listing": [], "submit": [], "server_cpu": []}
                    for s in settings for lake in lakes}
            work: list[tuple[int, int]] = []
            for pipeline in pipelines.values():
                pipeline.sync()
                # the first run warms up, and writes the class archive the cds settings map
                pipeline.apply(java_options=jvm["dump"] if any("cds" in name for _, name in settings) else "")
            tick = 0
            for _ in range(args.ticks + 1):
                for setting in settings:  # interleaved: each setting meets the same machine state
                    tick += 1
                    change_tables(pg, db, names, tick, args.updates)
                    for lake, pipeline in pipelines.items():
                        pipeline.pull()
                        wall, job = pipeline.apply(setting[0], jvm[setting[1]])
                        if tick > len(settings):  # the first round warms the page cache: not measured
                            run = runs[setting, lake]
                            run["wall"].append(wall)
                            run["job"].append(job)
                            run["phases"].append(pipeline.phases)
                            run["listing"].append(pipeline.listing_seconds())
                            run["submit"].append(pipeline.submit_seconds)
                            run["server_cpu"].append(pipeline.server_cpu)
                            print(f"  tick {tick}, {count} tables, lakehouse {lake}: apply task {wall:.2f} s "
                                  f"(spark-submit {pipeline.submit_seconds:.2f} s, in-job {job:.2f} s), S3 server "
                                  f"CPU {pipeline.server_cpu:.2f} s, load {load()}", flush=True)
                            work += pipeline.work
            for (setting, lake), run in runs.items():
                median = medians[count, setting, lake] = statistics.median(run["wall"])
                job = statistics.median(run["job"])
                print(f"{count:>4} tables x 100 changes, {describe(setting)}, lakehouse {lake}: apply task median "
                      f"{median:6.2f} s ({median / baseline:.2f}x bare spark-submit); in-job apply median {job:6.2f} s; "
                      f"outside the job (JVM start, submit, staging I/O of the task) {median - job:.2f} s; "
                      f"of which the task's own staging I/O (outside spark-submit) "
                      f"{median - statistics.median(run['submit']):.2f} s; the S3 server's CPU "
                      f"{statistics.median(run['server_cpu']):.2f} s; "
                      f"the idle tick's staging listing {statistics.median(run['listing']):.2f} s; runs "
                      f"{', '.join(f'{w:.1f}' for w in run['wall'])}; in-job phases (medians) "
                      f"{phase_medians(run['phases'])}")
            print(f"{count:>4} tables: Spark jobs per step median {statistics.median(j for j, _ in work)}, "
                  f"max {max(j for j, _ in work)}; stages per step median {statistics.median(s for _, s in work)}, "
                  f"max {max(s for _, s in work)}")
        for (count, setting, lake), median in medians.items():
            if count != 1 and (1, setting, lake) in medians:
                print(f"{describe(setting)}, lakehouse {lake}: {count} tables / 1 table: "
                      f"{median / medians[1, setting, lake]:.2f}x")
            if lake != "local" and (count, setting, "local") in medians:
                print(f"{count} tables, {describe(setting)}: lakehouse {lake} / local: "
                      f"{median / medians[count, setting, 'local']:.2f}x the local apply task")
        if s3 is not None:
            s3.close(False)


def phase_medians(runs: list[dict]) -> str:
    """The job's phases (``apply_changes.Phases``), median seconds of each over the runs."""
    order = ["listing", "lease", "state_read", "planning", "steps", "state_commits", "retention"]
    names = sorted({name for run in runs for name in run}, key=lambda n: order.index(n) if n in order else len(order))
    return ", ".join(f"{name} {statistics.median(run.get(name, 0.0) for run in runs):.2f} s" for name in names)


def describe(setting: tuple) -> str:
    concurrency, jvm = setting
    return f"concurrency {concurrency}, driver JVM options {jvm}"


#: the driver JVM options docs/operators.md recommends for small ticks: C1 only, with the code
#: cache tiered compilation has (a long-lived JVM fills the 48 MB C1 alone reserves)
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def driver_jvm_settings(tmp: Path) -> dict[str, str]:
    """Name -> ``spark.driver.extraJavaOptions``; ``dump`` writes the class archive the others map."""
    archive = tmp / "spark-driver.jsa"
    return {"none": "", "c1": C1_ONLY, "cds": f"-XX:SharedArchiveFile={archive}",
            "c1+cds": f"{C1_ONLY} -XX:SharedArchiveFile={archive}",
            "dump": f"-XX:ArchiveClassesAtExit={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"}


def freshness(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp, cluster("bench_fresh") as pg:
        print(f"load average at start: {load()}")
        baseline = bare_spark_submit_seconds(Path(tmp))
        print(f"bare spark-submit of an empty PySpark job: {baseline:.2f} s (load {load()})")
        db = "fresh"
        pg.create_database(db)
        names = create_tables(pg, db, args.tables)
        pipeline = Pipeline(pg, db, Path(tmp), db)
        pipeline.sync()
        pipeline.apply()
        commits: list[tuple[float, int]] = []  # (commit wall time, WAL position right after it)
        stop = threading.Event()
        thread = threading.Thread(target=write_steadily, args=(pg, db, names, commits, stop), daemon=True)
        thread.start()
        visible: list[tuple[int, float]] = []  # (batch end LSN, time its apply ended)
        timings: list[dict] = []
        try:
            for _ in range(args.ticks):
                timings.append(fresh_tick(pipeline, visible))
                print(f"tick {len(timings):>2}: {format_tick(timings[-1])} (load {load()})", flush=True)
        finally:
            stop.set()
            thread.join()
        report_freshness(args, commits, visible, timings, baseline)


def write_steadily(pg, db: str, names: list[str], commits: list[tuple[float, int]], stop: threading.Event) -> None:
    """The steady workload: one single-row UPDATE transaction every 50 ms, its commit time and the
    WAL position right after the commit recorded (the batch whose end reaches it holds it)."""
    rng = random.Random(7)
    conn = pg.connect(db)
    conn.autocommit = True
    with conn.cursor() as cursor:
        while not stop.is_set():
            name = rng.choice(names)
            cursor.execute(f"UPDATE {name} SET qty = qty + 1 WHERE id = %s", (rng.randint(1, ROWS),))
            committed = time.time()
            cursor.execute("SELECT pg_current_wal_lsn()::text")
            commits.append((committed, Lsn.parse(cursor.fetchone()[0]).value))
            stop.wait(0.05)
    conn.close()


def fresh_tick(pipeline: Pipeline, visible: list[tuple[int, float]]) -> dict:
    """One tick (pull, then the apply task); records when its batch became readable."""
    started = time.perf_counter()
    pulled = pipeline.pull()
    pulled_at = time.perf_counter()
    wall, job = pipeline.apply()
    end = pulled.get("end_lsn")
    if end:
        visible.append((Lsn.parse(end).value, time.time()))
    return {"pull": pulled_at - started, "apply": wall, "in_job": job, "tick": time.perf_counter() - started,
            "changes": pulled.get("changes", 0)}


def format_tick(timing: dict) -> str:
    return (f"{timing['tick']:6.1f} s = pull {timing['pull']:5.2f} s + apply task {timing['apply']:5.1f} s "
            f"(in-job {timing['in_job']:5.1f} s, spark-submit and task around it "
            f"{timing['apply'] - timing['in_job']:5.1f} s), {timing['changes']} changes")


def report_freshness(args: argparse.Namespace, commits: list[tuple[float, int]], visible: list[tuple[int, float]],
                     timings: list[dict], baseline: float) -> None:
    """p50/p95 of commit-to-readable, and the medians of what a tick is made of."""
    lags = []
    for committed, lsn in commits:
        readable = next((t for end, t in visible if end >= lsn), None)
        if readable is not None:
            lags.append(readable - committed)
    lags.sort()
    p50, p95 = lags[len(lags) // 2], lags[int(len(lags) * 0.95)]
    print(f"freshness over {args.ticks} ticks, {args.tables} tables, {len(lags)} commits made readable "
          f"({len(commits) - len(lags)} committed after the last pull): p50 {p50:.1f} s, p95 {p95:.1f} s")
    median = {key: statistics.median(t[key] for t in timings) for key in ("tick", "pull", "apply", "in_job")}
    print(f"tick medians: tick {median['tick']:.1f} s, pull {median['pull']:.2f} s, apply task {median['apply']:.1f} s "
          f"(in-job {median['in_job']:.1f} s, the rest {median['apply'] - median['in_job']:.1f} s); "
          f"bare spark-submit {baseline:.2f} s; load average at end: {load()}")


def load() -> str:
    """The 1/5/15-minute load averages (2 cores, shared with other work: read figures next to it)."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ticks", "freshness"])
    parser.add_argument("--tables", default=None)
    parser.add_argument("--ticks", type=int, default=None)
    parser.add_argument("--concurrency", default="4", help="ticks mode: apply concurrencies to compare, e.g. 1,4")
    parser.add_argument("--driver-jvm", default="none",
                        help="ticks mode: driver JVM options to compare tick by tick, of none, c1, cds, c1+cds")
    parser.add_argument("--updates", default="same", choices=["same", "spread"],
                        help="ticks mode: the 70 updates per table hit the same rows every tick, or rows drawn anew")
    parser.add_argument("--lakehouse", default="local",
                        help="ticks mode: lakehouses to compare in one run, of local, s3 (S3 server + JDBC catalog)")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if set(args.lakehouse.split(",")) - set(LAKEHOUSES):
        parser.error(f"--lakehouse takes a comma-separated list of {', '.join(LAKEHOUSES)}, not {args.lakehouse!r}")
    if args.tiny:
        args.tables, args.ticks = args.tables or "1", args.ticks or (1 if args.mode == "ticks" else 2)
    if args.mode == "ticks":
        args.tables, args.ticks = args.tables or "1,10,50,200", args.ticks or 3
        ticks(args)
    else:
        args.tables, args.ticks = int(args.tables or 5), args.ticks or 20
        freshness(args)


if __name__ == "__main__":
    main()
