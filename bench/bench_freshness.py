"""Freshness through a running Airflow scheduler (issue 38's measurement).

    python bench/bench_freshness.py [--minutes 8] [--every 0.1] [--workdir DIR] [--tiny]

Starts its own PostgreSQL (the demo's schema), then Airflow's ``api-server``, ``scheduler``
(LocalExecutor) and ``dag-processor`` on loopback with the example sync DAG copied under the id
``pglogical_freshness`` with ``schedule="@continuous"``, every task's ``spark-submit`` as it is.
After the first run (initial sync and first apply) a writer commits one UPDATE every ``--every``
seconds for ``--minutes``. A commit's freshness is the end of the first successful apply whose
run's pull covered the commit's LSN, minus the commit's time.

Prints p50, p95 and max freshness, the ticks (DAG runs) and where a tick's time goes: each task's
median duration, the gaps between tasks in a run, and the delay between one run's end and the
next one's start; and how the apply's duration drifted from the first fifth of the ticks to the
last (the issue asks for a tick cost that stays flat). ``--tiny`` writes for 15 seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.environment import prepare  # noqa: E402

prepare()  # spark-submit beside this interpreter, Spark on loopback

from airflow_provider_pglogical.embedded import demo  # noqa: E402
from airflow_provider_pglogical.embedded.postgres import LocalPostgres, wait_until  # noqa: E402
from airflow_provider_pglogical.lsn import Lsn  # noqa: E402
from tests.support.airflow_server import answers, free_port  # noqa: E402

AIRFLOW = str(Path(sys.executable).parent / "airflow")
DAG_ID = "pglogical_freshness"


def continuous_dags(folder: Path) -> None:
    """The example sync DAG and its settings in ``folder``, the DAG renamed and on ``@continuous``."""
    folder.mkdir(parents=True)
    (folder / "pglogical_settings.py").write_text((demo.DAGS / "pglogical_settings.py").read_text())
    text = (demo.DAGS / "pglogical_lakehouse_sync.py").read_text()
    text, renamed = re.subn(r'dag_id="pglogical_lakehouse_sync"', f'dag_id="{DAG_ID}"', text)
    text, rescheduled = re.subn(r"schedule=CronTriggerTimetable\([^)]*\),", 'schedule="@continuous",', text)
    # a start date minutes ago: the first run's data interval then holds no housekeeping boundary,
    # so no run of the measurement runs it (as in the issue's: "housekeeping not due")
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=5)
    text, started = re.subn(r"start_date=pendulum\.datetime\([^)]*\),",
                            f'start_date=pendulum.datetime({start.year}, {start.month}, {start.day}, {start.hour}, '
                            f'{start.minute}, tz="UTC"),', text)
    text, unpaused = re.subn(r"    max_active_runs=1,\n", "    max_active_runs=1,\n    is_paused_upon_creation=False,\n", text)
    if (renamed, rescheduled, started, unpaused) != (1, 1, 1, 1):
        raise SystemExit("bench_freshness: the example DAG's dag_id, schedule or start_date line changed: "
                         "update continuous_dags()")
    (folder / "pglogical_freshness.py").write_text(text)


class Services:
    """Airflow's api-server, scheduler and dag-processor, each in its own process group."""

    def __init__(self, env: dict, logs: Path) -> None:
        self.env, self.logs, self.processes = env, logs, []

    def start(self, port: int) -> None:
        for name, args in (("api-server", ["api-server", "--host", "127.0.0.1", "--port", str(port)]),
                           ("scheduler", ["scheduler"]), ("dag-processor", ["dag-processor"])):
            with open(self.logs / f"{name}.log", "w") as log:
                self.processes.append(subprocess.Popen([AIRFLOW, *args], env=self.env, stdout=log,
                                                       stderr=subprocess.STDOUT, start_new_session=True))
            if name == "api-server":
                wait_until(lambda: answers(f"http://127.0.0.1:{port}/execution/health"), timeout=180,
                           message="the Airflow API server to answer")

    def stop(self) -> None:
        for process in self.processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def airflow(env: dict, *args: str) -> None:
    proc = subprocess.run([AIRFLOW, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"airflow {' '.join(args)} failed:\n{proc.stdout[-6000:]}")


class Metadata:
    """What the runs did, read from Airflow's SQLite file (no Airflow start per question)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self, statement: str, *params) -> list:
        with sqlite3.connect(self.path, timeout=30) as db:
            return db.execute(statement, params).fetchall()

    def task_instances(self) -> list[dict]:
        rows = self.rows("SELECT ti.run_id, ti.task_id, ti.state, ti.start_date, ti.end_date FROM task_instance ti "
                         "WHERE ti.dag_id = ? AND ti.start_date IS NOT NULL AND ti.end_date IS NOT NULL "
                         "AND ti.state != 'skipped'", DAG_ID)
        return [{"run": r, "task": t, "state": s, "start": stamp(a), "end": stamp(b)} for r, t, s, a, b in rows]

    def runs(self) -> list[dict]:
        rows = self.rows("SELECT run_id, state, start_date, end_date FROM dag_run WHERE dag_id = ? AND "
                         "start_date IS NOT NULL AND end_date IS NOT NULL ORDER BY start_date", DAG_ID)
        return [{"run": r, "state": s, "start": stamp(a), "end": stamp(b)} for r, s, a, b in rows]

    def pulled_to(self) -> dict[str, Lsn]:
        """Per run, the position its pull consumed the slot to (the pull task's return value)."""
        out = {}
        for run, value in self.rows("SELECT run_id, value FROM xcom WHERE dag_id = ? AND task_id = 'pull' AND "
                                    "key = 'return_value'", DAG_ID):
            while isinstance(value, (str, bytes)):
                value = json.loads(value)
            if isinstance(value, dict) and value.get("end_lsn"):
                out[run] = Lsn.parse(value["end_lsn"])
        return out

    def finished_past(self, position: Lsn) -> bool:
        """Whether a run that pulled past ``position`` has ended (its figures are all in)."""
        pulled = self.pulled_to()
        return any(run["run"] in pulled and pulled[run["run"]] >= position for run in self.runs())

    def coverage(self) -> list[tuple[Lsn, float]]:
        """(position, time it became readable) per successful apply, in time order."""
        pulled = self.pulled_to()
        return sorted(((pulled[ti["run"]], ti["end"]) for ti in self.task_instances()
                       if ti["task"] == "apply" and ti["state"] == "success" and ti["run"] in pulled),
                      key=lambda pair: pair[1])


def stamp(value: str) -> float:
    """An Airflow SQLite timestamp as epoch seconds."""
    parsed = datetime.fromisoformat(str(value).replace(" ", "T"))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()


class Writer(threading.Thread):
    """One UPDATE every ``every`` seconds in autocommit; records (commit time, LSN after the commit)."""

    def __init__(self, pg: LocalPostgres, db: str, every: float) -> None:
        super().__init__(daemon=True)
        self.pg, self.db, self.every = pg, db, every
        self.commits: list[tuple[float, Lsn]] = []
        self.done = threading.Event()

    def run(self) -> None:
        conn = self.pg.connect(self.db)
        conn.autocommit = True
        rng = random.Random(5)
        with conn.cursor() as cur:
            next_at = time.monotonic()
            while not self.done.is_set():
                cur.execute("UPDATE orders SET status = %s WHERE id = (SELECT min(id) FROM orders) + %s",
                            (f"s{rng.randint(0, 999)}", rng.randint(0, 50)))
                committed = time.time()
                cur.execute("SELECT pg_current_wal_lsn()::text")
                self.commits.append((committed, Lsn.parse(cur.fetchone()[0])))
                next_at += self.every
                self.done.wait(max(0.0, next_at - time.monotonic()))
        conn.close()


def freshness(commits: list[tuple[float, Lsn]], coverage: list[tuple[Lsn, float]]) -> list[float]:
    """Per commit: the first apply end after it whose run pulled past its LSN, minus its time."""
    out = []
    for committed, lsn in commits:
        ends = [end for position, end in coverage if position >= lsn and end >= committed]
        if ends:
            out.append(min(ends) - committed)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def tick_breakdown(metadata: Metadata, since: float) -> dict:
    """Where a tick's time goes, over the runs that ended after ``since`` (the writer's start)."""
    runs = [r for r in metadata.runs() if r["end"] > since]
    names = {r["run"] for r in runs}
    tis = [ti for ti in metadata.task_instances() if ti["run"] in names]
    by_task: dict[str, list[float]] = {}
    for ti in tis:
        by_task.setdefault(ti["task"], []).append(ti["end"] - ti["start"])
    gaps, delays = [], []
    for previous, run in zip(runs, runs[1:]):
        delays.append(run["start"] - previous["end"])
    for run in runs:
        busy = sum(ti["end"] - ti["start"] for ti in tis if ti["run"] == run["run"])
        gaps.append(max(0.0, (run["end"] - run["start"]) - busy))  # the tasks of a run are a chain
    applies = [ti["end"] - ti["start"] for ti in sorted(tis, key=lambda t: t["start"]) if ti["task"] == "apply"]
    fifth = max(1, len(applies) // 5)
    return {
        "ticks": len(runs),
        "tick_median_s": round(statistics.median([r["end"] - r["start"] for r in runs]), 2) if runs else None,
        "task_median_s": {task: round(statistics.median(values), 2) for task, values in sorted(by_task.items())},
        "gaps_in_run_median_s": round(statistics.median(gaps), 2) if gaps else None,
        "between_runs_median_s": round(statistics.median(delays), 2) if delays else None,
        "apply_drift": round(statistics.median(applies[-fifth:]) / statistics.median(applies[:fifth]), 2)
        if len(applies) >= 2 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--every", type=float, default=0.1, help="seconds between the writer's commits")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--tiny", action="store_true", help="write for 5 seconds (CI)")
    args = parser.parse_args(argv)
    seconds = 5.0 if args.tiny else args.minutes * 60
    home = Path(args.workdir or tempfile.mkdtemp(prefix="pglogical-freshness-"))
    home.mkdir(parents=True, exist_ok=True)
    pg = LocalPostgres(name="freshness").start()
    services = None
    try:
        pg.create_database("shop")
        demo.load(pg, "shop", random.Random(3))
        continuous_dags(home / "dags")
        port = free_port()
        env = demo.airflow_env(home, pg, "shop")
        env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"), "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
                    "PYTHONPATH": os.pathsep.join([str(home / "dags"), str(REPO)])})
        airflow(env, "db", "migrate")  # the dag-processor finds the DAG, created unpaused
        metadata = Metadata(home / "airflow.db")
        services = Services(env, home)
        started = time.monotonic()
        services.start(port)
        wait_until(lambda: any(run["state"] == "success" for run in metadata.runs()), timeout=900, interval=1,
                   message="the first run (initial sync and first apply)")
        print(f"first run done {time.monotonic() - started:.0f} s after the services started; writing for "
              f"{seconds:.0f} s, one UPDATE every {args.every} s", flush=True)
        since = time.time()
        writer = Writer(pg, "shop", args.every)
        writer.start()
        writer.done.wait(seconds)
        writer.done.set()
        writer.join()
        last = writer.commits[-1][1]
        wait_until(lambda: metadata.finished_past(last), timeout=300, interval=1,
                   message="a finished run whose pull covered the writer's last commit")
        load = os.getloadavg()
    finally:
        if services is not None:
            services.stop()
        pg.stop()
    values = freshness(writer.commits, metadata.coverage())
    breakdown = tick_breakdown(metadata, since)
    print(json.dumps({"commits": len(writer.commits), "measured": len(values), **breakdown,
                      "load_average_1_5_15": [round(x, 2) for x in load]}, indent=1))
    if len(values) != len(writer.commits):
        raise SystemExit(f"{len(writer.commits) - len(values)} commit(s) never became readable")
    print(f"freshness through the scheduler: p50 {percentile(values, 0.5):.1f} s, p95 {percentile(values, 0.95):.1f} s, "
          f"max {max(values):.1f} s over {len(values)} commits and {breakdown['ticks']} ticks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
