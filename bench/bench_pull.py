"""Pull benchmark: raw SQL peek vs pg_recvlogical vs our pull, on one 1M-change workload, one run.

    .venv/bin/python bench/bench_pull.py --changes 1000000

1. Creates one slot per measurement, then writes the workload (``--changes`` inserts/updates in
   transactions of ``--txn-size``), so every slot sees the same backlog.
2. Raw peek: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(slot, NULL, NULL, …)``.
3. ``pg_recvlogical`` (the walsender) from the slot to /dev/null, up to the backlog's end LSN.
4. Ours: ``run_pull`` from the slot to a committed batch (decode + Arrow + Parquet + advance).
5. Windows: the same backlog pulled in bounded windows of ``--window`` changes; the cost of the
   1st and the 10th window, and the slot's restart_lsn lag behind confirmed_flush_lsn meanwhile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time

from common import cluster, report

from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.replication.pull import plugin_options, run_pull  # noqa: E402

OPTIONS = "'proto_version', '1', 'publication_names', 'pub'"


def workload(pg, changes: int, txn_size: int, checkpoint_every: int) -> None:
    pg.execute("CREATE TABLE IF NOT EXISTS orders(id bigint PRIMARY KEY, customer int, status text, total numeric(12,2),"
               " created timestamptz, note text, flag bool)")
    done = 0
    txns = 0
    while done < changes:
        n = min(txn_size, changes - done)
        pg.execute(
            f"INSERT INTO orders SELECT g, g % 1000, 'new', g / 100.0, now(), md5(g::text), true"
            f"  FROM generate_series({done + 1}, {done + n}) g"
        )
        done += n
        txns += 1
        if checkpoint_every and txns % checkpoint_every == 0:
            pg.execute("CHECKPOINT")  # also logs a running-xacts record, where restart_lsn can move


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--txn-size", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="CHECKPOINT every N workload transactions (0: only what the server does itself)")
    args = parser.parse_args()
    with cluster("benchpull") as pg:
        pg.execute("CREATE TABLE orders(id bigint PRIMARY KEY, customer int, status text, total numeric(12,2),"
                   " created timestamptz, note text, flag bool); CREATE PUBLICATION pub FOR TABLE orders")
        hook = PgLogicalHook(postgres_conn_id="benchpull")
        for slot in ("raw", "recv", "ours", "windows"):
            hook.create_slot(slot)
        t0 = time.perf_counter()
        workload(pg, args.changes, args.txn_size, args.checkpoint_every)
        end_lsn = pg.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]
        print(f"workload: {args.changes:,} inserts in transactions of {args.txn_size} "
              f"({time.perf_counter() - t0:.1f}s); WAL end {end_lsn}")

        t = time.perf_counter()
        (messages,) = pg.query(f"SELECT count(*) FROM pg_logical_slot_peek_binary_changes('raw', NULL, NULL, {OPTIONS})")[0]
        raw = time.perf_counter() - t

        env = {**os.environ, "PGPASSWORD": pg.password}
        t = time.perf_counter()
        subprocess.run([str(pg.bindir / "pg_recvlogical"), "-h", pg.host, "-p", str(pg.port), "-U", pg.superuser,
                        "-d", "postgres", "--slot", "recv", "--start", "-o", "proto_version=1",
                        "-o", "publication_names=pub", "-E", end_lsn, "-f", "/dev/null", "--no-loop"],
                       check=True, env=env)
        recv = time.perf_counter() - t

        root = ObjectStoragePath(f"file://{tempfile.mkdtemp(prefix='bench-pull-')}")
        t = time.perf_counter()
        result = run_pull(hook, slot="ours", publications=["pub"], root=root, pipeline="bench",
                          max_changes=messages + 10, report=lambda m: None)
        ours = time.perf_counter() - t
        assert result["changes"] == args.changes, result

        report([
            ("raw SQL peek (count(*))", raw, f"{messages / raw:,.0f} messages/s"),
            ("pg_recvlogical to /dev/null", recv, f"{messages / recv:,.0f} messages/s"),
            ("our pull to a committed batch", ours, f"{messages / ours:,.0f} messages/s"),
        ])
        print(f"ours vs raw peek: {raw / ours:.2f}x the rate; ours vs pg_recvlogical: {recv / ours:.2f}x the rate")

        windows = []
        root = ObjectStoragePath(f"file://{tempfile.mkdtemp(prefix='bench-windows-')}")
        while True:
            slot = hook.get_slot("windows")
            lag = slot.confirmed_flush_lsn - slot.restart_lsn
            t = time.perf_counter()
            result = run_pull(hook, slot="windows", publications=["pub"], root=root, pipeline="bench",
                              max_changes=args.window, report=lambda m: None)
            if result["batch"] is None:
                break
            windows.append((time.perf_counter() - t, result["changes"], lag))
        for i, (seconds, changes, lag) in enumerate(windows, 1):
            print(f"window {i:2d}: {seconds:6.2f} s, {changes:,} changes, restart_lsn {lag / 1e6:,.1f} MB behind")
        if len(windows) >= 10:
            print(f"10th window vs 1st: {windows[9][0] / windows[0][0]:.2f}x")


if __name__ == "__main__":
    main()
