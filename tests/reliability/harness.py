"""Randomized end-to-end consistency harness with a kill matrix, against PostgreSQL's own subscriber.

Short mode runs inside ``pytest tests/reliability``; the long mode is::

    python -m tests.reliability.harness --rounds 10 --changes 10000 --seed 7

It starts two throwaway PostgreSQL clusters (publisher, native subscriber), runs the seeded
workload of ``tests/reliability/workload.py``, and after every round pulls and applies everything
(with the round's kill points: a subprocess or the spark-submit process tree is SIGKILLed at the
dangerous point, then the task is retried as Airflow would) and compares the Iceberg tables with the
native subscriber (``verify_pipeline(..., source_conn_id=subscriber)``) and, for the row-filtered
table, with the publisher (docs/toast.md). Every failure names the seed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.environment import prepare

prepare()  # also when run as ``python -m``
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")
os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))

from tests.reliability.workload import (  # noqa: E402
    FILTERED_COLUMNS, FILTERED_KEY, FILTERED_PUBLICATION, FILTERED_TABLE, PUBLICATIONS, TOAST_COLUMNS, TYPE_OVERRIDES,
    Counts, Workload,
)
from tests.reliability.shapes import PUBLICATION as SHAPES_PUBLICATION, Shapes  # noqa: E402
from tests.reliability.publication_events import PUBLICATION as EVENTS_PUBLICATION, PublicationEvents  # noqa: E402
from tests.support.processes import kill_tree  # noqa: E402
from tests.support.spark_jobs import job_result, start_job, submit_command  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.lakehouse.lakehouse_access import private_properties  # noqa: E402
from airflow_provider_pglogical.lakehouse.staging_roots import spark_uri  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PIPELINE = "rel"
SLOT = "rel_slot"
SUBSCRIPTION = "rel_sub"
NAMESPACE = "rel"

#: every kill point of the matrix
KILL_POINTS = (
    "initial_sync_mid_copy",      # run_initial_sync SIGKILLed after its first Parquet part, before the manifest
    "chunked_load_mid_chunk",     # run_chunked_sync (set-up with snapshot_mode="chunked") SIGKILLed inside a
                                  # chunk's read, its Parquet written, while the workload writes; then resumed
    "pull_before_manifest",       # run_pull SIGKILLed after the staging files, before _manifest.json
    "pull_before_advance",        # run_pull SIGKILLed after the manifest, before pg_replication_slot_advance
    "apply_mid_merge",            # spark-submit's process tree SIGKILLed while the apply job is merging
    "apply_before_state",         # the apply job SIGKILLs itself between a data commit and its state commit
    "backfill_mid_copy",          # run_backfill SIGKILLed after its first Parquet part, before the manifest
    "schema_change",              # pull SIGKILLed right after a batch holding an ADD COLUMN is staged, then
                                  # the apply of that batch SIGKILLed between data and state commit
    "adopt_before_commit",        # the first apply SIGKILLs itself after copying a snapshot's files into the
                                  # table (adoption, issue 37), before the commit that adds them
    "adopt_after_commit",         # ... and right after that commit, before the state commit
)
#: kill points of the set-up (the initial sync and its first apply), not of a round
SETUP_KILL_POINTS = ("initial_sync_mid_copy", "chunked_load_mid_chunk", "adopt_before_commit", "adopt_after_commit")
#: the chunked set-up's kills: inside the load's n-th chunk read, then (resumed) inside the whole
#: copy of a keyless table; chunks of CHUNK_ROWS rows
CHUNKED_KILL_AT_READ, CHUNKED_KILL_TABLE, CHUNK_ROWS = 2, "public.bag", 60
#: the apply kill points where the job kills itself: the environment that arms it, and what it logs then
SELF_KILLS = {
    "apply_before_state": ({"PGLOGICAL_APPLY_CRASH_BEFORE_STATE": "1"}, "crash point reached after the data commit"),
    "adopt_before_commit": ({"PGLOGICAL_ADOPT_CRASH": "copied"}, "crash point reached: adoption copied"),
    "adopt_after_commit": ({"PGLOGICAL_ADOPT_CRASH": "committed"}, "crash point reached: adoption committed"),
}

#: the kill points whose outcome the server decides (the rest kill the apply, a Spark job)
SERVER_KILL_POINTS = ("initial_sync_mid_copy", "chunked_load_mid_chunk", "pull_before_manifest", "pull_before_advance",
                      "backfill_mid_copy")

KILL_SCRIPT = textwrap.dedent("""
    import json, os, sys
    from airflow.sdk import ObjectStoragePath
    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.capture import backfill
    from airflow_provider_pglogical.capture import initial_sync
    from airflow_provider_pglogical.capture import pull
    from airflow_provider_pglogical.staging import batches, layout
    from tests.support.processes import die_now

    point, root = os.environ["KILL_AT"], ObjectStoragePath(os.environ["ROOT"])
    overrides = json.loads(os.environ["OVERRIDES"])
    hook = PgLogicalHook(postgres_conn_id=os.environ["CONN"])
    publications = os.environ["PUBS"].split(",")

    def die(*_):
        sys.stdout.flush()
        die_now()

    if point in ("initial_sync_mid_copy", "backfill_mid_copy"):
        original = batches.BatchWriter._count
        def count(self, *args):  # a Parquet part is complete: the copy is under way
            original(self, *args)
            die()
        batches.BatchWriter._count = count
    if point == "pull_before_manifest":
        def commit(self):
            die()
        batches.BatchWriter.commit = commit

    def before_advance(path):
        if point == "pull_before_advance":
            die()
        if point == "schema_change":
            manifest = layout.read_manifest(root, os.environ["PIPELINE"], path.rstrip("/").rsplit("/", 1)[1])
            if manifest.schema_changes:
                die()

    if point == "chunked_load_mid_chunk":
        from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
        from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
        reads = []
        def read(event):  # inside the chunk's transaction (or a whole table's snapshot), no manifest yet
            reads.append(event.table)
            if len(reads) == int(os.environ.get("KILL_AT_READ", 0)) or event.table == os.environ.get("KILL_TABLE"):
                with open(os.environ["KILL_NOTE"], "w") as note:
                    json.dump({"table": event.table, "chunk": event.chunk, "rows": event.rows}, note)
                die()
        run_chunked_sync(hook, slot=os.environ["SLOT"], publications=publications, root=root,
                         pipeline=os.environ["PIPELINE"], chunk_rows=int(os.environ["CHUNK_ROWS"]),
                         type_overrides=overrides, hooks=ChunkHooks(read=read))
    elif point == "initial_sync_mid_copy":
        initial_sync.run_initial_sync(hook, slot=os.environ["SLOT"], publications=publications, root=root,
                                      pipeline=os.environ["PIPELINE"], type_overrides=overrides)
    elif point == "backfill_mid_copy":
        backfill.run_backfill(hook, tables=os.environ["TABLES"].split(","), publications=publications, root=root,
                              pipeline=os.environ["PIPELINE"], type_overrides=overrides)
    else:
        while True:
            result = pull.run_pull(hook, slot=os.environ["SLOT"], publications=publications, root=root,
                                   pipeline=os.environ["PIPELINE"], max_changes=int(os.environ["MAX_CHANGES"]),
                                   before_advance=before_advance, type_overrides=overrides)
            if result["batch"] is None:
                break
    print("NOT KILLED")
""")


class HarnessFailure(AssertionError):
    pass


@dataclass
class ObjectStoreLakehouse:
    """The production shape of the lakehouse for the harness: ``staging`` an object store root
    (``s3://<aws_conn_id>@<bucket>/<prefix>``) and ``iceberg`` a transactional catalog over a
    warehouse there (namespace :data:`NAMESPACE`), reached through Airflow connections."""

    staging: str
    iceberg: IcebergConfig


def spark_access(staging: str, iceberg: IcebergConfig):
    """What Spark needs to reach ``staging`` and the lakehouse, as the operators build it: the
    public properties (a job's ``--conf``) and the credentials (its private properties file)."""
    from airflow_provider_pglogical.lakehouse.lakehouse_access import job_access
    from airflow_provider_pglogical.lakehouse.staging_roots import staging_access

    return job_access(iceberg, staging_access(staging, iceberg, iceberg.spark_conf()))


@dataclass
class Figures:
    rounds: int = 0
    kills: dict = field(default_factory=dict)
    missed: dict = field(default_factory=dict)
    batches: int = 0
    spark_submits: int = 0
    #: applies and verify comparisons run in the harness's own Spark session (no JVM start)
    in_session: int = 0
    toast_cells: int = 0
    #: table comparisons made (lakehouse against the native subscriber or the publisher) and how
    #: many of them found the two sides different; any difference fails the round
    compared_tables: int = 0
    differing_tables: int = 0
    verified_rounds: int = 0
    #: (key, columns) cells hit by the known product bug (see docs/reliability.md)
    counts: Counts = field(default_factory=Counts)
    #: adopted files that the kill before the adoption's commit left in a local warehouse as hard
    #: links of staged files (the embedded default's adoption): orphans, never committed
    linked_orphans: int = 0
    #: the tables a chunked set-up loaded whole (keyless, or a key that cannot bound a range)
    whole_tables: list = field(default_factory=list)

    def killed(self, point: str) -> None:
        self.kills[point] = self.kills.get(point, 0) + 1


class Harness:
    def __init__(self, publisher, subscriber, workdir: Path, seed: int, *, report=None, spark=None,
                 lakehouse: "ObjectStoreLakehouse | None" = None, shapes: bool = True) -> None:
        """``spark``: an open session on :attr:`warehouse` (:meth:`session`) that runs the applies
        nobody kills and verify's comparisons in process; without it each is a spark-submit.
        ``lakehouse``: staging and the warehouse on an object store with a transactional catalog
        instead of the local disk with a Hadoop catalog. ``shapes``: also publish issue 33's table
        shapes and run their DDL in every round (a dozen more tables to create, replace and compare)."""
        self.publisher, self.subscriber = publisher, subscriber
        self.spark = spark
        self.workdir = Path(workdir)
        self.seed = seed
        self.rng = random.Random(seed * 7919 + 1)
        self.workload = Workload(publisher, subscriber, seed)
        self.lakehouse = lakehouse
        self.staging = lakehouse.staging if lakehouse else (self.workdir / "staging").as_uri()
        self.warehouse = lakehouse.iceberg.warehouse if lakehouse else (self.workdir / "warehouse").as_uri()
        self.figures = Figures()
        self.report = report or (lambda message: print(message, flush=True))
        self.shapes = Shapes(publisher, subscriber, random.Random(seed * 31 + 5), SUBSCRIPTION) if shapes else None
        # issue 47: changes to what the source publishes, judged against the publisher's projection
        self.events = PublicationEvents(publisher, random.Random(seed * 47 + 3))
        self.publications = [*PUBLICATIONS, *([SHAPES_PUBLICATION] if shapes else []), EVENTS_PUBLICATION]
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)

    @property
    def subscribed(self) -> list[str]:
        """The publications of the native subscriber: not issue 47's, which it cannot follow."""
        return [p for p in self.publications if p != EVENTS_PUBLICATION]

    # --- plumbing --------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        raise HarnessFailure(f"[seed {self.seed}] {message}\n  reproduce: {self.reproduce}")

    reproduce = "pytest tests/reliability -q (short mode)"

    def hook(self, db=None):
        from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook

        return PgLogicalHook(postgres_conn_id=(db or self.publisher).conn_id)

    @property
    def root(self):
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(self.staging)

    def iceberg(self):
        from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig

        if self.lakehouse is not None:
            return self.lakehouse.iceberg
        return IcebergConfig(warehouse=self.warehouse, namespace=NAMESPACE)

    def access(self):
        """What a spark-submitted job of the harness needs to reach staging and the lakehouse."""
        return spark_access(self.staging, self.iceberg())

    def wait_slot_idle(self) -> None:
        from airflow_provider_pglogical.embedded.postgres import wait_until

        def idle():
            slot = self.hook().get_slot(SLOT)
            return slot is None or not slot.active

        wait_until(idle, timeout=60, message=f"slot {SLOT} to be released by the killed task")

    def killed_subprocess(self, point: str, **env) -> bool:
        """Run a Python task in a subprocess that SIGKILLs itself at ``point``; True when it died there."""
        full = {**os.environ, "KILL_AT": point, "ROOT": self.staging, "CONN": self.publisher.conn_id,
                "PUBS": ",".join(self.publications), "SLOT": SLOT, "PIPELINE": PIPELINE,
                "OVERRIDES": json.dumps(TYPE_OVERRIDES),
                "PYTHONPATH": str(REPO), **{k: str(v) for k, v in env.items()}}
        proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT], env=full, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode == -signal.SIGKILL:
            self.figures.killed(point)
            self.wait_slot_idle()
            return True
        if proc.returncode == 0 and "NOT KILLED" in proc.stdout:
            self.figures.missed[point] = self.figures.missed.get(point, 0) + 1
            return False
        self.fail(f"task for kill point {point} failed instead of dying (exit {proc.returncode}):\n{proc.stdout[-5000:]}")
        return False

    @staticmethod
    def session(workdir: Path, lakehouse: "ObjectStoreLakehouse | None" = None):
        """A Spark session for ``Harness(spark=...)`` on the harness's warehouse under ``workdir``
        (or on ``lakehouse``, its credentials set in the session, not on a command line), its
        catalog uncached so it sees what the killed spark-submitted applies committed. Stop it."""
        from pyspark.sql import SparkSession

        from tests.support.spark_jobs import applying_session

        if SparkSession.getActiveSession() is not None:  # its catalog would be another warehouse's
            raise HarnessFailure("a Spark session is already open in this process: stop it first")
        access = spark_access(lakehouse.staging, lakehouse.iceberg) if lakehouse is not None else None
        spark = applying_session(Path(workdir) / "warehouse", "reliability-harness", access)
        spark.conf.set("spark.sql.catalog.lake.cache-enabled", "false")
        return spark

    # --- setup -----------------------------------------------------------------------------
    def setup(self, *, initial_rows: int = 300, kill: bool = True, adopt_kills: bool = True,
              snapshot_mode: str = "exported") -> None:
        """Schema, publications, the native subscriber, the initial sync and its first apply; ``kill``
        kills the initial sync mid-copy first, ``adopt_kills`` that apply at both adoption points.
        ``snapshot_mode="chunked"``: the chunked load instead (:meth:`chunked_load`)."""
        from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
        from airflow_provider_pglogical.management.publications import PublishedTable

        self.workload.create_schema()
        if self.shapes:
            self.shapes.create_schema()
        self.figures.counts.add(self.workload.load(initial_rows))
        if self.shapes:
            self.shapes.changes(10, self.figures.counts)
        self.events.create()
        self.events.changes(10, self.figures.counts)
        hook = self.hook()
        for name, (tables, via_root) in PUBLICATIONS.items():
            hook.create_publication(name, [PublishedTable.of("public", t, columns=c, where=w) for t, c, w in tables],
                                    publish_via_partition_root=via_root)
        if self.shapes:
            hook.create_publication(SHAPES_PUBLICATION, self.shapes.published())
        self.hook(self.subscriber).create_subscription(SUBSCRIPTION, self.subscribed,
                                                       publisher_conn_id=self.publisher.conn_id)
        if snapshot_mode == "chunked":
            from tests.reliability.chunked_setup import chunked_load

            chunked_load(self, kill)
        else:
            if kill:
                self.killed_subprocess("initial_sync_mid_copy")
            run_initial_sync(hook, slot=SLOT, publications=self.publications, root=self.root, pipeline=PIPELINE,
                             type_overrides=TYPE_OVERRIDES, report=lambda m: None)
        if adopt_kills:
            self.apply("adopt_before_commit")
            self.apply("adopt_after_commit")
        self.apply()

    def committed_batches(self, kind: str) -> int:
        """Committed batches of ``kind`` in staging (whichever run, killed or not, staged them)."""
        from airflow_provider_pglogical.staging import layout

        return sum(1 for *_, k in layout.committed_batches(self.root, PIPELINE) if k == kind)

    def removed_batches(self) -> int:
        """Batches staging retention removed (its record under the pipeline's staging)."""
        from airflow_provider_pglogical.staging import layout
        from airflow_provider_pglogical.staging.contract import RETENTION_RECORD

        return (layout.read_pipeline_file(self.root, PIPELINE, RETENTION_RECORD) or {}).get("removed_batches", 0)

    # --- pull ------------------------------------------------------------------------------
    def pull_all(self, kills: set[str], changes: int) -> None:
        from airflow_provider_pglogical.capture.pull import run_pull

        # upto_nchanges counts decoded messages: from ~3 batches per round down to one. Every
        # batch costs one MERGE per table in the apply, so windows stay proportional to the round.
        max_changes = self.rng.choice([changes // 2 + 100, 2 * changes + 100, 20 * changes])
        for point in ("pull_before_manifest", "pull_before_advance", "schema_change"):
            if point in kills:
                self.killed_subprocess(point, MAX_CHANGES=max_changes)
        for _ in range(10_000):
            result = run_pull(self.hook(), slot=SLOT, publications=self.publications, root=self.root,
                              pipeline=PIPELINE, max_changes=max_changes, type_overrides=TYPE_OVERRIDES,
                              report=lambda m: None)
            if result["batch"] is None:
                return
            self.figures.batches += 1 if not result["recovered"] else 0
        self.fail("pull never ran dry")

    def backfill(self, kills: set[str]) -> None:
        from airflow_provider_pglogical.capture.backfill import run_backfill

        table = self.rng.choice(["public.accounts", "public.events", "public.orders", "public.audit", "public.bag",
                                 "public.specials"])
        if "backfill_mid_copy" in kills:
            self.killed_subprocess("backfill_mid_copy", TABLES=table)
        run_backfill(self.hook(), tables=[table], publications=self.publications, root=self.root, pipeline=PIPELINE,
                     type_overrides=TYPE_OVERRIDES, report=lambda m: None)

    # --- apply -----------------------------------------------------------------------------
    def apply(self, kill: str | None = None) -> dict | None:
        """spark-submit the apply job; ``kill``: None, ``apply_mid_merge`` or one of :data:`SELF_KILLS`."""
        from airflow_provider_pglogical.operators.iceberg_apply import APPLY_JOB, RESULT_PREFIX

        if kill is None and self.spark is not None:
            from airflow_provider_pglogical.spark.jobs import apply_changes

            self.figures.in_session += 1
            return apply_changes.run(self.spark, ApplyOptions(spark_uri(self.staging), PIPELINE, "lake", NAMESPACE,
                                     retention_hours=0))
        env = SELF_KILLS[kill][0] if kill in SELF_KILLS else {}
        # retention at its most eager: every batch applied by every table goes at once (but the
        # newest change batch), so every kill point also meets a staging with its history removed
        iceberg = self.iceberg()
        args = ["--options", ApplyOptions(spark_uri(self.staging), PIPELINE, iceberg.catalog, iceberg.namespace,
                                          write_mode=iceberg.write_mode, bucket_count=iceberg.bucket_count,
                                          retention_hours=0).to_json()]
        self.figures.spark_submits += 1
        log_path = self.workdir / "logs" / f"apply-{self.figures.spark_submits:04d}.log"
        access = self.access()
        # an object store's keys and the catalog's password: in a private file, never on the command line
        with private_properties(access.private) as properties_file:
            process = start_job(submit_command(APPLY_JOB, args, conf=access.public, properties_file=properties_file),
                                env=env)
            output, killed_at = [], None
            with open(log_path, "w", buffering=1) as log:
                for line in process.stdout:
                    output.append(line)
                    log.write(line)
                    if kill == "apply_mid_merge" and killed_at is None and ": applied " in line:
                        # the first step committed and the round's other tables are still merging (the
                        # job applies several at once): kill them mid-MERGE, before the state commit
                        if process.poll() is None:
                            kill_tree(process)
                            killed_at = time.monotonic()
            code = process.wait()
        text = "".join(output)
        if kill == "apply_mid_merge":
            if killed_at is not None and code != 0:
                self.figures.killed(kill)
            else:
                self.figures.missed[kill] = self.figures.missed.get(kill, 0) + 1
                if code != 0:
                    self.fail(f"apply failed (exit {code}), see {log_path}:\n{text[-5000:]}")
            return None
        if kill in SELF_KILLS:
            if code == 0:
                self.figures.missed[kill] = self.figures.missed.get(kill, 0) + 1
                return None
            if SELF_KILLS[kill][1] not in text:
                self.fail(f"apply failed (exit {code}) before its crash point, see {log_path}:\n{text[-5000:]}")
            self.figures.killed(kill)
            if kill == "adopt_before_commit":  # the kill came after the files were linked into the table
                self.figures.linked_orphans = len(self.adopted_files())
            return None
        if code != 0:
            self.fail(f"apply failed (exit {code}), see {log_path}:\n{text[-5000:]}")
        return job_result(text, RESULT_PREFIX)

    def adopted_files(self) -> set[Path]:
        """The adopted data files in a local warehouse that are hard links of a staged file."""
        if self.lakehouse is not None:
            return set()
        return {path for path in (self.workdir / "warehouse").glob("**/data/*-adopted.parquet")
                if path.stat().st_nlink > 1}

    # --- oracle ----------------------------------------------------------------------------
    def wait_subscriber(self, timeout: float = 180) -> None:
        from airflow_provider_pglogical.embedded.postgres import wait_until

        sub = self.hook(self.subscriber)
        wait_until(lambda: (s := sub.subscription_status(SUBSCRIPTION)) is not None and s.ready, timeout=timeout,
                   message=f"subscription {SUBSCRIPTION} to be ready")
        target = self.publisher.query("SELECT pg_current_wal_lsn()::text")[0][0]

        def caught_up():
            rows = self.publisher.query(
                "SELECT replay_lsn >= %s::pg_lsn FROM pg_stat_replication WHERE application_name = %s",
                (target, SUBSCRIPTION))
            return bool(rows) and all(r[0] for r in rows)

        wait_until(caught_up, timeout=timeout, interval=0.2, message=f"subscriber to replay up to {target}")
        status = sub.subscription_status(SUBSCRIPTION)
        if status.apply_error_count or status.sync_error_count:
            self.fail(f"the native subscriber reports errors: {status}")

    def verify(self) -> None:
        self.wait_subscriber()
        others = [p for p in self.subscribed if p != FILTERED_PUBLICATION]
        # every table but the row-filtered one: the lakehouse must equal the native subscriber
        result = self.run_verify(others, source_conn_id=self.subscriber.conn_id)
        if not result["equal"]:
            self.fail("the lakehouse differs from the native subscriber:\n" + self.explain(result))
        # the row-filtered table: the lakehouse must equal the publisher's projection; the native
        # subscriber may differ only by NULLs in unchanged-TOAST cells of rows that entered the filter
        result = self.run_verify([FILTERED_PUBLICATION])
        if not result["equal"]:
            self.fail("the lakehouse differs from the publisher's projection:\n" + self.explain(result))
        # the tables whose publication and storage change at random: the publisher's projection
        result = self.run_verify([EVENTS_PUBLICATION])
        if not result["equal"]:
            self.fail("the lakehouse differs from the publisher's projection after " + f"{self.events.done}:\n"
                      + self.explain(result))
        self.figures.toast_cells = self.compare_filtered_with_subscriber()
        self.figures.verified_rounds += 1

    def run_verify(self, publications: list[str], source_conn_id: str | None = None, limit: int = 10) -> dict:
        """``verify_pipeline``'s verdict. When it finds differences, verify runs again to list up to
        200 differing rows per table (``diagnosis``); the verdict stays the first run's, whatever the
        second says."""
        from airflow_provider_pglogical.verification.witness import compare_in_session, verify_pipeline

        if self.spark is None:
            self.figures.spark_submits += 1
        else:
            self.figures.in_session += 1
        result = verify_pipeline(postgres_conn_id=self.publisher.conn_id, publications=publications,
                                 staging_path=self.staging, pipeline=PIPELINE, iceberg=self.iceberg(),
                                 source_conn_id=source_conn_id, type_overrides=TYPE_OVERRIDES, report=lambda m: None,
                                 limit=limit, compare=None if self.spark is None else compare_in_session(self.spark))
        if limit > 10:
            return result
        self.figures.compared_tables += len(result["tables"])
        self.figures.differing_tables += sum(1 for table in result["tables"] if not table["equal"])
        if not result["equal"]:
            result["diagnosis"] = self.run_verify(publications, source_conn_id, limit=200)
        return result

    @staticmethod
    def explain(result: dict) -> str:
        lines = []
        for table in result.get("diagnosis", result).get("tables", []):
            if table["equal"]:
                continue
            lines.append(f"{table['table']}: source {table.get('source_rows')} rows, lakehouse "
                         f"{table.get('target_rows')} rows; first differing keys {table.get('first_differing_keys')}")
            for side in ("only_in_source", "only_in_target"):
                for row in table.get(side, [])[:5]:
                    lines.append(f"  {side}: " + json.dumps({k: (v[:40] + "…" if isinstance(v, str) and len(v) > 40
                                                                  else v) for k, v in row.items()}, default=str))
        return "\n".join(lines) or json.dumps(result)[:2000]

    def compare_filtered_with_subscriber(self) -> int:
        """Differences publisher projection vs native subscriber of the row-filtered table; returns the
        count of documented TOAST cells, fails on anything else."""
        columns = ", ".join(FILTERED_COLUMNS)
        key = len(FILTERED_KEY)
        pub = {r[:key]: r for r in self.publisher.query(
            f"SELECT {columns} FROM {FILTERED_TABLE} WHERE region = 'EU'")}
        sub = {r[:key]: r for r in self.subscriber.query(f"SELECT {columns} FROM {FILTERED_TABLE}")}
        if pub.keys() != sub.keys():
            self.fail(f"native subscriber's {FILTERED_TABLE} has other keys than the publisher: "
                      f"only publisher {sorted(pub.keys() - sub.keys())[:10]}, only subscriber "
                      f"{sorted(sub.keys() - pub.keys())[:10]}")
        cells = 0
        for k, row in pub.items():
            for name, want, got in zip(FILTERED_COLUMNS, row, sub[k]):
                if want == got:
                    continue
                if name in TOAST_COLUMNS and got is None and want is not None:
                    cells += 1
                    continue
                self.fail(f"native subscriber's {FILTERED_TABLE} {k} differs in {name} beyond the documented "
                          f"TOAST case: publisher {str(want)[:60]!r}, subscriber {str(got)[:60]!r}")
        return cells

    # --- a round ---------------------------------------------------------------------------
    def round(self, changes: int, kills: set[str] = frozenset(), *, truncate: bool = False) -> Counts:
        counts = self.workload.run(changes, add_column="schema_change" in kills or self.rng.random() < 0.2,
                                   truncate=truncate)
        ddl = []
        if self.shapes:  # issue 33's shapes: changes, one DDL point of every shape (both sides idle), more changes
            self.shapes.changes(4, counts)
            self.wait_subscriber()
            ddl = self.shapes.ddl(self.hook(), counts)
            self.shapes.changes(4, counts)
        self.events.changes(3, counts)  # issue 47's events between changes of their tables
        self.events.done = self.events.events()
        self.events.changes(3, counts)
        ddl = [*ddl, *self.events.done]
        self.figures.counts.add(counts)
        self.pull_all(kills, changes)
        if "backfill_mid_copy" in kills:
            self.backfill(kills)
        if "schema_change" in kills:
            self.apply("apply_before_state")
        for point in ("apply_before_state", "apply_mid_merge"):
            if point in kills:
                self.apply(point)
        self.apply()
        self.verify()
        self.figures.rounds += 1
        self.report(f"[seed {self.seed}] round {self.figures.rounds}: {counts.changes:,} changes "
                    f"({counts.transactions} transactions, {counts.rollbacks} rollbacks, "
                    f"{counts.prepared_committed}+{counts.prepared_rolled_back} prepared committed+rolled back, "
                    f"{counts.big_transactions} big, {counts.truncates} truncates, columns added "
                    f"{counts.added_columns}; DDL {ddl}); kills {sorted(kills)}; verified equal "
                    f"(native subscriber TOAST NULL cells: {self.figures.toast_cells})")
        return counts


def short_schedule() -> list[tuple[set[str], bool]]:
    """Rounds of the CI mode: every kill point once (the initial sync's at set-up), batched into two
    rounds: a round's fixed cost (the shapes' DDL, an apply, two verify jobs) is most of its time."""
    return [
        ({"pull_before_manifest", "pull_before_advance", "backfill_mid_copy", "apply_before_state"}, False),
        ({"schema_change", "apply_mid_merge"}, True),
    ]


def long_schedule(rounds: int, rng: random.Random) -> list[tuple[set[str], bool]]:
    points = [p for p in KILL_POINTS if p not in SETUP_KILL_POINTS]
    schedule = []
    for i in range(rounds):
        kills = {points[i % len(points)]}
        kills |= set(rng.sample(points, rng.randint(0, 2)))
        schedule.append((kills, rng.random() < 0.3))
    return schedule


# --- long mode: its own clusters ------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse
    import shutil
    import tempfile

    from airflow_provider_pglogical.embedded.postgres import LocalPostgres
    from tests.support.databases import new_database

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--changes", type=int, default=10_000, help="committed row changes per round")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--snapshot-mode", choices=["exported", "chunked"], default="exported",
                        help="the set-up's initial load (chunked: killed mid-chunk, then resumed)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pglogical-reliability-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    publisher_cluster = LocalPostgres(name="rel-publisher").start()
    subscriber_cluster = LocalPostgres(name="rel-subscriber").start()
    try:
        harness = Harness(new_database(publisher_cluster, "publisher", name="relpub"),
                          new_database(subscriber_cluster, "subscriber", name="relsub"), workdir, args.seed)
        harness.reproduce = (f"python -m tests.reliability.harness --rounds {args.rounds} --changes {args.changes} "
                             f"--seed {args.seed}")
        harness.setup(initial_rows=min(2000, args.changes // 5), snapshot_mode=args.snapshot_mode)
        for kills, truncate in long_schedule(args.rounds, random.Random(args.seed)):
            harness.round(args.changes, kills, truncate=truncate)
    except BaseException:
        print(f"FAILED with seed {args.seed}; reproduce: python -m tests.reliability.harness --rounds {args.rounds} "
              f"--changes {args.changes} --seed {args.seed}", flush=True)
        raise
    finally:
        publisher_cluster.stop()
        subscriber_cluster.stop()
    f = harness.figures
    print(json.dumps({
        "seed": args.seed, "rounds": f.rounds, "changes": f.counts.changes, "transactions": f.counts.transactions,
        "rollbacks": f.counts.rollbacks, "prepared_committed": f.counts.prepared_committed,
        "prepared_rolled_back": f.counts.prepared_rolled_back, "truncates": f.counts.truncates,
        "key_changes": f.counts.key_changes, "filter_crossings": f.counts.filter_crossings,
        "added_columns": f.counts.added_columns, "kills_survived": f.kills, "kills_missed": f.missed,
        "change_batches": harness.committed_batches("changes"), "snapshot_batches": harness.committed_batches("snapshot"),
        "removed_by_retention": harness.removed_batches(),
        "spark_submits": f.spark_submits, "verified_rounds": f.verified_rounds,
        "compared_tables": f.compared_tables, "differing_tables": f.differing_tables,
        "native_subscriber_toast_null_cells_last_round": f.toast_cells, "seconds": round(time.monotonic() - started),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
