"""Chunked initial load vs raw COPY and the exported snapshot, one table, one run.

    .venv/bin/python bench/bench_chunked_load.py --rows 5000000 --chunk-rows 100000

Reports, in the same run: raw ``COPY t TO STDOUT`` through psql, the exported-snapshot sync (one
ctid worker), and the chunked load (``snapshot_mode="chunked"``) into staging, each as seconds and
× raw; how long each holds a transaction (so the primary's xmin horizon) open: the exported sync
for its whole copy, the chunked load at most one chunk's read (``pg_stat_activity.xact_start`` of
the loader, sampled inside every chunk), with that transaction's xmin age in transaction ids while a
writer commits one transaction every few milliseconds; and the resume after a kill at 50% (a
subprocess SIGKILLs itself after half the chunks are staged; the re-run is timed and must copy no
staged chunk again). Staging only: the apply of the chunks (a MERGE per chunk) is not timed here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from psycopg2 import sql

from common import cluster, psql, report, timed

from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks  # noqa: E402
from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync  # noqa: E402
from airflow_provider_pglogical.capture.chunked.progress import read_load  # noqa: E402
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402

TABLE = """
CREATE TABLE bench(id bigint PRIMARY KEY, customer int, status text, total numeric(12,2),
                   created timestamptz, note text, flag bool);
INSERT INTO bench SELECT g, g % 100000, (ARRAY['new','paid','shipped'])[1 + g % 3], (g % 100000) / 100.0,
       timestamptz '2024-01-01' + g * interval '1 second', md5(g::text), g % 2 = 0
  FROM generate_series(1, {rows}) g;
CREATE TABLE ticks(n bigint);
"""

KILLED = """
import os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
from airflow.sdk import ObjectStoragePath
from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
half = int(os.environ["HALF"])
def staged(event):
    if event.chunk + 1 >= half:
        os.kill(os.getpid(), 9)
run_chunked_sync(PgLogicalHook(postgres_conn_id="benchchunk"), slot=os.environ["SLOT"], publications=["pub"],
                 root=ObjectStoragePath(os.environ["ROOT"]), pipeline="bench", chunk_rows=int(os.environ["CHUNK_ROWS"]),
                 report=lambda m: None, hooks=ChunkHooks(staged=staged))
"""


class Ticker:
    """A writer committing one tiny transaction after another, so xids advance during the load."""

    def __init__(self, pg) -> None:
        self.pg, self.stop = pg, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import psycopg2
        conn = psycopg2.connect(self.pg.connection_uri())
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute("INSERT INTO ticks VALUES (txid_current())")
                time.sleep(0.005)
        conn.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--chunk-rows", type=int, default=100_000)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.chunk_rows = 3000, 500
    with cluster("benchchunk") as pg:
        pg.execute(sql.SQL(TABLE).format(rows=sql.Literal(args.rows)))
        pg.execute("VACUUM ANALYZE bench")
        pg.execute("CREATE PUBLICATION pub FOR TABLE bench")
        hook = PgLogicalHook(postgres_conn_id="benchchunk")
        results: list[tuple[str, float, str]] = []
        raw, _ = timed(lambda: psql(pg, "COPY bench TO STDOUT"), 1)
        results.append(("raw COPY TO STDOUT (psql > /dev/null)", raw, "1.00x raw"))

        def staging_root() -> tuple[str, ObjectStoragePath]:
            directory = tempfile.mkdtemp(prefix="bench-chunked-")
            return directory, ObjectStoragePath(f"file://{directory}")

        with Ticker(pg):
            directory, root = staging_root()
            slot = f"bench_{uuid.uuid4().hex[:8]}"
            started = time.monotonic()
            run_initial_sync(hook, slot=slot, publications=["pub"], root=root, pipeline="bench", parallelism=1,
                             report=lambda m: None)
            exported = time.monotonic() - started
            hook.drop_slot(slot)
            shutil.rmtree(directory, ignore_errors=True)
            results.append(("exported snapshot sync, 1 ctid worker", exported,
                            f"{raw / exported:.2f}x raw  one transaction open {exported:.2f} s"))

            samples: list[tuple[float, int]] = []
            first_low: list[float] = []

            def sample(event) -> None:
                samples.append(pg.query("SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8, "
                                        "age(backend_xmin) FROM pg_stat_activity WHERE pid = %s", params=(event.pid,))[0])

            directory, root = staging_root()
            slot = f"bench_{uuid.uuid4().hex[:8]}"
            lines: list[str] = []
            started = time.monotonic()
            run_chunked_sync(hook, slot=slot, publications=["pub"], root=root, pipeline="bench",
                             chunk_rows=args.chunk_rows, report=lines.append,
                             hooks=ChunkHooks(read=sample, low=lambda e: first_low or first_low.append(time.monotonic())))
            chunked = time.monotonic() - started
            chunk_phase = time.monotonic() - first_low[0]
            chunks = read_load(root, "bench").chunks
            hook.drop_slot(slot)
            shutil.rmtree(directory, ignore_errors=True)
        longest, age = max(s[0] for s in samples), max(s[1] for s in samples)
        results.append((f"chunked load, {args.chunk_rows:,} rows per chunk ({chunks} chunks)", chunked,
                        f"{raw / chunked:.2f}x raw  {args.rows / chunked:,.0f} rows/s; its chunks alone {chunk_phase:.2f} s "
                        f"({raw / chunk_phase:.2f}x raw; the rest is the slot's creation); longest transaction "
                        f"{longest:.2f} s, oldest xmin age {age} xids"))
        print("progress lines:", *lines[-2:], sep="\n  ")

        directory, root = staging_root()
        slot = f"bench_{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "BENCH_DIR": os.path.dirname(os.path.abspath(__file__)), "SLOT": slot,
               "ROOT": str(root), "CHUNK_ROWS": str(args.chunk_rows), "HALF": str(max(1, chunks // 2))}
        killed = subprocess.run([sys.executable, "-c", KILLED], env=env, timeout=3600)
        assert killed.returncode == -9, f"the load was not killed at 50% (exit {killed.returncode})"
        before = read_load(root, "bench")
        copied: list[int] = []
        started = time.monotonic()
        run_chunked_sync(hook, slot=slot, publications=["pub"], root=root, pipeline="bench", chunk_rows=args.chunk_rows,
                         report=lambda m: None, hooks=ChunkHooks(low=lambda e: copied.append(e.chunk)))
        resumed = time.monotonic() - started
        after = read_load(root, "bench")
        hook.drop_slot(slot)
        shutil.rmtree(directory, ignore_errors=True)
        staged_before = before.chunks + (1 if after.chunks > before.chunks + len(copied) else 0)
        assert after.complete and after.rows == args.rows and min(copied) >= staged_before, (before, copied)
        results.append((f"resume after a kill at 50% ({staged_before} of {after.chunks} chunks staged)", resumed,
                        f"{resumed / chunked:.2f}x the whole chunked load; {len(copied)} chunks copied, "
                        "none of them again"))
        print(f"rows: {args.rows:,}; one run each; a writer commits every ~5 ms during the two loads")
        report(results)
        print(json.dumps({"raw": raw, "exported": exported, "chunked": chunked, "chunk_phase": chunk_phase, "resumed": resumed,
                          "longest_transaction": longest, "xmin_age": age, "chunks": chunks}))
        print("chunked load vs raw COPY:", f"{raw / chunked:.2f}x (its chunks alone {raw / chunk_phase:.2f}x)")


if __name__ == "__main__":
    main()
