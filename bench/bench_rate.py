"""Sustained change rate of the streaming pipeline (issue 51): rate against freshness and lag, CPU
per change, and where the time goes at each rate.

    python bench/bench_rate.py [--rates 1000,5000,10000,20000] [--minutes 3] [--rows 20000] [--tiny]

Source: 10 tables (two with a TOAST column, ``STORAGE EXTERNAL``, that updates leave unchanged;
key changes in three; the last one keyless, ``REPLICA IDENTITY FULL``) plus the marker table
(``snapshot_judge.py``'s ``events``). A writer commits one multi-row transaction every 100 ms
holding ``rate / 10`` changes spread over the 10 tables (half updates, a quarter inserts, a quarter
deletes, by key ranges; copies and ``ctid`` picks in the keyless table) and one marker update.

The pipeline is the streaming DAG's two windows, run in this process as the DAG runs them
(``PgSlotPullOperator`` with ``keep_running``, a pull every second, paced to at most 2 unapplied
batches; ``IcebergApplyOperator`` with ``keep_running``, a poll every 0.5 s: each window's
rounds fold pending batches, ``plan.fold_changes``), one window over all the rates, which run
back to back, ``--minutes`` each. Per rate it prints:

- the rate the writer reached (changes/s), and freshness p50/p95/max by Iceberg's own snapshots
  (``snapshot_judge.py``: each transaction until the first snapshot of the marker table holding
  it), for the first and the second half of the rate's minutes (lag growing: the second half's
  p95 well above the first's), and the slot's lag at its end (the pull history's ``lag_bytes``);
- CPU per change: CPU seconds of PostgreSQL's processes and of this process and its children
  (the Spark driver JVM), sampled every 2 s, over the changes written;
- per stage, the share of the rate's wall time it was busy: the pull (its history's seconds),
  the apply rounds (the apply history's seconds) and, inside them, each phase (listing, state
  read, planning, steps, state commits, compaction, retention); the rounds per minute (the commit
  cadence), rows and steps per round. The stage nearest 100% busy bounds the rate.

The machine is shared: the load average is printed with every figure. ``--tiny`` (CI): 500 rows per
table, one rate of 200 changes/s for 20 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from bench.common import cluster  # noqa: E402  (prepares the environment)
from bench_freshness import Rounds, percentile, phase_medians  # noqa: E402
from snapshot_judge import SnapshotJudge, create_markers, events_table, mark  # noqa: E402

os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))

import psutil  # noqa: E402
from psycopg2 import sql  # noqa: E402
from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator  # noqa: E402
from airflow_provider_pglogical.operators.pull import PgSlotPullOperator  # noqa: E402

DB, SLOT, PUBLICATION, PIPELINE = "rate", "rate", "rate", "p"
TABLES = 10
BIG = {0, 1}  # tables with a TOAST column
MOVES = {0, 4, 8}  # tables whose key changes
KEYLESS = TABLES - 1
DOC = "repeat(md5(g::text), 80)"  # 2.5 kB: out of line under STORAGE EXTERNAL


def create_source(pg, rows: int) -> None:
    statements = [f"CREATE SEQUENCE ids START {rows + 1}"]
    for i in range(TABLES):
        if i == KEYLESS:
            statements += [f"CREATE TABLE t{i} (a int, b text, c int)", f"ALTER TABLE t{i} REPLICA IDENTITY FULL",
                           f"INSERT INTO t{i} SELECT g % {max(1, rows // 3)}, 'k', 0 FROM generate_series(1, {rows}) g"]
            continue
        doc = ", doc text" if i in BIG else ""
        statements.append(f"CREATE TABLE t{i} (id bigint PRIMARY KEY, qty int, note text{doc})")
        if i in BIG:
            statements.append(f"ALTER TABLE t{i} ALTER COLUMN doc SET STORAGE EXTERNAL")
        statements.append(f"INSERT INTO t{i} SELECT g, g % 97, 'n'{', ' + DOC if i in BIG else ''} "
                          f"FROM generate_series(1, {rows}) g")
    statements += ["CREATE TABLE events (id bigint NOT NULL, day date NOT NULL, kind text, payload jsonb, "
                   "PRIMARY KEY (id, day))",
                   f"CREATE PUBLICATION {PUBLICATION} FOR TABLE events, {', '.join(f't{i}' for i in range(TABLES))}"]
    pg.execute("; ".join(statements), dbname=DB)


class Writer(threading.Thread):
    """One transaction every 100 ms of ``rate / 10`` changes over the tables and one marker update;
    the rate can be changed while it runs. Records (commit time, seq) and (commit time, changes)."""

    def __init__(self, pg, rows: int) -> None:
        super().__init__(daemon=True)
        self.pg, self.rate, self.done = pg, 0, threading.Event()
        self.marks: list[tuple[float, int]] = []
        self.changes: list[tuple[float, int]] = []
        # per keyed table: the lowest live id (deletes take the oldest rows) and the update cursor
        self.low = {i: 1 for i in range(TABLES)}
        self.cursor = {i: rows // 2 for i in range(TABLES)}
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # reported by the main thread
            self.failure = error

    def _run(self) -> None:
        conn = self.pg.connect(DB)
        with conn.cursor() as cur:
            next_at = time.monotonic()
            while not self.done.is_set():
                per_table = max(4, self.rate // 10 // TABLES)
                written = sum(self.table_changes(cur, i, per_table) for i in range(TABLES))
                seq = len(self.marks)
                mark(cur, seq)
                conn.commit()
                now = time.time()
                self.marks.append((now, seq))
                self.changes.append((now, written + 1))
                next_at += 0.1
                self.done.wait(max(0.0, next_at - time.monotonic()))
        conn.close()

    def table_changes(self, cur, i: int, n: int) -> int:
        updates, inserts = n // 2, n // 4
        deletes = n - updates - inserts
        done, table = 0, sql.Identifier(f"t{i}")
        if i == KEYLESS:
            for statement, values in (
                ("UPDATE {t} SET c = c + 1 WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} OFFSET %s LIMIT %s))", (n, updates)),
                ("INSERT INTO {t} SELECT a, b, c FROM {t} LIMIT %s", (inserts // 2,)),
                ("INSERT INTO {t} SELECT g, 'new', 0 FROM generate_series(1, %s) g", (inserts - inserts // 2,)),
                ("DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t} LIMIT %s))", (deletes,)),
            ):
                cur.execute(sql.SQL(statement).format(t=table), values)
                done += cur.rowcount
            return done
        moves = updates // 5 if i in MOVES else 0
        top = self.cursor[i] + updates
        cur.execute(sql.SQL("UPDATE {} SET qty = qty + 1, note = 'u' WHERE id >= %s AND id < %s").format(table),
                    (self.cursor[i], top))
        done += cur.rowcount
        if cur.rowcount == 0:  # past the live rows: from the oldest again
            self.cursor[i] = self.low[i]
        else:
            self.cursor[i] = top
        if moves:
            cur.execute(sql.SQL("UPDATE {} SET id = nextval('ids') WHERE id >= %s AND id < %s").format(table),
                        (self.low[i] + deletes, self.low[i] + deletes + moves))
            done += cur.rowcount
        doc = sql.SQL(", " + DOC) if i in BIG else sql.SQL("")
        cur.execute(sql.SQL("INSERT INTO {} SELECT nextval('ids'), g, 'i'{} FROM generate_series(1, %s) g").format(table, doc),
                    (inserts,))
        done += cur.rowcount
        cur.execute(sql.SQL("DELETE FROM {} WHERE id >= %s AND id < %s").format(table), (self.low[i], self.low[i] + deletes))
        done += cur.rowcount
        self.low[i] += deletes
        return done


class Cpu:
    """CPU seconds of the process trees of this process and of PostgreSQL's postmaster, sampled:
    each process counts with its last sample (one that ended between two samples loses < 2 s)."""

    def __init__(self, postmaster: int) -> None:
        self.roots = [psutil.Process(os.getpid()), psutil.Process(postmaster)]
        self.seen: dict[int, float] = {}

    def sample(self) -> float:
        for root in self.roots:
            for process in [root, *root.children(recursive=True)]:
                try:
                    times = process.cpu_times()
                    self.seen[process.pid] = times.user + times.system
                except psutil.Error:
                    continue
        return sum(self.seen.values())


def period_figures(rate: int, start: float, end: float, writer: Writer, judge: SnapshotJudge, history: Rounds,
                   cpu: float, loads: list) -> dict:
    """The figures of one rate's minutes [start, end)."""
    marks = [m for m in writer.marks if start <= m[0] < end]
    fresh = judge.freshness(marks)
    middle = (start + end) / 2
    halves = [[v for (t, _), v in zip(marks, fresh) if v is not None and (t < middle) == first] for first in (True, False)]
    values = halves[0] + halves[1]
    changes = sum(c for t, c in writer.changes if start <= t < end)
    seconds = end - start
    rounds = [r for r in history.rounds() if start <= r["t"] < end]
    working = [r for r in rounds if r["steps"]]
    pulls = [p for p in history.pulls() if p.get("batch") and start <= time_of(p) < end]
    phases = {name: round(sum((r.get("phases") or {}).get(name, 0.0) for r in rounds) / seconds, 3)
              for name in sorted({n for r in rounds for n in (r.get("phases") or {})})}
    busy = {"pull": round(sum(p.get("seconds", 0.0) for p in pulls) / seconds, 3),
            "apply_rounds": round(sum(r.get("seconds") or 0.0 for r in rounds) / seconds, 3)}
    return {
        "rate_target": rate, "rate_reached": round(changes / seconds), "transactions": len(marks),
        # transactions no snapshot held 2 minutes after the rate's end (left out of the percentiles)
        "unjudged": sum(v is None for v in fresh),
        "p50_s": round(percentile(values, 0.5), 2) if values else None,
        "p95_s": round(percentile(values, 0.95), 2) if values else None,
        "max_s": round(max(values), 2) if values else None,
        "p95_first_half_s": round(percentile(halves[0], 0.95), 2) if halves[0] else None,
        "p95_second_half_s": round(percentile(halves[1], 0.95), 2) if halves[1] else None,
        "slot_lag_bytes_end": pulls[-1].get("lag_bytes") if pulls else None,
        "cpu_ms_per_change": round(1000 * cpu / changes, 3) if changes else None,
        "busy_share": busy, "apply_phase_share": phases,
        "rounds_per_min": round(60 * len(working) / seconds, 1),
        "rows_per_round_median": statistics.median([r["rows"] for r in working]) if working else None,
        "steps_per_round_median": statistics.median([r["steps"] for r in working]) if working else None,
        "pull_s_median": round(statistics.median([p["seconds"] for p in pulls]), 3) if pulls else None,
        "rows_per_pull_median": statistics.median([p.get("rows", 0) for p in pulls]) if pulls else None,
        "round_phases_median_s": phase_medians(working),
        "load_average_1min_mean": round(statistics.mean(x[0] for x in loads), 2) if loads else None,
    }


def time_of(entry: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(entry["at"]).timestamp()


def bound(figures: dict) -> str:
    """The busiest stage, inside the apply its busiest phase, and the writer when it fell short."""
    busy = figures["busy_share"]
    stage = max(busy, key=busy.get)
    text = f"{stage} ({busy[stage]:.0%} busy)"
    if stage == "apply_rounds" and figures["apply_phase_share"]:
        phases = figures["apply_phase_share"]
        top = max(phases, key=phases.get)
        text = f"apply rounds ({busy[stage]:.0%} busy; {top} {phases[top]:.0%} of the wall time)"
    if figures["rate_reached"] < 0.9 * figures["rate_target"]:
        text += f"; the writer (PostgreSQL) reached {figures['rate_reached']} of {figures['rate_target']} changes/s"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,5000,10000,20000")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rows", type=int, default=20_000, help="rows per table")
    parser.add_argument("--tiny", action="store_true", help="500 rows per table, 200 changes/s for 20 s (CI)")
    args = parser.parse_args(argv)
    logging.getLogger("airflow").setLevel(logging.WARNING)  # a line per pull otherwise
    logging.getLogger("airflow_provider_pglogical").setLevel(logging.WARNING)
    if args.tiny:
        args.rates, args.minutes, args.rows = "200", 20 / 60, 500
    rates = [int(r) for r in args.rates.split(",")]
    seconds = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="pglogical-rate-") as tmp, cluster("bench_rate") as pg:
        tmp_path = Path(tmp)
        pg.create_database(DB)
        create_source(pg, args.rows)
        conn = pg.connect(DB)
        create_markers(conn)
        conn.close()
        os.environ["AIRFLOW_CONN_RATE_SOURCE"] = pg.connection_uri(DB)
        staging, warehouse = (tmp_path / "staging").as_uri(), tmp_path / "warehouse"
        iceberg = IcebergConfig(warehouse=warehouse.as_uri(), namespace="rate")
        run_initial_sync(PgLogicalHook(postgres_conn_id="rate_source"), slot=SLOT, publications=[PUBLICATION],
                         root=ObjectStoragePath(staging),
                         pipeline=PIPELINE, report=lambda message: None)
        window = len(rates) * seconds + 600
        pull = PgSlotPullOperator(task_id="pull_window", postgres_conn_id="rate_source", slot=SLOT,
                                  publications=[PUBLICATION], staging_root=staging, pipeline=PIPELINE,
                                  keep_running=window, poll_interval=1.0, max_unapplied_batches=2)
        apply = IcebergApplyOperator(task_id="apply_window", staging_root=staging, pipeline=PIPELINE, iceberg=iceberg,
                                     keep_running=window, poll_interval=0.5)
        failed: list[BaseException] = []

        def run(operator) -> None:
            try:
                operator.execute({})
            except BaseException as error:  # ended by on_kill at the end; anything else is reported
                failed.append(error)

        threads = [threading.Thread(target=run, args=(op,), daemon=True) for op in (apply, pull)]
        for thread in threads:
            thread.start()
        history = Rounds(tmp_path / "staging" / PIPELINE)
        postmaster = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
        cpu = Cpu(postmaster)
        deadline = time.monotonic() + 900
        while not history.snapshot_applied():  # the initial snapshot's round recorded: the writer starts after it
            if failed or time.monotonic() > deadline:
                raise SystemExit(f"bench_rate: the initial snapshot was not applied: {failed}")
            time.sleep(1)
        judge = SnapshotJudge(events_table(warehouse, "rate"), verify_every=0.0 if args.tiny else 120.0)
        writer = Writer(pg, args.rows)
        results = []
        try:
            writer.start()
            for rate in rates:
                writer.rate = rate
                start, loads, used = time.time(), [], cpu.sample()
                while time.time() < start + seconds and not failed and writer.failure is None:
                    time.sleep(2)
                    cpu.sample()
                    loads.append(os.getloadavg())
                    history.collect()
                    judge.poll()
                end = time.time()
                used = cpu.sample() - used
                settle = time.monotonic() + 120  # the rate's last commits into a snapshot (the next rate writes on)
                while time.monotonic() < settle and any(v is None for v in judge.freshness(
                        [m for m in writer.marks if start <= m[0] < end])):
                    time.sleep(2)
                    history.collect()
                    judge.poll()
                figures = period_figures(rate, start, end, writer, judge, history, used, loads)
                figures["bound"] = bound(figures)
                results.append(figures)
                print(json.dumps(figures), flush=True)
                if failed or writer.failure is not None:
                    raise SystemExit(f"bench_rate: a window or the writer failed: {failed or writer.failure!r}")
        finally:
            writer.done.set()
            writer.join(timeout=60)
            apply.on_kill()  # the window's spark-submit; the pull window's thread ends with the process
            threads[0].join(timeout=120)
    print(f"judge: {len(judge.snapshots)} snapshots read, {judge.verified} time-travel checks")
    for f in results:
        print(f"sustained rate: {f['rate_target']:>6} changes/s target, {f['rate_reached']:>6} reached: freshness p50 "
              f"{f['p50_s']} s, p95 {f['p95_s']} s (halves {f['p95_first_half_s']} / {f['p95_second_half_s']} s), max "
              f"{f['max_s']} s; slot lag {f['slot_lag_bytes_end']} B; CPU {f['cpu_ms_per_change']} ms/change; "
              f"{f['rounds_per_min']} rounds/min; bound: {f['bound']}; load {f['load_average_1min_mean']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
