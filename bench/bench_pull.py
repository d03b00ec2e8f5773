"""Pull benchmark: raw SQL peek vs pg_recvlogical vs our pull, on one 1M-change workload, one run.

    .venv/bin/python bench/bench_pull.py --changes 1000000 --repeat 3

1. Creates the slots first (one per consuming measurement), then writes the workload
   (``--changes`` inserts in transactions of ``--txn-size``), so every slot sees the same backlog.
2. Raw peek: ``SELECT count(*) FROM pg_logical_slot_peek_binary_changes(slot, NULL, NULL, …)``.
3. ``pg_recvlogical`` (the walsender) from a slot to /dev/null, up to the backlog's end LSN.
4. Ours: ``run_pull`` from a slot to a committed batch (decode + Arrow + Parquet + advance).
   Each is run ``--repeat`` times (a fresh slot for the consuming ones); medians are reported.
5. Windows: a second backlog of ``--window`` x ``--windows`` changes, written at a steady pace over
   ``--backlog-seconds`` (a long backlog builds up over time, and the server logs a
   running-transactions record every 15 s of activity), pulled in bounded windows: the cost of each
   window and how far the slot's restart_lsn lags behind confirmed_flush_lsn meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

from common import cluster, report

from airflow.sdk import ObjectStoragePath  # noqa: E402

from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook  # noqa: E402
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync  # noqa: E402
from airflow_provider_pglogical.capture.pull import run_pull  # noqa: E402

PEEK_COUNT = ("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
              " 'publication_names', 'pub')")


INSERT = ("INSERT INTO orders SELECT g, g %% 1000, 'new', g / 100.0, now(), md5(g::text), true"
          "  FROM generate_series(%s, %s) g")


def workload(pg, changes: int, txn_size: int, checkpoint_every: int = 0, *, seconds: float = 0.0,
             start_id: int = 0) -> None:
    """``changes`` inserts in transactions of ``txn_size``; spread evenly over ``seconds`` when
    given (a backlog building up in production), else as fast as possible."""
    pg.execute("CREATE TABLE IF NOT EXISTS orders(id bigint PRIMARY KEY, customer int, status text, total numeric(12,2),"
               " created timestamptz, note text, flag bool)")
    conn = pg.connect()
    began = time.monotonic()
    done = txns = 0
    try:
        with conn.cursor() as cur:
            while done < changes:
                n = min(txn_size, changes - done)
                cur.execute(INSERT, (start_id + done + 1, start_id + done + n))
                done += n
                txns += 1
                if checkpoint_every and txns % checkpoint_every == 0:
                    cur.execute("CHECKPOINT")  # also logs a running-xacts record, where restart_lsn can move
                ahead = began + seconds * done / changes - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--txn-size", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=100_000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--backlog-seconds", type=float, default=60.0,
                        help="write the windows' backlog over this long (0: as fast as possible)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="CHECKPOINT every N workload transactions (0: only what the server does itself)")
    args = parser.parse_args()
    with cluster("benchpull") as pg:
        pg.execute("CREATE TABLE orders(id bigint PRIMARY KEY, customer int, status text, total numeric(12,2),"
                   " created timestamptz, note text, flag bool); CREATE PUBLICATION pub FOR TABLE orders")
        hook = PgLogicalHook(postgres_conn_id="benchpull")
        recv_slots = [f"recv{i}" for i in range(args.repeat)]
        our_slots = [f"ours{i}" for i in range(args.repeat)]
        for slot in ["raw", *recv_slots]:
            hook.create_slot(slot)
        # a pull continues a pipeline's initial snapshot (of the still empty table): its slot, record and batch
        our_roots = [ObjectStoragePath(f"file://{tempfile.mkdtemp(prefix='bench-pull-')}") for _ in our_slots]
        for slot, root in zip(our_slots, our_roots):
            run_initial_sync(hook, slot=slot, publications=["pub"], root=root, pipeline="bench", report=lambda m: None)
        t0 = time.perf_counter()
        workload(pg, args.changes, args.txn_size, args.checkpoint_every)
        end_lsn = pg.query("SELECT pg_current_wal_flush_lsn()::text")[0][0]
        print(f"workload: {args.changes:,} inserts in transactions of {args.txn_size} "
              f"({time.perf_counter() - t0:.1f}s); WAL end {end_lsn}")

        raws, recvs, ours = [], [], []
        env = {**os.environ, "PGPASSWORD": pg.password}
        for i in range(args.repeat):
            t = time.perf_counter()
            (messages,) = pg.query(PEEK_COUNT, params=("raw",))[0]
            raws.append(time.perf_counter() - t)

            t = time.perf_counter()
            subprocess.run([str(pg.bindir / "pg_recvlogical"), "-h", pg.host, "-p", str(pg.port), "-U", pg.superuser,
                            "-d", "postgres", "--slot", recv_slots[i], "--start", "-o", "proto_version=1",
                            "-o", "publication_names=pub", "-E", end_lsn, "-f", "/dev/null", "--no-loop"],
                           check=True, env=env)
            recvs.append(time.perf_counter() - t)

            t = time.perf_counter()
            result = run_pull(hook, slot=our_slots[i], publications=["pub"], root=our_roots[i], pipeline="bench",
                              max_changes=messages + 10, report=lambda m: None)
            ours.append(time.perf_counter() - t)
            assert result["changes"] == args.changes, result
        raw, recv, our = (statistics.median(x) for x in (raws, recvs, ours))
        runs = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        report([
            ("raw SQL peek (count(*))", raw, f"{messages / raw:,.0f} messages/s  runs {runs(raws)}"),
            ("pg_recvlogical to /dev/null", recv, f"{messages / recv:,.0f} messages/s  runs {runs(recvs)}"),
            ("our pull to a committed batch", our, f"{messages / our:,.0f} messages/s  runs {runs(ours)}"),
        ])
        print(f"medians of {args.repeat}: ours vs raw peek: {raw / our:.2f}x the rate; "
              f"ours vs pg_recvlogical: {recv / our:.2f}x the rate")
        for slot in ["raw", *recv_slots, *our_slots]:
            hook.drop_slot(slot)

        root = ObjectStoragePath(f"file://{tempfile.mkdtemp(prefix='bench-windows-')}")
        run_initial_sync(hook, slot="windows", publications=["pub"], root=root, pipeline="bench",
                         report=lambda m: None)
        backlog = args.window * args.windows
        t0 = time.perf_counter()
        workload(pg, backlog, args.txn_size, seconds=args.backlog_seconds, start_id=args.changes)
        print(f"windows backlog: {backlog:,} inserts over {time.perf_counter() - t0:.0f}s")
        windows = []
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
