"""Soak benchmark (issue 16): many ticks of a steady workload, in compressed time, and what grows.

    python bench/bench_soak.py [--ticks 1000] [--tables 20] [--tables-per-tick 1] [--changes-per-tick 100] \
        [--out soak.json]

A PostgreSQL 15 cluster of its own holds ``--tables`` tables: keyed ones (two with an 8 kB value
stored out of line that the changes leave unchanged, so pgoutput sends it as unchanged TOAST;
some tables get key changes) and one keyless table with REPLICA IDENTITY FULL and repeated rows.
After the real initial sync (``run_initial_sync``) and its apply, each tick:

1. the workload commits one transaction per table it touches (updates, key changes, inserts,
   deletes; as many inserts as deletes, so the tables keep their size). A tick touches
   ``--tables-per-tick`` tables, a window rotating over all of them: on 2 shared cores a warm
   step costs 1-3 s per table, so one table per tick (each table changes every 20 ticks) is what
   lets 1,000 ticks fit in about an hour; more tables per tick cost more per tick, not more ticks;
2. a real pull (``run_pull``);
3. the real apply, IN-PROCESS: ``apply_changes.run`` in one long-lived SparkSession configured as
   the job configures its own (Iceberg Hadoop catalog ``lake``, UTC, case-sensitive, FAIR,
   ``tune_session``). It is the code the spark-submit job runs, without a JVM start per tick,
   which is what lets 1,000 ticks fit in about an hour. Staging retention runs inside it.

Time is compressed: ticks run back to back, so a tick stands for the example DAG's 10 minutes.
Retention and housekeeping are scaled to match:

- staging retention (wall clock: it reads the manifests' modification times) keeps about
  ``--retention-ticks`` ticks: ``retention_hours`` = that many times the median cycle time so far;
- Iceberg housekeeping (``maintenance.run``: compaction, delete-file rewrite, manifest rewrite,
  snapshot expiry) runs every ``--maintenance-every`` ticks (36 = every 6 hours on a 10-minute
  schedule), expiring snapshots older than ``--expire-ticks`` ticks, keeping ``--retain-last``.
  Orphan-file removal is off: its cut-off cannot go under 24 hours of wall clock (a younger file
  may belong to a write in flight), so in compressed time it would list every file and remove
  none. Old ``*.metadata.json`` versions go at commit instead (the tables' delete-after-commit).

At tick 10, every 100 ticks and at the last tick it measures: the median tick (pull + apply) of
the block, staging bytes and files, Iceberg data and delete files (the tables' ``files``
metadata tables, live files only) and the files on disk under the tables' ``data/``, metadata
bytes and files (the tables' ``metadata/`` directories), the slot's lag and retained WAL. It
prints a table, writes everything as JSON to ``--out`` at each report (a run cut short still
leaves its figures), and at the end compares every lakehouse table with its source table as row
multisets, failing loudly on any difference. The 1-minute load average is recorded with every
figure: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import cluster  # noqa: E402  (prepares the environment: PATH, SPARK_LOCAL_IP)
from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402
from airflow_provider_pglogical.capture.pull import run_pull  # noqa: E402
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.spark.jobs import apply_changes, maintenance  # noqa: E402
from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping  # noqa: E402
from airflow_provider_pglogical.staging.contract import default_target_name  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402

PIPELINE, SLOT, PUBLICATION, NAMESPACE, DATABASE = "soak", "soak_slot", "soak_pub", "soak", "soak"
#: a fresh 8 kB value (256 md5 digests): with STORAGE EXTERNAL it is stored out of line, uncompressed
BIG_VALUE = "(SELECT string_agg(md5(random()::text || s::text), '') FROM generate_series(1, 256) s)"


@dataclass(frozen=True)
class SourceTable:
    """One source table and what the workload does to it."""

    name: str
    big: bool = False          # has ``doc``, an out-of-line value the updates leave unchanged
    key_changes: bool = False  # some updates change the primary key
    keyless: bool = False      # no key, REPLICA IDENTITY FULL, rows repeat

    @property
    def columns(self) -> list[str]:
        if self.keyless:
            return ["a", "b", "c"]
        return ["id", "qty", "note"] + (["doc"] if self.big else [])

    @property
    def target(self) -> str:
        return default_target_name(f"public.{self.name}")


def plan_tables(count: int) -> list[SourceTable]:
    """``count`` tables: t00 and t01 big (t00 with key changes too), every fourth one with key
    changes, the last one keyless. Fixed, so every run meets the same mix."""
    tables = []
    for i in range(count):
        name = f"t{i:02d}"
        if i == count - 1 and count > 2:
            tables.append(SourceTable(name, keyless=True))
        else:
            tables.append(SourceTable(name, big=i < 2, key_changes=i % 4 == 0))
    return tables


def create_source(pg, tables: list[SourceTable], rows: int) -> None:
    """Create, fill and publish the tables (ids from a sequence, so inserts and key changes never collide)."""
    statements = [f"CREATE SEQUENCE soak_ids START {rows + 1}"]
    for table in tables:
        if table.keyless:
            statements += [
                f"CREATE TABLE {table.name} (a int, b text, c int)",
                f"ALTER TABLE {table.name} REPLICA IDENTITY FULL",
                # about three copies of each row value: the multiset paths run
                f"INSERT INTO {table.name} SELECT g % {max(1, rows // 3)}, 'k' || (g % {max(1, rows // 3)}), 0 "
                f"FROM generate_series(1, {rows}) g",
            ]
            continue
        doc = ", doc text" if table.big else ""
        statements.append(f"CREATE TABLE {table.name} (id bigint PRIMARY KEY, qty int, note text{doc})")
        if table.big:
            statements.append(f"ALTER TABLE {table.name} ALTER COLUMN doc SET STORAGE EXTERNAL")
        value = f", {BIG_VALUE.replace('s::text', 's::text || g::text')}" if table.big else ""
        statements.append(f"INSERT INTO {table.name} SELECT g, g % 97, 'n' || g{value} FROM generate_series(1, {rows}) g")
    statements.append(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(t.name for t in tables)}")
    pg.execute("; ".join(statements), dbname=DATABASE)


def keyed_changes(table: SourceTable, n: int, tick: int) -> list[str]:
    """About ``n`` changes to a keyed table: 50% updates (10 of them key changes where the table
    has them), 25% inserts and 25% deletes, so its size stays put. The big value is never set by
    an update: pgoutput sends it as unchanged TOAST."""
    inserts = deletes = max(1, n // 4)
    updates = max(1, n - inserts - deletes)
    moves = updates // 5 if table.key_changes else 0
    name, pick = table.name, f"SELECT id FROM {table.name} ORDER BY random() LIMIT"
    doc = f", {BIG_VALUE.replace('s::text', 's::text || g::text')}" if table.big else ""
    statements = [
        f"UPDATE {name} SET qty = qty + 1, note = 'tick {tick}' WHERE id IN ({pick} {updates - moves})",
        f"INSERT INTO {name} SELECT nextval('soak_ids'), g, 'new {tick}'{doc} FROM generate_series(1, {inserts}) g",
        f"DELETE FROM {name} WHERE id IN ({pick} {deletes})",
    ]
    if moves:
        statements.insert(1, f"UPDATE {name} SET id = nextval('soak_ids') WHERE id IN ({pick} {moves})")
    return statements


def keyless_changes(table: SourceTable, n: int, tick: int) -> list[str]:
    """About ``n`` changes to the keyless table: copies of existing rows and new rows inserted,
    random rows (one copy each) updated and deleted."""
    inserts = deletes = max(1, n // 4)
    updates = max(1, n - inserts - deletes)
    name, pick = table.name, f"SELECT ctid FROM {table.name} ORDER BY random() LIMIT"
    return [
        f"UPDATE {name} SET c = c + 1 WHERE ctid IN ({pick} {updates})",
        f"INSERT INTO {name} SELECT a, b, c FROM {name} ORDER BY random() LIMIT {inserts // 2}",
        f"INSERT INTO {name} SELECT {tick} * 1000 + g, 'new {tick}', 0 FROM generate_series(1, {inserts - inserts // 2}) g",
        f"DELETE FROM {name} WHERE ctid IN ({pick} {deletes})",
    ]


def touched(tables: list[SourceTable], per_tick: int, tick: int) -> list[SourceTable]:
    """The tables a tick changes: a window that rotates over all of them, so each table (the big,
    key-changing and keyless ones included) changes every ``len(tables) / per_tick`` ticks."""
    per_tick = max(1, min(per_tick, len(tables)))
    first = (tick - 1) * per_tick
    return [tables[(first + i) % len(tables)] for i in range(per_tick)]


def run_workload(conn, tables: list[SourceTable], changes: int, tick: int, rng: random.Random) -> int:
    """Commit one transaction per table, in a shuffled order; returns the changes asked for."""
    per_table = max(4, changes // len(tables))
    order = list(tables)
    rng.shuffle(order)
    with conn.cursor() as cursor:
        for table in order:
            statements = (keyless_changes if table.keyless else keyed_changes)(table, per_table, tick)
            cursor.execute("; ".join(statements))  # autocommit: one string, one transaction
    return per_table * len(tables)


def spark_session(warehouse: Path, driver_memory: str, extra: dict[str, str] | None = None,
                  app_name: str = "pglogical-soak"):
    """The long-lived session, configured as ``apply_changes.main`` configures the job's (``extra``
    on top)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    conf = {**IcebergConfig(warehouse=warehouse.as_uri(), namespace=NAMESPACE).spark_conf(),
            "spark.driver.memory": driver_memory, "spark.sql.session.timeZone": "UTC",
            "spark.sql.caseSensitive": "true", "spark.scheduler.mode": "FAIR", "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false", **(extra or {})}
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    apply_changes.tune_session(spark)
    return spark


def quiet_logs() -> None:
    """Keep the per-step and per-pull INFO lines out of a 1,000-tick log (warnings still show)."""
    import logging

    for name in ("py4j", "pglogical", "airflow_provider_pglogical"):
        logging.getLogger(name).setLevel(logging.WARNING)


# -- measurements ------------------------------------------------------------------------------
def directory_usage(paths) -> tuple[int, int]:
    """Bytes and number of files under the given directories (Hadoop's ``.crc`` files included:
    they are on disk too)."""
    size = count = 0
    for path in paths:
        for parent, _dirs, files in os.walk(path):
            for name in files:
                try:
                    size += os.path.getsize(os.path.join(parent, name))
                except FileNotFoundError:
                    continue
                count += 1
    return size, count


def iceberg_files(spark, tables: list[SourceTable]) -> dict[str, int]:
    """Live data and delete files of the lakehouse tables (their ``files`` metadata tables: content
    0 is data, 1 position deletes, 2 equality deletes), summed."""
    totals = Counter()
    for table in tables:
        rows = spark.sql(f"SELECT content, count(*) AS n, coalesce(sum(file_size_in_bytes), 0) AS bytes "
                         f"FROM lake.{NAMESPACE}.{table.target}.files GROUP BY content").collect()
        for row in rows:
            kind = "data" if row.content == 0 else "delete"
            totals[f"{kind}_files"] += row.n
            totals[f"{kind}_bytes"] += row.bytes
    return {key: totals.get(key, 0) for key in ("data_files", "data_bytes", "delete_files", "delete_bytes")}


def lakehouse_disk(warehouse: Path) -> dict[str, int]:
    """What the namespace holds on disk: every table's ``metadata/`` and ``data/`` directories (the
    state table included), and how many ``*.metadata.json`` versions there are."""
    tables = [p for p in (warehouse / NAMESPACE).iterdir() if p.is_dir()] if (warehouse / NAMESPACE).exists() else []
    meta_bytes, meta_files = directory_usage(p / "metadata" for p in tables)
    data_bytes, data_files = directory_usage(p / "data" for p in tables)
    versions = [v for p in tables for v in (p / "metadata").glob("*.metadata.json")]
    return {"metadata_bytes": meta_bytes, "metadata_files": meta_files, "metadata_json_files": len(versions),
            # what the kept versions weigh: each carries the table's metadata log (capped like them)
            "metadata_json_bytes": sum(v.stat().st_size for v in versions),
            "largest_metadata_json_bytes": max((v.stat().st_size for v in versions), default=0),
            "disk_data_bytes": data_bytes, "disk_data_files": data_files}


def slot_wal(pg) -> dict[str, int]:
    """The slot's lag (WAL not yet confirmed) and the WAL it retains (from its restart_lsn), in bytes."""
    lag, retained = pg.query(
        "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, (pg_current_wal_lsn() - restart_lsn)::bigint "
        "FROM pg_replication_slots WHERE slot_name = %s", dbname=DATABASE, params=(SLOT,))[0]
    return {"slot_lag_bytes": int(lag), "retained_wal_bytes": int(retained)}


def staged_batches(staging: Path) -> int:
    return sum(1 for p in (staging / PIPELINE).glob("*/_manifest.json"))


# -- the run -----------------------------------------------------------------------------------
class Soak:
    """The pipeline under test: source, staging, lakehouse, and the in-process apply."""

    def __init__(self, pg, tmp: Path, args: argparse.Namespace) -> None:
        os.environ["AIRFLOW_CONN_SOAK_SOURCE"] = pg.connection_uri(DATABASE)
        self.pg, self.args = pg, args
        self.hook = PgLogicalHook(postgres_conn_id="soak_source")
        self.staging, self.warehouse = tmp / "staging", tmp / "warehouse"
        self.root = ObjectStoragePath(self.staging.as_uri())
        self.tables = plan_tables(args.tables)
        self.spark = None
        self.cycles: list[float] = []  # wall time of whole ticks (workload to measurements): retention's clock

    def set_up(self) -> dict:
        self.pg.create_database(DATABASE)
        create_source(self.pg, self.tables, self.args.rows)
        started = time.perf_counter()
        synced = run_initial_sync(self.hook, slot=SLOT, publications=[PUBLICATION], root=self.root, pipeline=PIPELINE,
                                  report=lambda message: None)
        sync_seconds = time.perf_counter() - started
        self.spark = spark_session(self.warehouse, self.args.driver_memory)
        started = time.perf_counter()
        self.apply()
        return {"initial_sync_seconds": round(sync_seconds, 2), "first_apply_seconds": round(time.perf_counter() - started, 2),
                "snapshot_lsn": synced.get("lsn")}

    def tick_seconds(self) -> float:
        """Median whole-tick wall time of the last 20 ticks (5 s before the first)."""
        return statistics.median(self.cycles[-20:]) if self.cycles else 5.0

    def retention_hours(self) -> float:
        """Staging retention that keeps about ``--retention-ticks`` ticks at the current pace."""
        return self.args.retention_ticks * self.tick_seconds() / 3600

    def pull(self) -> dict:
        return run_pull(self.hook, slot=SLOT, publications=[PUBLICATION], root=self.root, pipeline=PIPELINE,
                        report=lambda message: None)

    def apply(self) -> dict:
        return apply_changes.run(self.spark, ApplyOptions(self.staging.as_uri(), PIPELINE, namespace=NAMESPACE,
                                 retention_hours=self.retention_hours()))

    def maintain(self) -> dict:
        """Iceberg housekeeping, with its snapshot cut-off in compressed time."""
        housekeeping = Housekeeping(min_input_files=self.args.min_input_files,
                                    older_than_hours=self.args.expire_ticks * self.tick_seconds() / 3600,
                                    retain_last=self.args.retain_last, remove_orphan_files=False)
        return maintenance.run(self.spark, "lake", NAMESPACE, None, housekeeping)

    def measure(self) -> dict:
        staging_bytes, staging_files = directory_usage([self.staging / PIPELINE])
        return {"staging_bytes": staging_bytes, "staging_files": staging_files,
                "staging_batches": staged_batches(self.staging), **iceberg_files(self.spark, self.tables),
                **lakehouse_disk(self.warehouse), **slot_wal(self.pg)}

    def verify(self) -> list[str]:
        """Every lakehouse table against its source table, as row multisets; the differences."""
        problems = []
        for table in self.tables:
            columns = table.columns
            lake = Counter(tuple(row) for row in
                           self.spark.table(f"lake.{NAMESPACE}.{table.target}").select(*columns).collect())
            source = Counter(self.pg.query(f"SELECT {', '.join(columns)} FROM {table.name}", dbname=DATABASE))
            if lake != source:
                missing, extra = source - lake, lake - source
                problems.append(f"{table.name}: {sum(source.values())} source rows, {sum(lake.values())} lakehouse rows; "
                                f"{sum(missing.values())} missing from the lakehouse, {sum(extra.values())} extra; "
                                f"e.g. missing {_sample(missing)}, extra {_sample(extra)}")
        return problems


def _sample(rows: Counter) -> list:
    return [tuple(str(v)[:40] for v in row) for row in list(rows)[:2]]


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def report_due(tick: int, last: int) -> bool:
    return tick == 10 or tick % 100 == 0 or tick == last


def block_row(ticks: list[dict], start: int, tick: int, figures: dict) -> dict:
    """One line of the per-100-tick table: the block's medians and the figures measured at its end."""
    block = [t for t in ticks if start < t["tick"] <= tick]
    return {"tick": tick, "block": f"{start + 1}-{tick}",
            "tick_median_s": round(statistics.median(t["tick_s"] for t in block), 3),
            "pull_median_s": round(statistics.median(t["pull_s"] for t in block), 3),
            "apply_median_s": round(statistics.median(t["apply_s"] for t in block), 3),
            "this_tick_s": round(ticks[-1]["tick_s"], 3),
            "load1_median": round(statistics.median(t["load1"] for t in block), 2), **figures}


HEADER = ("tick", "block median s", "pull s", "apply s", "this tick s", "load", "staging MB", "staging files",
          "batches", "data files", "delete files", "files on disk", "metadata MB", "metadata files", "metadata.json",
          "metadata.json MB", "largest metadata.json kB", "slot lag kB", "retained WAL MB")


def table_line(row: dict) -> tuple:
    return (row["tick"], f"{row['tick_median_s']:.2f}", f"{row['pull_median_s']:.2f}", f"{row['apply_median_s']:.2f}",
            f"{row['this_tick_s']:.2f}", f"{row['load1']:.2f}", f"{row['staging_bytes'] / 1e6:.1f}",
            row["staging_files"], row["staging_batches"], row["data_files"], row["delete_files"], row["disk_data_files"],
            f"{row['metadata_bytes'] / 1e6:.1f}", row["metadata_files"], row["metadata_json_files"],
            f"{row['metadata_json_bytes'] / 1e6:.1f}", f"{row['largest_metadata_json_bytes'] / 1e3:.0f}",
            f"{row['slot_lag_bytes'] / 1e3:.0f}", f"{row['retained_wal_bytes'] / 1e6:.1f}")


def print_table(rows: list[dict]) -> None:
    print("| " + " | ".join(HEADER) + " |")
    print("|" + " ---: |" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in table_line(row)) + " |")
    sys.stdout.flush()


def ratios(ticks: list[dict]) -> dict:
    """What the issue asks: the last block's median tick against ticks 6-15's."""
    early = [t["tick_s"] for t in ticks if 6 <= t["tick"] <= 15]
    last = ticks[-1]["tick"]
    late = [t["tick_s"] for t in ticks if t["tick"] > last - 100]
    if not early or not late:
        return {}
    return {"early_ticks": "6-15", "early_median_s": round(statistics.median(early), 3),
            "late_ticks": f"{max(1, last - 99)}-{last}", "late_median_s": round(statistics.median(late), 3),
            "late_over_early": round(statistics.median(late) / statistics.median(early), 3)}


def soak(args: argparse.Namespace) -> int:
    result: dict = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "load_at_start": os.getloadavg(), "tables": [asdict(t) for t in plan_tables(args.tables)],
                    "ticks": [], "reports": [], "maintenance": []}
    with tempfile.TemporaryDirectory(prefix="pglogical-soak-") as tmp, cluster("bench_soak") as pg:
        run = Soak(pg, Path(tmp), args)
        result["setup"] = run.set_up()
        print(f"set up: {result['setup']}; load {os.getloadavg()}", flush=True)
        conn = pg.connect(DATABASE)
        rng = random.Random(args.seed)
        start = 0
        try:
            for tick in range(1, args.ticks + 1):
                result["ticks"].append(one_tick(run, conn, rng, tick))
                if tick % args.maintenance_every == 0:
                    result["maintenance"].append(housekeeping(run, tick))
                if report_due(tick, args.ticks):
                    row = block_row(result["ticks"], start, tick, {**run.measure(), "load1": load1()})
                    result["reports"].append(row)
                    start = tick
                    print_table(result["reports"])
                    write_json(args.out, result)
                run.cycles.append(time.perf_counter() - result["ticks"][-1]["_started"])
                result["ticks"][-1].pop("_started")
        finally:
            conn.close()
            result["ratios"] = ratios(result["ticks"])
            result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            write_json(args.out, result)
        print(f"ratios: {result['ratios']}", flush=True)
        problems = run.verify()
        result["verification"] = {"tables": len(run.tables), "problems": problems}
        write_json(args.out, result)
        run.spark.stop()
    if problems:
        print("VERIFICATION FAILED: the lakehouse differs from the source:\n  " + "\n  ".join(problems), flush=True)
        return 1
    print(f"verification: all {args.tables} lakehouse tables equal their source tables (row multisets)", flush=True)
    return 0


def one_tick(run: Soak, conn, rng: random.Random, tick: int) -> dict:
    """Workload, pull, apply; their times (a tick's duration is the pull plus the apply)."""
    started = time.perf_counter()
    tables = touched(run.tables, run.args.tables_per_tick, tick)
    changes = run_workload(conn, tables, run.args.changes_per_tick, tick, rng)
    pull_started = time.perf_counter()
    pulled = run.pull()
    apply_started = time.perf_counter()
    applied = run.apply()
    ended = time.perf_counter()
    return {"tick": tick, "_started": started, "workload_s": round(pull_started - started, 3),
            "pull_s": round(apply_started - pull_started, 3), "apply_s": round(ended - apply_started, 3),
            "tick_s": round(ended - pull_started, 3), "changes": changes, "staged_rows": pulled.get("changes", 0),
            "steps": len(applied.get("steps", [])), "steps_s": [step["seconds"] for step in applied.get("steps", [])],
            "removed": (applied.get("retention") or {}).get("removed", 0),
            "retention_hours": round(run.retention_hours(), 5), "load1": load1()}


def housekeeping(run: Soak, tick: int) -> dict:
    started = time.perf_counter()
    summary = run.maintain()
    seconds = round(time.perf_counter() - started, 2)
    print(f"tick {tick}: housekeeping in {seconds:.1f} s (load {load1()})", flush=True)
    return {"tick": tick, "seconds": seconds, "tables": summary.get("tables", {})}


def write_json(path: str | None, result: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=1, default=str))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=1000)
    parser.add_argument("--tables", type=int, default=20)
    parser.add_argument("--rows", type=int, default=1000, help="rows per table at the start")
    parser.add_argument("--changes-per-tick", type=int, default=100,
                        help="spread evenly over the tables the tick touches")
    parser.add_argument("--tables-per-tick", type=int, default=1,
                        help="tables each tick changes (a window rotating over all of them)")
    parser.add_argument("--retention-ticks", type=float, default=75, help="staging retention, in ticks")
    parser.add_argument("--maintenance-every", type=int, default=36, help="ticks between housekeeping runs")
    parser.add_argument("--expire-ticks", type=float, default=6, help="expire snapshots older than this many ticks")
    parser.add_argument("--retain-last", type=int, default=3, help="snapshots every table keeps")
    parser.add_argument("--min-input-files", type=int, default=5, help="compaction's min-input-files")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args(argv)
    if args.tiny:  # a housekeeping run and a report included
        args.ticks, args.tables, args.rows, args.changes_per_tick, args.maintenance_every = 3, 2, 50, 20, 2
    return args


def main() -> int:
    # a TERM (kill <pid>) unwinds like Ctrl-C: the JSON is written, the cluster stopped and removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    quiet_logs()
    return soak(parse_args())


if __name__ == "__main__":
    sys.exit(main())
