"""Benchmarks that cannot rot: every script in ``bench/`` runs at a tiny size, as CI runs it.

A benchmark that fails at HEAD (``bench_pull.py`` did, once pulls needed an initial snapshot)
fails here. Each script runs as its own process with ``--tiny`` (or its size flags), on its own
throwaway cluster, the way a person runs it; the figures of such a run mean nothing, only that
it ends well and prints its report (several also compare the lakehouse with the source).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.environment import REPO, subprocess_env

#: script -> (tiny arguments, a line its report always prints)
TINY = {
    "bench_decoder.py": (["--messages", "2000", "--repeat", "1"], "end to end"),
    "bench_pull.py": (["--changes", "2000", "--repeat", "1", "--window", "500", "--windows", "2",
                       "--backlog-seconds", "1"], "ours vs raw peek"),
    "bench_snapshot.py": (["--tiny", "--iceberg", "--overlap"], "started beside the snapshot (until_loaded)"),
    "bench_chunked_load.py": (["--tiny"], "chunked load vs raw COPY:"),
    "bench_warm_load.py": (["--tiny"], "backfill into a running window: exported snapshot -> queryable"),
    "bench_idle_apply.py": (["--tiny"], "idle apply tick,"),
    "bench_apply.py": (["--tiny"], "| plain | 2,000 |"),
    # on the S3 server and the JDBC catalog (its local pipeline is the one bench_mixed_tick's tiny run drives)
    "bench_tick.py": (["ticks", "--tiny", "--lakehouse", "s3"], "1 tables x 100 changes, concurrency 4, "
                      "driver JVM options none, lakehouse s3"),
    "bench_mixed_tick.py": (["--tiny"], "every table equal to its source in every lakehouse"),
    "bench_mixed_ab.py": (["--tiny"], "every table equal to its source in every lakehouse"),
    # its S3 path (the local one is its default), counting delete files after each round
    "bench_step_profile.py": (["--tiny", "--lakehouse", "s3", "--delete-files"], "delete files per table over the rounds"),
    "bench_housekeeping.py": (["--tiny"], "small shuffles, 4 at a time: median"),
    "bench_soak.py": (["--tiny"], "verification: all 2 lakehouse tables equal their source tables"),
    "bench_freshness.py": (["--tiny"], "freshness through the scheduler: p50"),
    # the streaming windows at rising change rates: freshness by Iceberg snapshots, CPU, busy stages
    "bench_rate.py": (["--tiny"], "sustained rate:"),
    "bench_s3_hashing.py": (["--tiny"], "hashes equal, the row deltas get the hashed bytes"),
    # the REST catalog with S3FileIO against the local Hadoop catalog: ticks and a streaming round
    "bench_catalogs.py": (["--tiny"], "rest catalog with S3FileIO / local Hadoop catalog: 1-table tick"),
}
#: scripts in bench/ that do not run here, and why
NOT_RUN = {
    "dlt_baseline.py": "needs dlt, which is not a dependency: bench_snapshot.py runs it with --dlt-python",
    "common.py": "helpers, not a benchmark",
    "snapshot_judge.py": "bench_freshness.py's judge (Iceberg snapshots by time travel), not a benchmark",
}


def test_every_bench_script_runs_here_or_says_why_not():
    scripts = {path.name for path in (REPO / "bench").glob("*.py") if path.name != "__init__.py"}
    assert scripts - set(TINY) - set(NOT_RUN) == set(), "add the new benchmark to TINY with a tiny size"


@pytest.mark.parametrize("script", sorted(TINY))
def test_the_benchmark_runs_at_a_tiny_size(script, tmp_path):
    args, expected = TINY[script]
    done = subprocess.run([sys.executable, script, *args], cwd=REPO / "bench", capture_output=True, text=True,
                          timeout=600, env=subprocess_env(AIRFLOW_HOME=str(tmp_path / "airflow")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert expected in done.stdout, done.stdout[-2000:]
