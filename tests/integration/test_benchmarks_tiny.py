"""Benchmarks that cannot rot: each script in ``TINY`` runs at a tiny size, as CI runs it.

A benchmark that fails at HEAD (``bench_pull.py`` did, once pulls needed an initial snapshot)
fails here. The Spark benchmarks are not in the list yet (issue 34).
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
}


@pytest.mark.parametrize("script", sorted(TINY))
def test_the_benchmark_runs_at_a_tiny_size(script, tmp_path):
    args, expected = TINY[script]
    done = subprocess.run([sys.executable, script, *args], cwd=REPO / "bench", capture_output=True, text=True,
                          timeout=600, env=subprocess_env(AIRFLOW_HOME=str(tmp_path / "airflow")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert expected in done.stdout
