"""Freshness through a running Airflow scheduler (issue 38's measurement).

    python bench/bench_freshness.py [--dag stream|sync] [--minutes 8] [--every 0.1] [--window-minutes 10]
                                    [--pull-every 1] [--poll 0.5] [--workdir DIR] [--tiny]

Starts its own PostgreSQL (the demo's schema), then Airflow's ``api-server``, ``scheduler``
(LocalExecutor) and ``dag-processor`` on loopback with an example DAG copied under the id
``pglogical_freshness``, unpaused, every ``spark-submit`` as the DAG has it. A writer commits one
UPDATE every ``--every`` seconds for ``--minutes``: the commit ``seq`` sets one of 600 marker rows of
``events`` to ``m<seq>`` (``snapshot_judge.py``).

**The judge is Iceberg's own snapshots** (issue 51): a commit's freshness is the commit timestamp
of the first snapshot of the events table that holds it, read by time travel, minus the commit's
time (``snapshot_judge.py``: each new snapshot's added marker rows, read while the run goes, checked
against a time-travel read of the newest snapshot every ``--verify-every`` seconds). Prints p50/p95/
p99/max, and writes them every minute to ``WORKDIR/progress.json`` while the run goes.

``--dag stream`` (default): the streaming DAG (``pglogical_lakehouse_stream``: pull and apply
windows of ``--window-minutes``, a pull every ``--pull-every`` seconds, the apply looking for new
batches every ``--poll`` seconds). The writer starts once the
initial snapshot is applied. Beside the judge's figures, the pipeline's own view: the time of the
first apply round (its apply history) whose end position covers the commit's LSN. Prints the
rounds, where a round's time goes (pull, apply round, poll), the gap at window boundaries and the share of commits that waited
for one, and the drift of the apply round's cost from the first fifth of the rounds to the last.

``--dag sync``: the sync DAG on ``@continuous`` (the issue's baseline): beside the judge, the end
of the first successful apply whose run's pull covered the commit's LSN; prints where a tick's time goes and the apply's drift.

``--tiny`` writes for 5 seconds (CI; with the stream DAG, windows of 3 minutes, ended by the bench).
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

sys.path.insert(0, str(REPO / "bench"))
from snapshot_judge import SnapshotJudge, create_markers, events_table, mark  # noqa: E402

AIRFLOW = str(Path(sys.executable).parent / "airflow")
DAG_ID = "pglogical_freshness"


def continuous_dags(folder: Path, dag: str = "sync", stream_dag: Path | None = None) -> None:
    """The example sync (or stream) DAG and its settings in ``folder``, the DAG renamed and started
    minutes ago; the sync DAG on ``@continuous``. The stream DAG keeps its schedule (a run every
    window, two at once; ``stream_dag``: another version of its file, such as the one before issue
    51's, on ``@continuous``), and its housekeeping DAG comes along, renamed too."""
    folder.mkdir(parents=True)
    (folder / "pglogical_settings.py").write_text((demo.DAGS / "pglogical_settings.py").read_text())
    text = (stream_dag or demo.DAGS / f"pglogical_lakehouse_{dag}.py").read_text()
    (folder / "pglogical_freshness.py").write_text(renamed(text, f"pglogical_lakehouse_{dag}", DAG_ID, dag == "sync"))
    housekeeping = demo.DAGS / "pglogical_lakehouse_housekeeping.py"
    if dag == "stream" and "maintenance_due" not in text:  # the housekeeping is a DAG of its own
        (folder / "pglogical_freshness_housekeeping.py").write_text(
            renamed(housekeeping.read_text(), "pglogical_lakehouse_housekeeping", f"{DAG_ID}_housekeeping", False))


def renamed(text: str, dag_id: str, new_id: str, continuous: bool) -> str:
    """A DAG file's text under ``new_id``, unpaused, started minutes ago (``continuous``: on ``@continuous``)."""
    text, count = re.subn(f'dag_id="{dag_id}"', f'dag_id="{new_id}"', text)
    if continuous:
        text, rescheduled = re.subn(r"schedule=CronTriggerTimetable\([^)]*\),", 'schedule="@continuous",', text)
        count += rescheduled - 1
    # a start date minutes ago: with data intervals, the first run's holds no housekeeping boundary
    start = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=5)
    text, started = re.subn(r"start_date=pendulum\.datetime\([^)]*\),",
                            f'start_date=pendulum.datetime({start.year}, {start.month}, {start.day}, {start.hour}, '
                            f'{start.minute}, tz="UTC"),', text)
    text, unpaused = re.subn(r"\n    max_active_runs=(\d)", r"\n    is_paused_upon_creation=False,\n    max_active_runs=\1", text)
    if (count, started, unpaused) != (1, 1, 1):
        raise SystemExit(f"bench_freshness: the DAG {dag_id}'s dag_id, schedule, start_date or max_active_runs "
                         "line changed: update renamed()")
    return text


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

    def housekeeping(self) -> list[dict]:
        """The housekeeping task instances (in the stream DAG's runs, or in its own DAG), in time order."""
        rows = self.rows("SELECT start_date, end_date, state FROM task_instance WHERE dag_id IN (?, ?) AND "
                         "task_id = 'maintenance' AND start_date IS NOT NULL AND end_date IS NOT NULL "
                         "ORDER BY start_date", DAG_ID, f"{DAG_ID}_housekeeping")
        return [{"start": stamp(a), "end": stamp(b), "state": s} for a, b, s in rows]

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
    """One UPDATE of a marker row every ``every`` seconds in autocommit; records (commit time, LSN
    after the commit) and (commit time, seq)."""

    def __init__(self, pg: LocalPostgres, db: str, every: float) -> None:
        super().__init__(daemon=True)
        self.pg, self.db, self.every = pg, db, every
        self.commits: list[tuple[float, Lsn]] = []
        self.marks: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        conn = self.pg.connect(self.db)
        conn.autocommit = True
        with conn.cursor() as cur:
            next_at = time.monotonic()
            while not self.done.is_set():
                seq = len(self.marks)
                mark(cur, seq)
                committed = time.time()
                cur.execute("SELECT pg_current_wal_lsn()::text")
                self.commits.append((committed, Lsn.parse(cur.fetchone()[0])))
                self.marks.append((committed, seq))
                next_at += self.every
                self.done.wait(max(0.0, next_at - time.monotonic()))
        conn.close()

    def marker(self) -> None:
        """Commit one more UPDATE, not measured."""
        conn = self.pg.connect(self.db)
        conn.autocommit = True
        with conn.cursor() as cur:
            # a row the demo's publication publishes (its row filter: region = 'EU')
            cur.execute("UPDATE orders SET status = 'marker' WHERE id = (SELECT min(id) FROM orders WHERE region = 'EU')")
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


class Rounds:
    """The pipeline's apply and pull history (one entry per round / staged pull), gathered while the
    run goes: each file keeps only its newest entries, so it is read often and merged by time."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries: dict[str, dict[str, dict]] = {"apply": {}, "pull": {}}

    def collect(self) -> None:
        for kind, kept in self.entries.items():
            path = self.directory / f"_history_{kind}.jsonl"
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                kept.setdefault(entry["at"], entry)

    def rounds(self) -> list[dict]:
        """Apply rounds in time order, each with ``t`` (epoch seconds), ``lsn`` and its ``window`` (1, 2, …)."""
        out, window = [], 0
        for entry in sorted(self.entries["apply"].values(), key=lambda e: e["at"]):
            if "round" not in entry or not entry.get("end_lsn"):
                continue
            window += entry["round"] == 1
            out.append({**entry, "t": datetime.fromisoformat(entry["at"]).timestamp(),
                        "lsn": Lsn.parse(entry["end_lsn"]), "window": window})
        return out

    def pulls(self) -> list[dict]:
        return sorted(self.entries["pull"].values(), key=lambda e: e["at"])

    def applied_past(self, position: Lsn) -> bool:
        self.collect()
        return any(r["lsn"] >= position for r in self.rounds())

    def snapshot_applied(self) -> bool:
        self.collect()
        return any(r["steps"] for r in self.rounds())


def stream_freshness(commits: list[tuple[float, Lsn]], rounds: list[dict]) -> list[tuple[float, bool]]:
    """Per commit: (the first round after it whose end covers its LSN, minus its time; whether it
    waited for a window boundary: committed before the first round of the window that applied it)."""
    first_of = {}
    for r in rounds:
        first_of.setdefault(r["window"], r["t"])
    out = []
    for committed, lsn in commits:
        covering = next((r for r in rounds if r["lsn"] >= lsn and r["t"] >= committed), None)
        if covering is not None:
            out.append((covering["t"] - committed, committed < first_of[covering["window"]]))
    return out


def stream_breakdown(rounds: list[dict], pulls: list[dict], since: float) -> dict:
    """Where a round's time goes, the boundaries between windows, and the drift of a round's cost."""
    measured = [r for r in rounds if r["t"] >= since]
    working = [r for r in measured if r["steps"] and r["round"] > 1]  # a window's first round waits for its JVM
    costs = [r["seconds"] for r in working]
    fifth = max(1, len(costs) // 5)
    spacing = [b["t"] - a["t"] for a, b in zip(working, working[1:]) if a["window"] == b["window"]]
    gaps = [b["t"] - a["t"] for a, b in zip(rounds, rounds[1:]) if b["window"] != a["window"]]
    pull_seconds = [p["seconds"] for p in pulls if p.get("batch") and "seconds" in p
                    and datetime.fromisoformat(p["at"]).timestamp() >= since]
    return {
        "rounds": len(measured), "rounds_with_changes": len(working),
        "windows": len({r["window"] for r in measured}),
        "apply_round_median_s": round(statistics.median(costs), 3) if costs else None,
        "between_rounds_median_s": round(statistics.median(spacing), 3) if spacing else None,
        "rows_per_round_median": statistics.median([r["rows"] for r in working]) if working else None,
        "pull_median_s": round(statistics.median(pull_seconds), 3) if pull_seconds else None,
        "pulls_staged": len(pull_seconds),
        "window_boundary_gaps_s": [round(g, 1) for g in gaps],
        "round_cost_drift_last_fifth_over_first": round(statistics.median(costs[-fifth:]) /
                                                         statistics.median(costs[:fifth]), 2) if len(costs) >= 2 else None,
        # where a round's time goes (the job's phases, per round), first fifth of the rounds against the last
        "round_phases_median_s_first_fifth": phase_medians(working[:fifth]),
        "round_phases_median_s_last_fifth": phase_medians(working[-fifth:]),
        "rounds_that_compacted": sum(1 for r in working if r.get("compactions")),
    }


def phase_medians(rounds: list[dict]) -> dict[str, float]:
    """Median seconds of each phase of the job over ``rounds`` (0 where a round had none)."""
    names = sorted({name for r in rounds for name in (r.get("phases") or {})})
    return {name: round(statistics.median((r.get("phases") or {}).get(name, 0.0) for r in rounds), 3)
            for name in names}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dag", choices=("stream", "sync"), default="stream")
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--every", type=float, default=0.1, help="seconds between the writer's commits")
    parser.add_argument("--window-minutes", type=float, default=10.0, help="the stream DAG's windows")
    parser.add_argument("--poll", type=float, default=0.5, help="the stream DAG's apply poll interval (seconds)")
    parser.add_argument("--pull-every", type=float, default=1.0, help="the stream DAG's pull interval (seconds)")
    parser.add_argument("--housekeeping-minutes", type=float, default=None,
                        help="run the stream DAG's housekeeping this often (default: its hour)")
    parser.add_argument("--lead-seconds", type=float, default=None, help="the stream DAG's overlap of two runs")
    parser.add_argument("--stream-dag", type=Path, default=None,
                        help="another version of the stream DAG's file (the one before issue 51: git show "
                             "58b1f38:dags/pglogical_lakehouse_stream.py)")
    parser.add_argument("--verify-every", type=float, default=300.0,
                        help="seconds between the judge's time-travel checks of its reconstruction")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--tiny", action="store_true", help="write for 5 seconds (CI)")
    args = parser.parse_args(argv)
    seconds = 5.0 if args.tiny else args.minutes * 60
    # tiny: windows long enough that the writer's few seconds fall inside the first one (the bench
    # stops the services once its last commit is applied, mid-window)
    window_minutes = 3.0 if args.tiny else args.window_minutes
    stream = args.dag == "stream"
    home = Path(args.workdir or tempfile.mkdtemp(prefix="pglogical-freshness-"))
    home.mkdir(parents=True, exist_ok=True)
    pg = LocalPostgres(name="freshness").start()
    services = None
    loads = []
    try:
        pg.create_database("shop")
        demo.load(pg, "shop", random.Random(3))
        conn = pg.connect("shop")
        create_markers(conn)
        conn.close()
        continuous_dags(home / "dags", args.dag, args.stream_dag)
        port = free_port()
        env = demo.airflow_env(home, pg, "shop")
        env.update({"AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"), "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
                    "PYTHONPATH": os.pathsep.join([str(home / "dags"), str(REPO)]),
                    "PGLOGICAL_STREAM_WINDOW_MINUTES": f"{window_minutes:g}",
                    "PGLOGICAL_STREAM_POLL_SECONDS": f"{args.poll:g}",
                    "PGLOGICAL_STREAM_PULL_SECONDS": f"{args.pull_every:g}"})
        if args.housekeeping_minutes:
            env["PGLOGICAL_STREAM_MAINTENANCE_EVERY_HOURS"] = f"{args.housekeeping_minutes / 60:g}"
        if args.lead_seconds is not None:
            env["PGLOGICAL_STREAM_LEAD_SECONDS"] = f"{args.lead_seconds:g}"
        airflow(env, "db", "migrate")  # the dag-processor finds the DAG, created unpaused
        metadata = Metadata(home / "airflow.db")
        history = Rounds(home / "staging" / "shop")
        services = Services(env, home)
        started = time.monotonic()
        services.start(port)
        first = history.snapshot_applied if stream else lambda: any(r["state"] == "success" for r in metadata.runs())
        wait_until(first, timeout=900, interval=1, message="the initial sync and its first apply")
        print(f"initial snapshot applied {time.monotonic() - started:.0f} s after the services started; writing "
              f"for {seconds:.0f} s, one UPDATE every {args.every} s", flush=True)
        since = time.time()
        judge = SnapshotJudge(events_table(home / "warehouse"), verify_every=0.0 if args.tiny else args.verify_every)
        judge.poll()
        writer = Writer(pg, "shop", args.every)
        writer.start()
        until = time.monotonic() + seconds
        progress_at = time.monotonic() + 60
        while not writer.done.wait(max(0.0, min(5.0, until - time.monotonic()))):  # the history keeps 500 entries
            history.collect()
            judge.poll()
            loads.append(os.getloadavg())
            if time.monotonic() >= progress_at:
                progress_at += 60
                write_progress(home / "progress.json", judge, list(writer.marks), loads, since)
            if time.monotonic() >= until:
                writer.done.set()
        writer.join()
        # one more, unmeasured commit: a commit's LSN here is the WAL position after it, which other
        # records (a checkpoint's, a running transaction list) can push past the commit's end, so
        # only a later commit's batch is sure to cover the last measured one
        writer.marker()
        last = writer.commits[-1][1]
        done = (lambda: history.applied_past(last)) if stream else (lambda: metadata.finished_past(last))
        wait_until(done, timeout=900, interval=1, message="an apply that covers the writer's last commit")
        last_seq = writer.marks[-1][1]
        wait_until(lambda: judge.poll() or judge.held_at(last_seq) is not None, timeout=900, interval=2,
                   message="an Iceberg snapshot that holds the writer's last commit")
        judge.verify_every = 0.0
        judge.poll()  # and a last time-travel check
        history.collect()
        loads.append(os.getloadavg())
    finally:
        if services is not None:
            services.stop()
        pg.stop()
    load = [round(statistics.mean(x[i] for x in loads), 2) for i in range(3)] if loads else None
    judged = judged_figures(judge, writer.marks, loads)
    if stream:
        report_stream(writer.commits, history, since, load, window_minutes, metadata)
    else:
        values = freshness(writer.commits, metadata.coverage())
        breakdown = tick_breakdown(metadata, since)
        print(json.dumps({"commits": len(writer.commits), "history_measured": len(values), **breakdown,
                          "history_p50_s": round(percentile(values, 0.5), 2) if values else None,
                          "history_p95_s": round(percentile(values, 0.95), 2) if values else None}, indent=1))
    print(json.dumps(judged, indent=1))
    if judged["measured"] != len(writer.marks):
        raise SystemExit(f"{len(writer.marks) - judged['measured']} commit(s) never reached an Iceberg snapshot")
    print(f"freshness through the scheduler: p50 {judged['p50_s']:.1f} s, p95 {judged['p95_s']:.1f} s, "
          f"p99 {judged['p99_s']:.1f} s, max {judged['max_s']:.1f} s over {judged['measured']} commits, judged by "
          f"{judged['snapshots']} Iceberg snapshots ({judged['time_travel_checks']} time-travel checks; "
          f"{args.dag} DAG; load average 1/5/15 min {load})")
    return 0


def judged_figures(judge: SnapshotJudge, marks: list[tuple[float, int]], loads: list) -> dict:
    """The freshness of every commit by the first Iceberg snapshot that holds it."""
    values = [v for v in judge.freshness(marks) if v is not None]
    figures = {"commits": len(marks), "measured": len(values), "snapshots": len(judge.snapshots),
               "time_travel_checks": judge.verified, "judge_read_s": round(judge.read_seconds, 1),
               "load_average_1_5_15_mean": [round(statistics.mean(x[i] for x in loads), 2) for i in range(3)]
               if loads else None,
               "load_average_1min_max": round(max(x[0] for x in loads), 2) if loads else None}
    if values:
        figures.update({f"p{q}_s": round(percentile(values, q / 100), 2) for q in (50, 95, 99)})
        figures.update({"max_s": round(max(values), 2), "over_10_s": sum(v > 10 for v in values),
                        "over_30_s": sum(v > 30 for v in values)})
    return figures


def write_progress(path: Path, judge: SnapshotJudge, marks: list[tuple[float, int]], loads: list, since: float) -> None:
    """The figures so far (commits older than a minute), for a run read before it ends."""
    settled = [m for m in marks if m[0] < time.time() - 60]
    path.write_text(json.dumps({"minutes": round((time.time() - since) / 60, 1),
                                **judged_figures(judge, settled, loads)}, indent=1))


def report_stream(commits, history: Rounds, since: float, load, window_minutes: float, metadata: Metadata) -> int:
    rounds = history.rounds()
    measured = stream_freshness(commits, rounds)
    breakdown = stream_breakdown(rounds, history.pulls(), since)
    values = [value for value, _boundary in measured]
    boundary = [value for value, at_boundary in measured if at_boundary]
    steady = [value for value, at_boundary in measured if not at_boundary]
    tasks = tick_breakdown(metadata, since)
    print(json.dumps({"commits": len(commits), "measured": len(values), "window_minutes": window_minutes,
                      **breakdown, "commits_at_a_boundary": len(boundary),
                      "boundary_share": round(len(boundary) / len(values), 4) if values else None,
                      "steady_p50_s": round(percentile(steady, 0.5), 2) if steady else None,
                      "steady_p95_s": round(percentile(steady, 0.95), 2) if steady else None,
                      "boundary_p50_s": round(percentile(boundary, 0.5), 2) if boundary else None,
                      "boundary_max_s": round(max(boundary), 2) if boundary else None,
                      "dag_runs": tasks["ticks"], "task_median_s": tasks["task_median_s"],
                      "between_runs_median_s": tasks["between_runs_median_s"],
                      "housekeeping_runs_s": [(round(h["end"] - h["start"], 1), h["state"])
                                              for h in metadata.housekeeping() if h["end"] >= since],
                      "load_average_1_5_15_mean": load}, indent=1))
    if values:
        print(f"the apply history's view: p50 {percentile(values, 0.5):.1f} s, p95 {percentile(values, 0.95):.1f} s, "
              f"p99 {percentile(values, 0.99):.1f} s, max {max(values):.1f} s over {len(values)} commits and "
              f"{breakdown['rounds']} apply rounds (boundary gaps {breakdown['window_boundary_gaps_s']} s) in "
              f"{breakdown['windows']} window(s) (stream DAG)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
