"""Apply staged snapshot and change batches to Apache Iceberg tables (a PySpark job).

Runs on Spark 3.5 and 4.x and imports nothing from Airflow: it ships to any cluster as this file
plus a zip of ``spark/`` and ``staging/contract.py`` through ``py_files``
(``spark/launch.py``; the operator passes it)::

    spark-submit --py-files pglogical_job.zip apply_changes.py --options '{"staging_root": "s3a://bucket/staging",
        "pipeline": "orders", "catalog": "lake", "namespace": "sales", "table_map": {"public.orders": "orders"}}'

(the options are one :class:`ApplyOptions`, ``staging/seam/apply_options.py``, written by the operator).

What it does, per source table, in batch-name (= LSN) order (the staging contract is
``staging/contract.py``; the modules beside this one do each part):

- A **snapshot** batch at position C that the table has not applied replaces the table's contents
  (a ranged backfill only the range named in its manifest ``details.key_range``; ``plan.py``) and
  sets the table's position to C, even when the position was already past C (a late backfill):
  the change batches holding commits at or after C are then applied again, from C. (A keyless
  table's ranged snapshot folds the range's changes from C to the table's position into the range
  instead: ``multisets.py``.) The latest pending full snapshot makes every earlier batch irrelevant.
- A **change** batch whose end is past the table's position is reduced to the last change per key
  by ``(_commit_lsn, _seq)`` (rows before the position are skipped; key-changing updates delete the
  old key; unchanged-TOAST columns keep the value of an earlier change of the same row, following
  key changes, else the lakehouse's) and applied with ONE ``MERGE INTO``; a small batch that sets
  whole rows is committed by the driver as one Iceberg row delta instead (``row_deltas.py``). A batch holding a
  TRUNCATE replaces the table with the rows after the last TRUNCATE (one atomic overwrite).
- A **keyless** table (REPLICA IDENTITY FULL) is a multiset, as PostgreSQL's subscriber keeps it:
  identical rows are numbered in ``_pglogical_occurrence`` and a change batch changes the number of
  copies of each row value it touches (``multisets.py``; a small batch as a row delta,
  ``multiset_row_deltas.py``).
- Positions and applied snapshot batches are recorded per table in
  ``<catalog>.<namespace>._pglogical_state`` (one row per pipeline and source table, partitioned
  by pipeline). Tables advance in rounds of one step each; after every round this pipeline's rows
  are rewritten in one commit. A crash between a data commit and the state commit makes the next
  run apply that one step again, which is exact: a step sets every key it touches to a value
  computed from the batch, or keeps the lakehouse's value where the batch does not know it (a
  keyless table's step marks the row values it changed and skips them when run again).

Identity (``table_identity.py``): before anything is written, the run refuses two sources with one
target, a target another pipeline, database or source table owns (``pglogical.owner``), columns
Iceberg reserves or that differ only in case, and a table of another format version
(``format_versions.py``: v2 by default, v3 on request, an upgrade only when asked, never a downgrade).

Schema (``lakehouse_tables.py``): missing tables are created from the manifest (the write mode's
``write.*.mode``, key columns NOT NULL and in ``pglogical.replica-identity-key``; keyless tables get
``_pglogical_occurrence`` and ``_pglogical_batch``), added columns added, widening type changes
applied, others refused, renamed and dropped columns followed, a snapshot marked ``replace_table``
drops and creates the table first. A target table that was dropped is
rebuilt from the staged batches (its state is reset), as far as staging retention kept them: after
the run's last state commit, applied batches older than the retention are removed
(``retention.py``), and a plan that needs a removed one fails naming the backfill to run.
One apply per pipeline and lakehouse: the run holds a lease (a property of the state table,
``lease.ApplyLease``) from before its first write to its end; a second apply finds it and
fails at once, writing nothing (its result says ``error.kind`` = ``apply-lease-held``, which the
operator raises as a retryable error). A killed apply's lease expires after ``lease_seconds``.
Every commit validates against the snapshot its step read, so no retry applies a change twice.
Before any step writes, the chain of change batches from each table's position is proven to
have no hole and every file a step reads to match its manifest (``retention.prove_staging``).
With ``keep_running`` seconds the run keeps its session and lease after that, applying each
newly committed batch in a round of its own until the window ends (``apply_window.py``).
"""


from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait

from airflow_provider_pglogical.spark.apply.lease import ApplyLease, ApplyLeaseHeld
from airflow_provider_pglogical.spark.common.commit_stamp import stamped
from airflow_provider_pglogical.spark.common.hadoop_files import Staging, damaged_file_error, write_result
from airflow_provider_pglogical.spark.apply.keyed import KeyedTables
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.apply.multisets import Multisets
from airflow_provider_pglogical.spark.common.session import (  # noqa: F401 (tune_session and the defaults: used by the tests and benchmarks)
    create_session,
    session_defaults,
    small_shuffles,
    tune_session,
)
from airflow_provider_pglogical.spark.common.errors import ApplyError, job_error
from airflow_provider_pglogical.spark.housekeeping.delete_compaction import compact_written
from airflow_provider_pglogical.spark.apply.plan import (
    Step, TableState, batches_that_matter, caught_up, fold_changes, plan_table)
from airflow_provider_pglogical.spark.apply.retention import apply_retention, prove_staging
from airflow_provider_pglogical.spark.apply.state_table import landed_position, settle_orphans
from airflow_provider_pglogical.spark.apply.table_identity import adopt_legacy_keys, check_run, normal_table_map
from airflow_provider_pglogical.spark.jobs.apply_window import (
    Phases, commit_conflict, first_commits, keep_applying, loaded, record_round, window_after_handover)
from airflow_provider_pglogical.spark.jobs.warm_up import warm_up
from airflow_provider_pglogical.spark.paths.choice import ApplyPath, choose_path, table_facts
from airflow_provider_pglogical.spark.paths.taken import take_path
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from airflow_provider_pglogical.staging.contract import (
    APPLY_RESULT_PREFIX,
    OCCURRENCE,
    ORPHANED_TABLES,
    PIPELINE_RECORD,
    RETENTION_RECORD,
    SOURCE_IDENTITY,
    default_target_name,
    format_lsn,
)

log = logging.getLogger("pglogical.apply")
#: the job's exit code when another apply of the pipeline holds the lease (sysexits' EX_TEMPFAIL)
EXIT_LEASE_HELD = 75


def run(spark, options: ApplyOptions) -> dict:
    """Apply every pending batch of ``options.pipeline``; returns a summary (per step: table, batch,
    rows, seconds). What each option does: :class:`ApplyOptions`.

    :raises ApplyLeaseHeld: another apply of the pipeline holds the lease; nothing was written.
    """
    problems = options.problems()
    if problems:
        raise ApplyError("; ".join(problems))
    pipeline, keep_running = options.pipeline, options.keep_running
    started = time.monotonic()
    run_group = spark_job_group(spark, f"pglogical apply {pipeline}")
    table_map = normal_table_map(options.table_map)
    staging = Staging(spark, options.staging_root, pipeline)
    if not staging.committed() and not keep_running:
        log.info("no committed batch under %s", staging.directory)
        return {"pipeline": pipeline, "batches": 0, "steps": [], "seen": [], "targets": {}}
    phases = Phases(started)  # where the job's time goes, for the log and the benchmarks
    phases.end("listing")
    lakehouse = Lakehouse(spark, options.catalog, options.namespace, options.write_mode, options.bucket_count,
                          options.format_version, options.upgrade_format_version)
    window = keep_running if keep_running and not options.until_loaded else None  # an initial load's may end early
    warm = (lambda: warm_up(spark, lakehouse.format_version)) if window else None  # while a window waits for the lease's handover
    with ApplyLease(spark, lakehouse, pipeline, options.lease_seconds, options.lease_holder, window, warm) as lease:
        phases.end("lease")
        if options.bucket_count:
            lakehouse.drop_batch_tables()
        options = options.replace(table_map=table_map)

        def apply_round() -> dict:
            return apply_pending(spark, staging, lakehouse, lease, options, phases)

        if keep_running:
            summary = keep_applying(apply_round, lambda: _listed(staging, lease),
                                    window_after_handover(keep_running, lease.waited, options.poll_interval),
                                    options.poll_interval, record=lambda entry: record_round(staging, entry),
                                    until=loaded if options.until_loaded else None, idle=lambda: warm_up(spark, lakehouse.format_version),
                                    promise=lease.promise if window else None, conflict=commit_conflict)
            summary["window"]["handover_seconds"] = lease.waited
        else:
            summary = apply_round()
        summary["seconds"] = round(time.monotonic() - started, 3)  # the apply inside the job, JVM start excluded
        summary["phases"] = phases.seconds
        log.info("apply of %s took %.2fs: %s", pipeline, summary["seconds"],
                 ", ".join(f"{name} {seconds:.2f}s" for name, seconds in phases.seconds.items()))
        # listing, manifests and the state table (the steps' own jobs are counted per step)
        summary["spark_jobs"], summary["spark_stages"] = spark_work(spark, run_group)
        return summary


def _listed(staging: Staging, lease: ApplyLease) -> list[str]:
    """A window's poll: the committed batch names (one listing, no Spark job), while the lease holds."""
    lease.check()
    return [batch.name for batch in staging.committed()]


def apply_pending(spark, staging: Staging, lakehouse: Lakehouse, lease: ApplyLease, options: ApplyOptions,
                  phases: Phases) -> dict:
    """One round under the lease: every batch committed now, applied in order and recorded."""
    pipeline, table_map, row_deltas = options.pipeline, options.table_map or {}, options.row_deltas
    before = phases.restart()  # a window's wait before this round is no phase's
    # the pipeline's record before the listing: a pull committing meanwhile (a pull window beside
    # this one) records its end only after its batch is committed, so the listing holds that batch
    record = staging.read_file(PIPELINE_RECORD) or {}
    batches = staging.committed()  # again: an apply that ended meanwhile may have removed some
    keyed, multisets = KeyedTables(spark, staging, lakehouse, row_deltas), Multisets(spark, staging, lakehouse, row_deltas)
    states = lakehouse.state.read_state(pipeline)
    known = set(states)
    phases.end("state_read")
    for source, state in states.items():
        if not lakehouse.exists(state.target):
            log.warning("table %s of %s is missing: rebuilding it from staging", state.target, source)
            states[source] = TableState(state.target)

    wanted = batches_that_matter(batches, states)
    for batch in wanted:
        batch.manifest = staging.read_manifest(batch)
    staged = {source for batch in wanted for source in batch.manifest.tables}
    adopt_legacy_keys(states, staged)
    known |= set(states)
    orphaned = (record.get("extra") or {}).get(ORPHANED_TABLES) or {}  # dropped ones are never rebuilt
    sources = sorted({s for s in staged if orphaned.get(s, {}).get("action") != "drop" or s in states} | set(states))

    # "seen": every batch this run found committed; once the run succeeds, each of them is applied
    # or irrelevant, which lets the operator skip Spark when nothing else has been committed since
    summary = {"pipeline": pipeline, "batches": len(batches), "steps": [], "seen": [b.name for b in batches]}
    plans = {}
    for source in sources:
        if source not in states:
            states[source] = TableState(table_map.get(source) or default_target_name(source))
        state = states[source]
        steps, superseded = plan_table(source, wanted, state)
        state.snapshots.update(superseded)
        if steps and steps[0].kind == "changes" and steps[0].batch.manifest.tables[source].is_multiset:
            landed = landed_position(lakehouse, state, pipeline)  # a keyless step's commit without its state
            if landed is not None:
                log.info("%s: its batch %s landed without its state commit: it continues from there", source, landed[1])
                state.position, state.last_batch = landed
                steps, _ = plan_table(source, wanted, state)
        plans[source] = fold_changes(source, steps, options.folding())
    prove_staging(staging, pipeline, batches, plans, states, staging.read_file(RETENTION_RECORD), record)
    check_run(lakehouse, pipeline, (record.get("extra") or {}).get(SOURCE_IDENTITY), plans, states, known)
    for source, position in caught_up(plans, states, batches).items():  # recorded by the rounds' state commits
        states[source].position = position
    phases.end("planning")
    # Tables advance in rounds, one step each (the tables of a round side by side), then one state
    # commit: no table's recorded position ever lags its data by more than one step, so a crash
    # costs one exact re-apply per table.
    with ThreadPoolExecutor(max_workers=max(1, options.concurrency), thread_name_prefix="pglogical-apply") as pool:
        for round_ in range(max((len(steps) for steps in plans.values()), default=0)):
            lease.check()
            due = [(source, steps[round_]) for source, steps in plans.items() if round_ < len(steps)]
            futures = [pool.submit(_in_own_pool, spark, _apply_step, keyed, multisets, lakehouse, source,
                                   states[source], step, pipeline) for source, step in due]
            wait(futures)  # every step of the round has ended (committed or failed) before anything else
            committed, failed = len(summary["steps"]), None
            for future in futures:
                try:
                    summary["steps"].append(future.result())
                except Exception as error:  # the first failure, in table order, is raised after the state commit
                    failed = failed or error
                    continue
                _crash_point(len(summary["steps"]))
            phases.end("steps")
            lease.check()  # a run that outlived its lease records nothing: another may be applying
            if len(summary["steps"]) > committed:
                # the steps that committed are recorded even when another step of the round failed (a
                # conflict with housekeeping, most often): else a keyless table's landed commit would
                # be applied again by the round that follows
                lakehouse.state.write_state(pipeline, states)
            phases.end("state_commits")
            if failed is not None:
                raise failed
    lease.check()
    summary["orphaned"] = settle_orphans(lakehouse, orphaned, states, pipeline)
    summary["compactions"] = compact_written(spark, lakehouse, summary["steps"], options.compact_deletes_at)
    phases.end("compaction")
    summary["targets"] = lakehouse.metadata_locations(states.values())  # for an idle tick: dropped tables
    summary["end_lsn"] = format_lsn(max((b.end for b in batches), default=0))  # every commit before it is in
    summary["first_commits"] = first_commits(summary["steps"], {b.name: b.manifest for b in wanted})
    if options.retention_hours is not None:  # after the last state commit: the states are what Iceberg holds
        lease.check()
        summary["retention"] = apply_retention(staging, batches, states, options.retention_hours, options.archive)
        phases.end("retention")
    summary["round_phases"] = phases.since(before)
    return summary


def _in_own_pool(spark, function, *args):
    """Run ``function`` with this thread's Spark jobs in a FAIR scheduler pool of its own."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", threading.current_thread().name)
    return function(*args)


def _apply_step(keyed: KeyedTables, multisets: Multisets, lakehouse: Lakehouse, source: str, state: TableState,
                step: Step, pipeline: str = "") -> dict:
    started = time.monotonic()
    group = spark_job_group(keyed.spark, f"{source} {step.kind} {step.batch.name}")
    manifest = step.batch.manifest.tables[source]
    replace = manifest.replace_table
    # every snapshot the step commits records the position it holds (commit_stamp.py)
    with stamped(keyed.spark, step.commit_properties(pipeline)):
        if step.kind == "snapshot" and replace:  # DDL the lakehouse cannot follow: a new table (capture/ddl.py)
            lakehouse.replace(state.target, replace)
        types = lakehouse.ensure_table(state.target, manifest)
        applier, snapshot = multisets if OCCURRENCE in types else keyed, step.kind == "snapshot"
        choice = choose_path(step, table_facts(source, lakehouse.iceberg_table(state.target), types,
                                               applier.row_deltas is not None))
        log.info("%s, batch %s: %s, %s", source, step.batch.name, choice.path.value, choice.reason)
        try:
            rows, path = take_path(applier, choice, step, source, state.target, types)
        except Exception as error:  # a staged file damaged after its commit is named, with the fix
            raise damaged_file_error(error, keyed.staging.files(step.batch, source), step.batch.name, source) or error
    if snapshot:
        state.snapshots.add(step.batch.name)
        state.position = step.position if step.through is None else step.through
    else:
        state.position = step.batch.end
    state.last_batch = step.batch.name
    seconds = round(time.monotonic() - started, 3)
    jobs, stages = spark_work(keyed.spark, group)
    row_delta = path is ApplyPath.ROW_DELTA
    adopted = applier.adopted_steps.get((source, step.batch.name), 0)
    log.info("%s: applied %s %s (%d rows, %s) in %.2fs (%d Spark jobs, %d stages)", source, step.kind,
             step.batch.name, rows, f"{adopted} staged files adopted" if adopted else path.value, seconds, jobs, stages)
    return {"table": source, "target": state.target, "kind": step.kind, "batch": step.batch.name,
            "folded": [b.name for b in step.folded or [step.batch]], "rows": rows, "seconds": seconds, "spark_jobs": jobs, "spark_stages": stages, "row_delta": row_delta,
            "adopted_files": adopted, "path": path.value}


def spark_job_group(spark, description: str) -> str:
    """Tag the Spark jobs this thread starts from now on with a group of their own; returns it."""
    group = f"pglogical-{uuid.uuid4().hex[:12]}"
    spark.sparkContext.setJobGroup(group, description)
    return group


def spark_work(spark, group: str) -> tuple[int, int]:
    """How many Spark jobs, and stages in them, the group ran (what a step costs beyond its rows)."""
    tracker = spark.sparkContext.statusTracker()
    infos = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    return len(infos), sum(len(info.stageIds) for info in infos if info is not None)


def _crash_point(step: int) -> None:
    """Tests only: die like a killed executor between a data commit and its state commit."""
    if os.environ.get("PGLOGICAL_APPLY_CRASH_BEFORE_STATE") == str(step):
        log.error("crash point reached after the data commit of step %d", step)
        os.kill(os.getpid(), signal.SIGKILL)


def parse_args(argv: list[str] | None = None) -> ApplyOptions:
    """The job's command line: ``--options <ApplyOptions as JSON>`` (the operator writes it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", required=True, help="the apply's ApplyOptions as JSON (staging/seam/apply_options.py)")
    try:
        options = ApplyOptions.from_json(parser.parse_args(argv).options)
    except (ValueError, TypeError) as error:
        parser.error(f"--options: {error}")
    if options.problems():
        parser.error(f"--options: {'; '.join(options.problems())}")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = create_session(f"pglogical-apply-{options.pipeline}", options.log_level)
    code = 0
    try:
        summary = run(spark, options)
    except Exception as failure:  # the task raises the job's own error, not spark-submit's (errors.job_error)
        log.exception("the apply of %s failed", options.pipeline)
        error = job_error(failure)
        summary = {"pipeline": options.pipeline, "steps": [], "error": error.to_json()}
        code = EXIT_LEASE_HELD if isinstance(failure, ApplyLeaseHeld) else 1
    print(APPLY_RESULT_PREFIX + json.dumps(summary), flush=True)  # for people reading the log
    write_result(spark, summary, committed=code == 0)
    spark.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
