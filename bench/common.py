"""Shared bench helpers: a throwaway cluster, timing with medians, and result printing."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from airflow_provider_pglogical.embedded.postgres import LocalPostgres  # noqa: E402
from tests.support.environment import prepare  # noqa: E402

prepare()  # spark-submit beside this interpreter, Spark on loopback

BENCH_SETTINGS = {"shared_buffers": "1GB", "max_wal_size": "8GB", "checkpoint_timeout": "30min",
                  "logical_decoding_work_mem": "256MB"}


@contextmanager
def cluster(name: str):
    pg = LocalPostgres(name=name, settings=BENCH_SETTINGS).start()
    os.environ[f"AIRFLOW_CONN_{name.upper()}"] = pg.connection_uri()
    try:
        yield pg
    finally:
        pg.stop()


def server_cpu(pg: LocalPostgres) -> float:
    """CPU seconds the cluster's processes used so far: the postmaster's own plus its reaped
    children's (every backend that has exited, e.g. the COPY sessions of a finished run)."""
    pid = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def client_cpu() -> float:
    """CPU seconds of this process and its waited-for children (psql, dlt)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def peak_rss_growth():
    """Yield a function giving how far this process's peak resident memory rose above its resident
    memory at entry, in MB. Linux: writing 5 to /proc/self/clear_refs resets the peak (VmHWM)."""

    def status(field: str) -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"{field} not in /proc/self/status")

    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    yield lambda: status("VmHWM") - before


def timed(fn, repeat: int = 3) -> tuple[float, list[float]]:
    """Median wall time of ``fn()`` over ``repeat`` runs (and all runs)."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), runs


def psql(pg: LocalPostgres, command: str, dbname: str = "postgres", stdout=subprocess.DEVNULL) -> None:
    """Run a command through psql (the raw baseline: no Python in the data path)."""
    env = {**os.environ, "PGPASSWORD": pg.password}
    subprocess.run([str(pg.bindir / "psql"), "-X", "-q", "-h", pg.host, "-p", str(pg.port), "-U", pg.superuser,
                    "-d", dbname, "-c", command], check=True, stdout=stdout, env=env)


def report(rows: list[tuple[str, float, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    for name, seconds, note in rows:
        print(f"{name:<{width}}  {seconds:8.2f} s  {note}")
