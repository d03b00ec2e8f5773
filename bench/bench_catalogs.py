"""The REST catalog with S3FileIO against the local Hadoop catalog, in one run (issue 48).

    python bench/bench_catalogs.py [--tables 1,50] [--ticks 3] [--rounds 4] [--tiny]

Two pipelines over the same tables and changes (``bench_tick.py``'s tables: 1,000 rows each, 100
changes per table per tick): ``local`` (a Hadoop catalog and staging on the local disk, the
embedded default) and ``rest`` (the demo's ``--lakehouse rest``: Iceberg's REST catalog fixture on
loopback behind OAuth2 client credentials, the warehouse on moto's S3 server through S3FileIO,
staging on the same bucket through S3A). For each table count: an initial sync and a first apply
(not timed), then ``--ticks`` ticks, each a pull and the apply task (spark-submit included), the
two lakehouses interleaved (who goes first alternates by tick) so each meets the same machine
state. Then a **streaming round** on the 1-table pipelines, in two windows per lakehouse (local,
REST, REST, local, the rounds split between them): an apply window (``keep_running``) runs, and
each round is the 100 changes, a pull, and the window's round that applies them (its own time from
the apply history, and the time from the pull's end to the round's record). Prints the medians,
and each REST figure as a multiple of the local one (the issue's goal: at most 1.5x). For each REST
tick and round it also prints what the two loopback servers cost beside the product: their CPU
seconds (they share the machine's cores with Spark, where a real S3 and catalog would not) and the
requests they served, by kind (``embedded/request_logs.py``).

``--tiny`` (CI): one table, one tick, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.bench_tick import Pipeline, change_tables, create_tables, load  # noqa: E402  (prepares the environment)
from bench.common import cluster  # noqa: E402
from airflow_provider_pglogical.embedded.demo_lakehouse import DemoLakehouse, rest_lakehouse  # noqa: E402
from airflow_provider_pglogical.embedded.request_logs import RequestLog, counted, rest_route, s3_kind  # noqa: E402
from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator  # noqa: E402
from airflow_provider_pglogical.ui.history import read_history  # noqa: E402

LAKES = ("local", "rest")
#: seconds between two reads of the apply history while a round is awaited: each read is a HEAD and
#: a GET or more on the S3 server (not on local disk), whose CPU the REST round shares; every 0.05 s
#: they were 40% of the S3 server's requests in a run (2026-11-29)
HISTORY_POLL = 0.25


class LoopbackServers:
    """The REST lakehouse's S3 server and catalog: their CPU and the requests they served since :meth:`mark`."""

    def __init__(self, lake: DemoLakehouse) -> None:
        import psutil

        self.processes = {"s3": psutil.Process(lake.s3.process.pid), "rest": psutil.Process(lake.rest.process.pid)}
        self.logs = {"s3": RequestLog(lake.s3.log_path, fixture=False), "rest": RequestLog(lake.rest.log_path, fixture=True)}
        self.cpu: dict[str, float] = {}

    def _cpu(self, name: str) -> float:
        times = self.processes[name].cpu_times()
        return times.user + times.system

    def mark(self) -> None:
        for name, log in self.logs.items():
            log.mark()
            self.cpu[name] = self._cpu(name)

    def since_mark(self) -> dict:
        """CPU seconds and requests by kind of each server since :meth:`mark`."""
        return {name: (self._cpu(name) - self.cpu[name], counted(log.since_mark(), s3_kind if name == "s3" else rest_route))
                for name, log in self.logs.items()}


#: ``--counts FILE``: every REST tick's and round's full counts, one JSON line each
COUNTS: list[Path] = []


def keep_counts(what: str, report: dict) -> None:
    """Append ``report`` (:meth:`LoopbackServers.since_mark`) to the ``--counts`` file, if any."""
    if COUNTS:
        with open(COUNTS[0], "a") as out:
            out.write(json.dumps({"what": what, **{name: {"cpu": round(cpu, 3), "requests": dict(kinds)}
                                                    for name, (cpu, kinds) in report.items()}}) + "\n")


#: every REST tick's and round's report (:meth:`LoopbackServers.since_mark`), by what it was
REPORTS: dict[str, list[dict]] = {}


def server_medians(reports: list[dict]) -> str:
    """The servers' medians over ``reports``: CPU seconds and requests of each, for the summary."""
    return ", ".join(f"{name} CPU {statistics.median(r[name][0] for r in reports):.2f} s and "
                     f"{statistics.median(sum(r[name][1].values()) for r in reports):.0f} requests"
                     for name in ("s3", "rest"))


def served(report: dict, top: int = 0) -> str:
    """What :meth:`LoopbackServers.since_mark` found, for one line (``top``: also the most frequent kinds)."""
    parts = []
    for name, (cpu, kinds) in report.items():
        text = f"{name} CPU {cpu:.2f} s, {sum(kinds.values())} requests"
        if top:
            text += " (" + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(top)) + ")"
        parts.append(text)
    return "; ".join(parts)


def stream(pipeline: Pipeline, pg, db: str, names: list[str], rounds: int, tick: int,
           servers: LoopbackServers | None = None) -> list[tuple[float, float, dict]]:
    """An apply window on ``pipeline``, and ``rounds`` rounds of changes, pull, the window's round:
    (the round's own seconds, seconds from the pull's end to the round's record, the round's
    phases: where its time went) per round."""
    pipeline.pull()  # catch up with the changes the other lakehouse's rounds made (not timed)
    pipeline.apply()
    operator = IcebergApplyOperator(task_id="window", staging_root=pipeline.staging, pipeline="p",
                                    iceberg=pipeline.iceberg, keep_running=3600, poll_interval=0.2)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            operator.execute({})
        except BaseException as error:  # ended by on_kill below; anything earlier is reported
            failed.append(error)

    def wait_for_round(number: int) -> dict:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                pipeline.root.fs.invalidate_cache()  # s3fs would read the file it rewrote by its old ETag
                entries = [e for e in read_history(pipeline.root, "p", "apply") if e.get("round") == number
                           and e.get("at", "") >= begun]
            except OSError:  # the window rewrites the history file whole (gone, or changed mid-read): again
                entries = []
            if entries:
                return entries[-1]
            if failed:
                raise RuntimeError(f"the apply window ended early: {failed[0]!r}")
            time.sleep(HISTORY_POLL)
        raise TimeoutError(f"round {number} of the window was not recorded within 600 s")

    begun = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    thread = threading.Thread(target=run, name="apply-window", daemon=True)
    thread.start()
    results = []
    try:
        wait_for_round(1)  # the window's first round: what was pending at its start (nothing)
        for number in range(2, rounds + 2):
            change_tables(pg, db, names, tick + number)
            pipeline.pull()
            if servers is not None:  # the window's polls and this loop's history reads count too (staging)
                servers.mark()
            pulled = time.perf_counter()
            entry = wait_for_round(number)
            results.append((float(entry["seconds"]), time.perf_counter() - pulled, entry.get("phases") or {}))
            if servers is not None:
                report = servers.since_mark()
                keep_counts(f"round {number}", report)
                REPORTS.setdefault("streaming round", []).append(report)
                print(f"    round {number}: {served(report, top=12)}", flush=True)
    finally:
        operator.on_kill()  # the window's spark-submit; its lease expires with it (nothing follows)
        thread.join(timeout=120)
    return results


def phased(phases: dict) -> str:
    """A round's phases (``apply_changes``' ``Phases``), largest first."""
    return ", ".join(f"{key} {value:.2f}" for key, value in sorted(phases.items(), key=lambda kv: -kv[1]))


def ratio(rest: float, local: float) -> str:
    return f"{rest / local:.2f}x local" if local else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="1,50")
    parser.add_argument("--ticks", type=int, default=3, help="0: no timed ticks, the streaming round alone")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="one table, one tick, one round (CI)")
    parser.add_argument("--counts", type=Path, help="write each REST tick's and round's request counts here (JSON lines)")
    parser.add_argument("--rest-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark property for the REST pipeline's jobs only (IcebergConfig.extra_conf), to try a setting")
    args = parser.parse_args(argv)
    COUNTS[:] = [args.counts] if args.counts else []
    if args.tiny:
        args.tables, args.ticks, args.rounds = "1", 1, 1
    with tempfile.TemporaryDirectory() as tmp, cluster("bench_catalogs") as pg:
        tmp_path = Path(tmp)
        lake = rest_lakehouse(tmp_path, log_requests=True)
        os.environ.update(lake.env)
        servers = LoopbackServers(lake)
        print(f"lakehouse rest: {lake.where}; load {load()}", flush=True)
        medians: dict[tuple[int, str], float] = {}
        streamed: dict[str, list[tuple[float, float, dict]]] = {}
        try:
            for count in [int(c) for c in args.tables.split(",")]:
                db = f"cat{count}"
                pg.create_database(db)
                names = create_tables(pg, db, count)
                pipelines = {name: Pipeline(pg, db, tmp_path, f"{db}_{name}", name, lake if name == "rest" else None)
                             for name in LAKES}
                pipelines["rest"].iceberg.extra_conf.update(item.split("=", 1) for item in args.rest_conf)
                for pipeline in pipelines.values():
                    pipeline.sync()
                    pipeline.apply()  # warms up, not timed
                walls: dict[str, list[float]] = {name: [] for name in LAKES}
                jobs: dict[str, list[float]] = {name: [] for name in LAKES}
                for tick in range(1, args.ticks + 1):
                    change_tables(pg, db, names, tick)
                    order = LAKES if tick % 2 else LAKES[::-1]  # alternate who goes first: load hits both alike
                    for name in order:
                        pipeline = pipelines[name]
                        pipeline.pull()
                        servers.mark()
                        wall, job = pipeline.apply()
                        walls[name].append(wall)
                        jobs[name].append(job)
                        report = servers.since_mark()
                        print(f"  {count} tables, tick {tick}, {name}: apply task {wall:.2f} s (in-job {job:.2f} s: "
                              f"{phased(pipeline.phases or {})}), load {load()}", flush=True)
                        if name == "rest":
                            keep_counts(f"{count} tables, tick {tick}", report)
                            REPORTS.setdefault(f"{count}-table tick", []).append(report)
                            print(f"    servers: {served(report, top=14)}", flush=True)
                for name in LAKES if args.ticks else ():  # --ticks 0: the streaming round alone
                    medians[count, name] = statistics.median(walls[name])
                if args.ticks:
                    print(f"{count:>3} tables x 100 changes: apply task median local {medians[count, 'local']:.2f} s, "
                          f"rest {medians[count, 'rest']:.2f} s ({ratio(medians[count, 'rest'], medians[count, 'local'])}); "
                          f"in-job local {statistics.median(jobs['local']):.2f} s, "
                          f"rest {statistics.median(jobs['rest']):.2f} s", flush=True)
                if count == 1 and args.rounds:
                    # two windows each, A B B A, the rounds split between them (one window each for one round)
                    halves = [args.rounds - args.rounds // 2, args.rounds // 2]
                    plan = [(name, halves[0]) for name in LAKES] + [(name, halves[1]) for name in LAKES[::-1]]
                    tick = args.ticks
                    for name, rounds in plan:
                        if not rounds:
                            continue
                        results = stream(pipelines[name], pg, db, names, rounds, tick,  # each round's changes are new
                                         servers if name == "rest" else None)
                        tick += rounds + 2
                        streamed.setdefault(name, []).extend(results)
                        print(f"  streaming rounds, {name}: " + ", ".join(
                            f"{own:.2f} s (pull to record {seen:.2f} s; {phased(phases)})" for own, seen, phases in results)
                            + f", load {load()}", flush=True)
        finally:
            lake.close(False)
            if args.counts:  # the servers' own logs beside the counts, for a closer look
                for name, log in servers.logs.items():
                    shutil.copyfile(log.path, args.counts.with_suffix(f".{name}.log"))
    if streamed:
        own = {name: statistics.median(o for o, _, _ in streamed[name]) for name in LAKES}
        seen = {name: statistics.median(s for _, s, _ in streamed[name]) for name in LAKES}
        print(f"streaming round (1 table x 100 changes): median local {own['local']:.2f} s, rest {own['rest']:.2f} s "
              f"({ratio(own['rest'], own['local'])}); pull to round recorded: local {seen['local']:.2f} s, "
              f"rest {seen['rest']:.2f} s ({ratio(seen['rest'], seen['local'])})")
        for name in LAKES:  # where a round's time goes: each phase's median over the rounds
            keys = {key for _, _, phases in streamed[name] for key in phases}
            print(f"  round phases, {name} (medians): " + phased(
                {key: statistics.median(p.get(key, 0.0) for _, _, p in streamed[name]) for key in keys}))
    for what, reports in REPORTS.items():  # what the loopback servers cost beside the product
        print(f"loopback servers per REST {what} (medians of {len(reports)}): {server_medians(reports)}")
    print("rest catalog with S3FileIO / local Hadoop catalog: " + ", ".join(
        f"{count}-table tick {ratio(medians[count, 'rest'], medians[count, 'local'])}"
        for count in sorted({c for c, _ in medians})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
