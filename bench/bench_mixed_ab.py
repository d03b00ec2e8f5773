"""A/B of the apply job's own choices on bench_mixed_tick's 2,000-change tick, in one Spark session.

    python bench/bench_mixed_ab.py [--variants default,no-facts] [--ticks 7] [--rows 20000]

One database and one in-process pipeline (``apply_changes.run`` in a long-lived session) per
variant, each getting the same seeded workload every tick; the
variants apply one after the other, their order reversed every tick. Variants:

- ``default``: the job as it is;
- ``no-facts``: the pull's change facts ignored (``contract.facts_decide`` answers None): every
  step reads its batch once to learn them, as before they were written;
- ``rows-pruning``: a MERGE's target scan pruned by the table's row count only, not its bytes;
- ``no-row-deltas``: every change batch MERGEd, none committed as a row delta (``row_deltas.py``,
  ``multiset_row_deltas.py``);
- ``no-multiset-row-deltas``: keyless tables' batches MERGEd, keyed tables' as they are.

Prints each tick's in-job seconds and steps per variant, the medians of ticks 1 on (tick 0 warms)
and checks every lakehouse against its source.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import bench_tick  # noqa: E402  (prepares the environment)
from bench.bench_mixed_tick import create_source, differences, finish, steps_line, workload  # noqa: E402
from bench.bench_soak import quiet_logs, spark_session  # noqa: E402
from airflow_provider_pglogical.spark.jobs import apply_changes  # noqa: E402
from airflow_provider_pglogical.spark.paths import choice, merge  # noqa: E402
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions  # noqa: E402
from airflow_provider_pglogical.staging.seam.manifests import TableManifest  # noqa: E402


@contextlib.contextmanager
def patched(owners: list, name: str, replacement):
    """``name`` replaced on every owner for the block."""
    saved = [getattr(owner, name) for owner in owners]
    for owner in owners:
        setattr(owner, name, replacement)
    try:
        yield
    finally:
        for owner, value in zip(owners, saved):
            setattr(owner, name, value)


def variant(name: str):
    if name == "default":
        return contextlib.nullcontext()
    if name == "no-facts":
        return patched([TableManifest], "facts_decide", lambda table, position: None)
    if name == "rows-pruning":
        by_bytes_too = merge.prunes  # its row rule alone: the table's bytes left out
        return patched([merge], "prunes", lambda rows, batch_rows, table_bytes=0: by_bytes_too(rows, batch_rows))
    if name in ("no-row-deltas", "no-multiset-row-deltas"):
        stack = contextlib.ExitStack()
        stack.enter_context(patched([choice], "multiset_ineligible", lambda manifest, types, position: "off"))
        if name == "no-row-deltas":
            stack.enter_context(patched([choice], "ineligible", lambda manifest, types, position: "switched off"))
        return stack
    raise SystemExit(f"unknown variant {name!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="default,no-facts")
    parser.add_argument("--ticks", type=int, default=7)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if args.tiny:
        args.ticks, args.rows = 1, 500
    names = args.variants.split(",")
    quiet_logs()
    with tempfile.TemporaryDirectory() as tmp, bench_tick.cluster("bench_mixed_ab") as pg:
        tmp_path = Path(tmp)
        pipelines = {}
        dbs = {name: f"v{index}" for index, name in enumerate(names)}  # database, staging and namespace
        for name, db in dbs.items():
            pg.create_database(db)
            create_source(pg, db, args.rows)
            pipelines[name] = bench_tick.Pipeline(pg, db, tmp_path, db)
            pipelines[name].sync()
        spark = spark_session(tmp_path / "warehouse", "2g")

        def apply(name: str) -> tuple[float, list[dict]]:
            db = dbs[name]
            with variant(name):
                result = apply_changes.run(spark, ApplyOptions((tmp_path / f"staging-{db}").as_uri(), "p", namespace=db))
            return result["seconds"], result["steps"]

        for name in names:
            apply(name)  # the snapshot, and the session's first queries
        rng = random.Random(11)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for tick in range(args.ticks + 1):
            statements = workload(tick + 1, rng)
            for name, pipeline in pipelines.items():
                pg.execute("; ".join(statements), dbname=dbs[name])
                pipeline.pull()
            for name in names if tick % 2 == 0 else names[::-1]:
                took, steps = apply(name)
                print(f"tick {tick} {name}: in-job {took:.2f} s [{steps_line(steps)}] (load {bench_tick.load()})",
                      flush=True)
                if tick:
                    seconds[name].append(took)
        baseline = statistics.median(seconds[names[0]])
        for name in names:
            median = statistics.median(seconds[name])
            print(f"{name}: in-job median {median:.2f} s over {len(seconds[name])} ticks "
                  f"({median / baseline:.2f}x {names[0]}): {', '.join(f'{s:.2f}' for s in seconds[name])}")
        finish(spark, [d for name in names for d in differences(pg, dbs[name], spark, tmp_path / "warehouse", dbs[name])])


if __name__ == "__main__":
    main()
