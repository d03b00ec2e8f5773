"""Benchmark of a tick of about 2,000 changes over five tables of different shapes.

    python bench/bench_mixed_tick.py [--ticks 6] [--rows 20000] [--driver-jvm none,c1] [--lakehouse local,s3]

Five tables: two with an 8 kB value the changes leave unchanged (its TOAST is not sent) and key
changes among their updates, a plain keyed table, a keyless table (``REPLICA IDENTITY FULL``)
full of identical rows, and a table partitioned by range (published through its root). Per tick
400 changes per table. Two pipelines over two databases get the same seeded workload each tick:

- ``submit``: the apply task (``IcebergApplyOperator.execute``), a spark-submit per tick, as an
  Airflow deployment on the embedded default runs it;
- ``in-process``: ``apply_changes.run`` in one long-lived Spark session (what a long-lived Spark
  would pay: no JVM start, no cold first queries).

Both report the job's own apply time ("in-job": listing, manifests, state read, every step,
state commit; the JVM start excluded) and each table's step, and the submit pipeline the apply
task's wall time. With ``--driver-jvm none,c1`` the submit pipeline's ticks alternate between
driver JVM options a deployment sets (``bench_tick.driver_jvm_settings``: none, C1 only, a class
archive, both). With ``--lakehouse local,s3`` a third pipeline, ``s3``, gets the same workload and
the same apply task with the production-shaped lakehouse (moto's S3 server, Iceberg's JDBC catalog,
staging on the bucket: ``bench_tick.s3_lakehouse``), and its ratio to ``submit`` is printed. After
the last tick every lakehouse is compared with its source (the S3 one by ``verify_pipeline``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import bench_tick  # noqa: E402  (prepares the environment, as bench_tick does)
from bench.bench_soak import quiet_logs, spark_session  # noqa: E402
from airflow_provider_pglogical.spark.jobs import apply_changes  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402

PER_TABLE = 400
SCHEMA = """
CREATE TABLE docs_a (id int PRIMARY KEY, qty int, doc text);
CREATE TABLE docs_b (id int PRIMARY KEY, qty int, doc text);
ALTER TABLE docs_a ALTER COLUMN doc SET STORAGE EXTERNAL;
ALTER TABLE docs_b ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE plain (id int PRIMARY KEY, qty int, note text);
CREATE TABLE bag (a int, b text, n int);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE events (id int NOT NULL, day date NOT NULL, kind text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day);
CREATE TABLE events_h1 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-07-01');
CREATE TABLE events_h2 PARTITION OF events FOR VALUES FROM ('2026-07-01') TO ('2027-01-01');
"""
DOC = "(SELECT string_agg(md5(random()::text || g::text || s::text), '') FROM generate_series(1, 256) s)"
TABLES = ["public.docs_a", "public.docs_b", "public.plain", "public.bag", "public.events"]


def create_source(pg, db: str, rows: int) -> None:
    pg.execute(SCHEMA + f"""
INSERT INTO docs_a SELECT g, g % 97, {DOC} FROM generate_series(1, {rows}) g;
INSERT INTO docs_b SELECT g, g % 89, {DOC} FROM generate_series(1, {rows}) g;
INSERT INTO plain SELECT g, g % 83, 'n' || g FROM generate_series(1, {rows}) g;
INSERT INTO bag SELECT g % 50, 'b' || (g % 7), g % 3 FROM generate_series(1, {rows}) g;
INSERT INTO events SELECT g, DATE '2026-01-01' + (g % 360), 'k' || (g % 5) FROM generate_series(1, {rows}) g;
CREATE PUBLICATION bench FOR TABLE docs_a, docs_b, plain, bag, events WITH (publish_via_partition_root = true);
""", dbname=db)


def workload(tick: int, rng: random.Random) -> list[str]:
    """400 changes per table, the same SQL for both databases (drawn once per tick)."""
    base = 1_000_000 * tick
    statements = []
    for name in ("docs_a", "docs_b"):
        offset = rng.randint(0, 1000)
        statements += [  # 300 updates leaving doc unchanged, 40 key changes, 30 inserts, 30 deletes
            f"UPDATE {name} SET qty = qty + 1 WHERE id IN (SELECT id FROM {name} ORDER BY id LIMIT 300 OFFSET {offset})",
            f"UPDATE {name} SET id = id + {base} WHERE id IN (SELECT id FROM {name} WHERE id < {base} "
            f"ORDER BY id LIMIT 40 OFFSET {offset + 2000})",
            f"INSERT INTO {name} SELECT {base} + 500000 + g, g, {DOC} FROM generate_series(1, 30) g",
            f"DELETE FROM {name} WHERE id IN (SELECT id FROM {name} WHERE id < {base} ORDER BY id "
            f"LIMIT 30 OFFSET {offset + 4000})",
        ]
    offset = rng.randint(0, 1000)
    statements += [
        f"UPDATE plain SET qty = qty + 1, note = note || 'x' WHERE id IN (SELECT id FROM plain ORDER BY id "
        f"LIMIT 300 OFFSET {offset})",
        f"INSERT INTO plain SELECT {base} + g, g, 'new' FROM generate_series(1, 50) g",
        f"DELETE FROM plain WHERE id IN (SELECT id FROM plain WHERE id < {base} ORDER BY id LIMIT 50 OFFSET {offset + 3000})",
        # keyless: identical rows inserted, single copies updated and deleted by ctid (200 + 100 + 100)
        f"INSERT INTO bag SELECT g % 50, 'b' || (g % 7), {tick % 3} FROM generate_series(1, 200) g",
        f"UPDATE bag SET n = n + 1 WHERE ctid IN (SELECT ctid FROM bag WHERE a = {rng.randint(0, 49)} LIMIT 1)",
        f"UPDATE bag SET n = n + 1 WHERE ctid IN (SELECT ctid FROM bag ORDER BY a, b, n, ctid LIMIT 99 OFFSET {offset})",
        f"DELETE FROM bag WHERE ctid IN (SELECT ctid FROM bag ORDER BY b, a, n, ctid LIMIT 100 OFFSET {offset})",
        # partitioned: updates across both partitions, inserts, deletes
        f"UPDATE events SET kind = kind || 'u' WHERE id IN (SELECT id FROM events ORDER BY id LIMIT 300 OFFSET {offset})",
        f"INSERT INTO events SELECT {base} + g, DATE '2026-01-01' + (g * 7 % 360), 'new' FROM generate_series(1, 50) g",
        f"DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id < {base} ORDER BY id LIMIT 50 OFFSET {offset + 3000})",
    ]
    return statements


def differences(pg, db: str, spark, warehouse: Path, namespace: str = "bench") -> list[str]:
    """Tables whose lakehouse rows (as a multiset) differ from the source's."""
    from collections import Counter

    from pyspark.sql import functions as F

    out = []
    for source in TABLES:
        name = source.split(".")[1]
        columns = {"docs_a": "id, qty, md5(doc)", "docs_b": "id, qty, md5(doc)", "plain": "id, qty, note",
                   "bag": "a, b, n", "events": "id, day, kind"}[name]
        expected = Counter(tuple(row) for row in pg.query(f"SELECT {columns} FROM {name}", dbname=db))
        frame = spark.read.format("iceberg").load(f"{(warehouse / namespace / f'public__{name}').as_uri()}")
        picked = [F.md5(F.col("doc")) if c == "md5(doc)" else F.col(c) for c in map(str.strip, columns.split(","))]
        got = Counter(tuple(row) for row in frame.select(*picked).collect())
        if got != expected:
            out.append(f"{db}.{name}: {sum((got - expected).values())} rows too many, "
                       f"{sum((expected - got).values())} missing")
    return out


def finish(spark, wrong: list[str]) -> None:
    """Say whether every lakehouse equals its source, stop Spark, and fail the run if one does not."""
    print("every table equal to its source in every lakehouse" if not wrong else f"DIFFERENCES: {wrong}")
    spark.stop()
    if wrong:
        raise SystemExit(1)


def compare_s3(rows: list[dict], pipeline) -> list[str]:
    """Print the S3 pipeline's medians and ratio to the local submit pipeline, then verify its
    lakehouse against its source (``verify_pipeline``: PostgreSQL digests, a Spark job through the
    JDBC catalog); returns the tables that differ."""
    from airflow_provider_pglogical.verification.witness import verify_pipeline

    local, remote = (statistics.median(r[key] for r in rows) for key in ("apply_task", "apply_task_s3"))
    print(f"S3 + JDBC catalog, medians over {len(rows)} ticks: apply task {remote:.2f} s, in-job "
          f"{statistics.median(r['in_job_s3'] for r in rows):.2f} s; local {local:.2f} s: "
          f"{remote / local:.2f}x the local apply task; in-job phases (medians) S3 "
          f"{bench_tick.phase_medians([r['phases_s3'] for r in rows])}; local "
          f"{bench_tick.phase_medians([r['phases'] for r in rows])}")
    verified = verify_pipeline(postgres_conn_id="bench_s3", publications=["bench"],
                               staging_path=pipeline.staging, pipeline="p", iceberg=pipeline.iceberg,
                               report=lambda message: None)
    return [] if verified["equal"] else [f"s3: {verified['summary']}"]


def steps_line(steps: list[dict]) -> str:
    """Each table's step: seconds and Spark jobs."""
    return ", ".join(f"{s['table'].split('.')[1]} {s['seconds']:.1f} s/{s.get('spark_jobs', 0)} jobs" for s in steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=6)
    parser.add_argument("--driver-jvm", default="none,c1", help="of none, c1, cds, c1+cds")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--lakehouse", default="local", choices=["local", "local,s3"],
                        help="local,s3: also apply the same ticks to an S3 server with a JDBC catalog")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if args.tiny:
        args.ticks, args.rows, args.driver_jvm = 1, 500, "none"
    quiet_logs()
    with tempfile.TemporaryDirectory() as tmp, bench_tick.cluster("bench_mixed") as pg:
        tmp_path = Path(tmp)
        # --tiny: no baseline (bench_idle_apply's tiny run covers it), one JVM fewer in CI
        baseline = float("nan") if args.tiny else bench_tick.bare_spark_submit_seconds(tmp_path)
        print(f"bare spark-submit of an empty PySpark job: {baseline:.2f} s (load {bench_tick.load()})", flush=True)
        s3 = bench_tick.s3_lakehouse(pg) if "s3" in args.lakehouse else None
        pipelines = {}
        for db in ("submit", "inproc", *(["s3"] if s3 else [])):
            pg.create_database(db)
            create_source(pg, db, args.rows)
            pipelines[db] = bench_tick.Pipeline(pg, db, tmp_path, db, "s3" if db == "s3" else "local",
                                                s3 if db == "s3" else None)
            pipelines[db].sync()
        submit, on_s3 = pipelines["submit"], pipelines.get("s3")
        settings = args.driver_jvm.split(",")
        jvm = bench_tick.driver_jvm_settings(tmp_path)
        submit.apply(java_options=jvm["dump"] if any("cds" in name for name in settings) else "")  # writes the archive
        if on_s3:
            on_s3.apply(java_options=jvm["dump"] if any("cds" in name for name in settings) else "")
        warehouse = tmp_path / "warehouse-inproc"
        spark = spark_session(warehouse, args.driver_memory)
        staging = tmp_path / "staging-inproc"

        def apply_in_process() -> tuple[float, list[dict]]:
            result = apply_changes.run(spark, ApplyOptions(staging.as_uri(), "p", namespace="bench"))
            return result["seconds"], result["steps"]

        apply_in_process()  # the snapshot, and the session's first queries
        rng = random.Random(11)
        rows: list[dict] = []
        for tick in range(args.ticks + 1):  # tick 0 warms
            quick = settings[tick % len(settings)]
            statements = workload(tick + 1, rng)
            pulled = {}
            for db, pipeline in pipelines.items():
                pg.execute("; ".join(statements), dbname=db)
                pulled[db] = pipeline.pull().get("changes", 0)
            wall, cold = submit.apply(java_options=jvm[quick])
            cold_steps = steps_line(submit.steps)
            warm, warm_steps = apply_in_process()
            row = {"tick": tick, "driver_jvm": quick, "changes": pulled["submit"], "apply_task": wall,
                   "in_job_submit": cold, "in_job_inproc": warm, "load": bench_tick.load()}
            if on_s3:
                row["apply_task_s3"], row["in_job_s3"] = on_s3.apply(java_options=jvm[quick])
                row["phases"], row["phases_s3"] = submit.phases, on_s3.phases
                print(f"tick {tick} on S3 + JDBC: apply task {row['apply_task_s3']:.2f} s (spark-submit "
                      f"{on_s3.submit_seconds:.2f} s), in-job {row['in_job_s3']:.2f} s, the S3 server's CPU "
                      f"{on_s3.server_cpu:.2f} s, phases {on_s3.phases} [{steps_line(on_s3.steps)}]; local phases "
                      f"{submit.phases}", flush=True)
            print(f"tick {tick}: {row['changes']} changes (in-process pipeline {pulled['inproc']}); driver JVM {quick}: "
                  f"apply task {wall:.2f} s, in-job {cold:.2f} s [{cold_steps}]; in-process in-job {warm:.2f} s "
                  f"[{steps_line(warm_steps)}] (load {row['load']})", flush=True)
            if tick:
                rows.append(row)
        for quick in settings:
            picked = [r for r in rows if r["driver_jvm"] == quick]
            medians = {key: statistics.median(r[key] for r in picked) for key in ("apply_task", "in_job_submit")}
            print(f"driver JVM {quick}, medians over {len(picked)} ticks: apply task {medians['apply_task']:.2f} s "
                  f"({medians['apply_task'] / baseline:.2f}x bare spark-submit), in-job (spark-submit) "
                  f"{medians['in_job_submit']:.2f} s")
        print(f"in-job in the long-lived session, median over {len(rows)} ticks: "
              f"{statistics.median(r['in_job_inproc'] for r in rows):.2f} s")
        wrong = differences(pg, "submit", spark, tmp_path / "warehouse-submit") + differences(pg, "inproc", spark, warehouse)
        if on_s3:
            wrong += compare_s3(rows, on_s3)
            s3.close(False)
        finish(spark, wrong)


if __name__ == "__main__":
    main()
