"""An initial load and a backfill into an apply window that is already running (issue 37).

    .venv/bin/python bench/bench_warm_load.py --rows 3000000 --repeat 3 [--cds /tmp/driver.jsa]

The streaming DAG's shape: its apply window starts beside the setup tasks, so by the time the
initial sync has exported its snapshot the driver is up (session, catalog, lease), and a backfill
run while the pipeline streams is applied by the window that is running anyway. What is left of
the load is the copy and one round of the window. Measured here, from the call that exports the
snapshot (``run_initial_sync`` / ``run_backfill``) to the end of the window's round that applied
it: the target table's commit (a reader sees the rows from then on, and the snapshot's summary
names the batch, the table's position) and the round's end (its apply-history entry, written
after the state table's commit), against raw ``COPY … TO STDOUT`` of the same table in the same run:

- **initial load into a waiting window**: the apply job spark-submitted with ``--keep-running
  --until-loaded`` (``IcebergApplyOperator(until_loaded=True)``), the snapshot started once its
  first (empty) round is recorded and it has warmed up (``--at-first-round``: at once); also the
  job's exit;
- **backfill into a running window**: the table re-snapshotted by ``run_backfill`` while a window
  (``--keep-running``) of the loaded pipeline polls;
- **backfill, then an apply**: the sync DAG's shape (``PgBackfillOperator >> IcebergApplyOperator``),
  the backfill then a fresh spark-submit of the apply, both timed (the gap between two Airflow
  tasks left out).

Each round's ``rows`` must equal the table's, or the run fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from psycopg2 import sql

from common import cluster, psql, report, timed
from bench_snapshot import C1_ONLY, TABLE

from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.capture.backfill import run_backfill  # noqa: E402
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB  # noqa: E402
from airflow_provider_pglogical.staging.contract import history_name  # noqa: E402
from tests.support.processes import kill_tree  # noqa: E402
from tests.support.spark_jobs import apply_args, run_job, submit_command, subprocess_env  # noqa: E402

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    parser.add_argument("--cds", default=None, metavar="ARCHIVE",
                        help="the driver at C1 only with this class-data-sharing archive (docs/operators.md, "
                             "'Tuning the driver JVM'; written by the first window when it does not exist)")
    parser.add_argument("--at-first-round", action="store_true",
                        help="start each snapshot as soon as the window's first round is recorded, not once it "
                             "has warmed up (the warm-up then shares the cores with the copy)")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.repeat = 2000, 1
    java_options = f"{C1_ONLY} -XX:SharedArchiveFile={args.cds}" if args.cds else ""
    with cluster("benchwarm") as pg:
        pg.execute(sql.SQL(TABLE).format(rows=sql.Literal(args.rows)))
        pg.execute("VACUUM ANALYZE bench")
        pg.execute("CREATE PUBLICATION pub FOR TABLE bench")
        hook = PgLogicalHook(postgres_conn_id="benchwarm")
        raw, _ = timed(lambda: psql(pg, "COPY bench TO STDOUT"), args.repeat)
        base = Path(tempfile.mkdtemp(prefix="bench-warm-"))
        window = Window(base, java_options, args.cds, args.at_first_round)
        loads, backfills, afters = [], [], []
        slots = []
        try:
            if args.cds and not Path(args.cds).exists():  # an untimed load whose window writes the archive
                slots.append(f"bench_{uuid.uuid4().hex[:8]}")
                window.initial_load(hook, "training", slots[-1], args.rows)
            for run in range(args.repeat):  # each initial load into a pipeline of its own
                slots.append(f"bench_{uuid.uuid4().hex[:8]}")
                loads.append(window.initial_load(hook, f"load{run}", slots[-1], args.rows))
                print("initial load:", json.dumps(loads[-1]), flush=True)
            loaded = f"load{args.repeat - 1}"
            job = window.start(loaded, until_loaded=False)
            try:
                for _ in range(args.repeat):
                    backfills.append(window.into_running(job, loaded, lambda: run_backfill(
                        hook, tables=["public.bench"], publications=["pub"], root=window.root,
                        pipeline=loaded, parallelism=1, report=lambda m: None), args.rows))
                    print("backfill into the window:", json.dumps(backfills[-1]), flush=True)
            finally:
                kill_tree(job)
                job.wait()
            for _ in range(args.repeat):
                afters.append(window.backfill_then_apply(hook, loaded))
                print("backfill, then an apply:", json.dumps(afters[-1]), flush=True)
        finally:
            for slot in slots:
                hook.drop_slot(slot)
            shutil.rmtree(base, ignore_errors=True)

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(run[key] for run in runs)

    rows = [("raw COPY TO STDOUT (psql > /dev/null), the baseline", raw, "1.00x raw")]
    for label, runs in (("initial load into a waiting window", loads), ("backfill into a running window", backfills)):
        seconds = median(runs, "queryable")
        rows.append((f"{label}: exported snapshot -> queryable", seconds,
                     f"{raw / seconds:.2f}x raw  {args.rows / seconds:,.0f} rows/s  snapshot committed at "
                     f"{median(runs, 'committed'):.2f} s; the round {median(runs, 'round'):.2f} s "
                     f"({json.dumps(runs[len(runs) // 2]['phases'])})"))
        seconds = median(runs, "recorded")
        rows.append((f"{label}: to the round's end (state table committed, history written)", seconds,
                     f"{raw / seconds:.2f}x raw"))
    rows.append(("initial load into a waiting window: to the job's exit", median(loads, "exited"),
                 f"{raw / median(loads, 'exited'):.2f}x raw"))
    seconds = median(afters, "queryable")
    rows.append(("backfill, then an apply (spark-submit after it): exported snapshot -> queryable", seconds,
                 f"{raw / seconds:.2f}x raw  backfill {median(afters, 'committed'):.2f} s + apply's spark-submit "
                 f"{median(afters, 'apply'):.2f} s"))
    started = "at the window's first round" if args.at_first_round else "once the window warmed up"
    print(f"rows: {args.rows:,}; medians of {args.repeat} runs; driver JVM options: {java_options or 'defaults'}; "
          f"snapshots started {started}; a round's phases are the middle run's")
    report(rows)


class Window:
    """Apply jobs of pipelines staged under one root, into one warehouse."""

    def __init__(self, base: Path, java_options: str, archive: str | None, at_first_round: bool) -> None:
        self.base, self.java_options, self.archive, self.at_first_round = base, java_options, archive, at_first_round
        self.log = base / "no-window.log"  # the output of the window started last (start())
        self.root = ObjectStoragePath((base / "staging").as_uri())

    def command(self, pipeline: str, extra: dict, java_options: str | None = None) -> list[str]:
        options = self.java_options if java_options is None else java_options
        return submit_command(APPLY_JOB, apply_args(str(self.root), pipeline, namespace=pipeline, retention_hours=None,
                                                    **extra),
                              IcebergConfig(warehouse=(self.base / "warehouse").as_uri()), driver_memory="2g",
                              conf={"spark.driver.extraJavaOptions": options})

    def start(self, pipeline: str, until_loaded: bool):
        """spark-submit a window of ``pipeline``; return once its first round is recorded and, unless
        ``--at-first-round``, once it has warmed up (spark/jobs/warm_up.py): a window that is up and
        waiting, as the streaming DAG's is by the time its sync task has started."""
        extra = {"keep_running": 3600, "poll_interval": 0.2, "until_loaded": until_loaded}
        options = self.java_options
        if self.archive and not Path(self.archive).exists():  # this first window writes the archive at its exit
            options = options.replace("SharedArchiveFile=", "ArchiveClassesAtExit=")
        before = len(self.history(pipeline))
        self.log = self.base / f"{pipeline}-{uuid.uuid4().hex[:6]}.log"
        with open(self.log, "w") as out:
            job = subprocess.Popen(self.command(pipeline, extra, options), stdout=out, stderr=subprocess.STDOUT,
                                   env=subprocess_env(), start_new_session=True)
        self.wait_for(job, pipeline, lambda entries: len(entries) > before)
        if not self.at_first_round:
            self.wait_for(job, pipeline, lambda entries: "the driver up for" in self.log.read_text())
        return job

    def history(self, pipeline: str) -> list[dict]:
        path = Path(self.base / "staging" / pipeline / history_name("apply"))
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_for(self, job, pipeline: str, done, timeout: float = 900) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not done(entries := self.history(pipeline)):
            if job.poll() is not None:
                raise RuntimeError(f"the apply window ended early:\n{self.log.read_text()[-5000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no such round of {pipeline} within {timeout} s")
            time.sleep(0.02)
        return entries

    def initial_load(self, hook: PgLogicalHook, pipeline: str, slot: str, rows: int) -> dict:
        job = self.start(pipeline, until_loaded=True)
        try:
            started = time.time()
            result = self.into_running(job, pipeline, lambda: run_initial_sync(
                hook, slot=slot, publications=["pub"], root=self.root, pipeline=pipeline, parallelism=1,
                report=lambda m: None), rows)
            job.wait(timeout=900)
            result["exited"] = round(time.time() - started, 2)
            if job.returncode != 0:
                raise RuntimeError(f"the initial load's apply failed:\n{self.log.read_text()[-5000:]}")
        finally:
            kill_tree(job)
        return result

    def into_running(self, job, pipeline: str, snapshot, rows: int) -> dict:
        """Run ``snapshot`` while ``job``'s window polls; seconds to its commit and to the round's end."""
        before = len(self.history(pipeline))
        started = time.time()
        snapshot()
        committed = time.time() - started
        entries = self.wait_for(job, pipeline, lambda entries: any(e["steps"] for e in entries[before:]))
        entry = next(e for e in entries[before:] if e["steps"])
        if entry["rows"] != rows:
            raise AssertionError(f"the round applied {entry['rows']} rows, the table holds {rows}: {entry}")
        ended = dt.datetime.fromisoformat(entry["at"]).timestamp()
        return {"committed": round(committed, 2), "queryable": round(self.table_commit(pipeline) - started, 2),
                "recorded": round(ended - started, 2), "round": entry["seconds"], "phases": entry["phases"]}

    def table_commit(self, pipeline: str) -> float:
        """When the target's current snapshot was committed (its ``timestamp-ms``): from then on a
        reader sees the rows, with the batch they came from in the snapshot's summary (the
        table's applied position, in the same commit)."""
        metadata = self.base / "warehouse" / pipeline / "public__bench" / "metadata"
        version = (metadata / "version-hint.text").read_text().strip()
        table = json.loads((metadata / f"v{version}.metadata.json").read_text())
        current = next(s for s in table["snapshots"] if s["snapshot-id"] == table["current-snapshot-id"])
        return current["timestamp-ms"] / 1000

    def backfill_then_apply(self, hook: PgLogicalHook, pipeline: str) -> dict:
        started = time.time()
        run_backfill(hook, tables=["public.bench"], publications=["pub"], root=self.root, pipeline=pipeline,
                     parallelism=1, report=lambda m: None)
        committed = time.time() - started
        code, output = run_job(self.command(pipeline, {}))
        if code != 0:
            raise RuntimeError(f"the apply failed:\n{output[-5000:]}")
        ended = time.time() - started
        return {"committed": round(committed, 2), "apply": round(ended - committed, 2),
                "queryable": round(self.table_commit(pipeline) - started, 2), "exited": round(ended, 2)}


if __name__ == "__main__":
    sys.exit(main())
