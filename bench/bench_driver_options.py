"""A/B of Spark driver settings on the apply task, the driver's class archive on for all.

    python bench/bench_driver_options.py [--tables 1] [--rounds 4]

N tables of 1,000 rows (bench_tick's workload: 100 changes per table per tick, half the tables
with an unchanged 8 kB value, key changes); after the initial sync, a first apply and one more
(which writes the class archive), each round runs one tick per setting, the settings alternating
so that each meets the same machine. Prints, per setting, the apply task's median wall time
(spark-submit included) and the job's own apply time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import bench_tick  # noqa: E402  (prepares the environment, as bench_tick does)

#: name -> (the operator's quick JIT for small ticks on, more Spark properties)
SETTINGS: dict[str, tuple[bool, dict[str, str]]] = {
    "default JIT (quick_jit_max_rows=None)": (False, {}),
    "quick JIT (the default)": (True, {}),
    "quick JIT + no code generation": (True, {"spark.sql.codegen.wholeStage": "false",
                                             "spark.sql.codegen.factoryMode": "NO_CODEGEN"}),
    "quick JIT + Iceberg write distribution none": (True, {"spark.sql.iceberg.distribution-mode": "none"}),
    "quick JIT + Spark UI off": (True, {"spark.ui.enabled": "false"}),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tables", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, bench_tick.cluster("bench_driver") as pg:
        pg.create_database("d")
        names = bench_tick.create_tables(pg, "d", args.tables)
        pipeline = bench_tick.Pipeline(pg, "d", Path(tmp), "d")
        pipeline.sync()
        pipeline.apply()  # marks the archive directory
        tick = 1
        bench_tick.change_tables(pg, "d", names, tick)
        pipeline.pull()
        pipeline.apply()  # writes the archive
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in SETTINGS}
        for _ in range(args.rounds):
            for name, (quick_jit, conf) in SETTINGS.items():
                tick += 1
                bench_tick.change_tables(pg, "d", names, tick)
                pipeline.pull()
                runs[name].append(pipeline.apply(quick_jit=quick_jit, conf=dict(conf)))
        for name, results in runs.items():
            print(f"{name}: apply task median {statistics.median(w for w, _ in results):.2f} s, in-job median "
                  f"{statistics.median(j for _, j in results):.2f} s; runs {', '.join(f'{w:.1f}' for w, _ in results)}")


if __name__ == "__main__":
    main()
