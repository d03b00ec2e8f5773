"""Micro-benchmark of the pgoutput decoder and the change assembly (pure Python).

    python bench/bench_decoder.py [--messages 1000000] [--txn-size 10]

Input: synthetic Insert messages shaped like captured ones of a 7-column table (int id, text
name, int qty, numeric price, enum mood, timestamptz, nullable text; ~100 bytes each), built with
the same byte layout PostgreSQL 15 sends. Reports microseconds per message for:

* ``decode``: ``PgOutputDecoder.decode`` over bytes, with Python's cyclic GC on and paused;
* ``decode(memoryview)``: the same over memoryviews (what psycopg2 returns for bytea);
* ``assemble``: ``ChangeAssembler.feed`` over ``(lsn, xid, data)`` rows, Begin/Commit around every
  ``--txn-size`` inserts (the GC is paused inside ``feed``);
CPU time (``time.process_time``), best of ``--repeat`` runs, is what counts: wall time and single
runs on a shared machine are noisy. Two references calibrate the machine: a bare loop, and slicing
seven values at fixed offsets into a kept tuple (the floor of any pure-Python decoder).

* ``values as bytes`` vs ``values as str`` (why the decoder returns bytes): the tuple parser as
  shipped vs the same parser decoding every text value, each followed by building Arrow string
  columns (from bytes: ``binary`` then a UTF-8-validating cast to ``string``).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_pglogical.decoding import tuples, wire  # noqa: E402
from airflow_provider_pglogical.decoding.assembler import ChangeAssembler  # noqa: E402
from airflow_provider_pglogical.decoding.pgoutput import PgOutputDecoder  # noqa: E402

RELATION_OID = 16393


def insert_message(i: int, rnd: random.Random) -> bytes:
    values = [
        str(i),
        f"customer-{rnd.randint(0, 99999)}",
        str(rnd.randint(1, 500)),
        f"{rnd.randint(0, 9999)}.{rnd.randint(0, 99):02d}",
        rnd.choice(["sad", "ok", "happy"]),
        f"2024-01-{rnd.randint(1, 28):02d} 12:{rnd.randint(0, 59):02d}:{rnd.randint(0, 59):02d}."
        f"{rnd.randint(0, 999999):06d}+00",
        None if rnd.random() < 0.3 else "note " * rnd.randint(1, 6),
    ]
    return wire.write_insert(RELATION_OID, values)


def relation_message() -> bytes:
    columns = [("id", 23), ("name", 25), ("qty", 23), ("price", 1700), ("mood", 16386),
               ("created", 1184), ("note", 25)]
    return wire.write_relation(RELATION_OID, "public", "orders",
                               [(1 if n == 0 else 0, name, oid, -1) for n, (name, oid) in enumerate(columns)])


def rows_with_transactions(inserts: list[bytes], txn_size: int) -> list[tuple[str, str, bytes]]:
    rows: list[tuple[str, str, bytes]] = []
    lsn = 0x1000000
    for start in range(0, len(inserts), txn_size):
        xid = 1000 + start
        rows.append(("0/1", str(xid), wire.write_begin(lsn + 100, 0, xid)))
        if start == 0:
            rows.append(("0/1", str(xid), relation_message()))
        rows.extend(("0/1", str(xid), m) for m in inserts[start:start + txn_size])
        rows.append(("0/1", str(xid), wire.write_commit(lsn + 100, lsn + 148, 0)))
        lsn += 200
    return rows


REPEAT = 3


def timed(label: str, n: int, fn: Callable[[], object], *, gc_paused: bool = False) -> float:
    """Best CPU time of REPEAT runs (the machine is shared: wall time and single runs are noisy)."""
    best_cpu = best_wall = float("inf")
    for _ in range(REPEAT):
        gc.collect()
        if gc_paused:
            gc.disable()
        try:
            start, cpu_start = time.perf_counter(), time.process_time()
            result = fn()
            cpu, wall = time.process_time() - cpu_start, time.perf_counter() - start
        finally:
            gc.enable()
        del result
        best_cpu, best_wall = min(best_cpu, cpu), min(best_wall, wall)
    print(f"{label:52s} cpu {best_cpu:6.3f} s {best_cpu / n * 1e6:6.3f} us/msg   (wall {best_wall:6.3f} s)")
    return best_cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--txn-size", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    global REPEAT
    REPEAT = args.repeat
    n = args.messages
    rnd = random.Random(42)
    inserts = [insert_message(i, rnd) for i in range(n)]
    print(f"{n} Insert messages, 7 columns, {sum(map(len, inserts)) / n:.0f} bytes on average, "
          f"Python {sys.version.split()[0]}")

    def decode_all(messages: list) -> list:
        decode = PgOutputDecoder(1).decode
        return [decode(m) for m in messages]

    def slice_only(messages: list[bytes]) -> list:
        """The floor: seven slices at fixed offsets into a kept tuple, no parsing at all."""
        return [(m[8:12], m[13:20], m[21:25], m[26:30], m[31:35], m[36:40], m[41:45]) for m in messages]

    timed("reference: bare loop", n, lambda: [None for _ in inserts], gc_paused=True)
    timed("reference: slice 7 values, no parsing", n, lambda: slice_only(inserts), gc_paused=True)
    timed("decode (bytes, GC on)", n, lambda: decode_all(inserts))
    timed("decode (bytes, GC paused)", n, lambda: decode_all(inserts), gc_paused=True)
    views = [memoryview(m) for m in inserts]
    timed("decode (memoryview, GC paused)", n, lambda: decode_all(views), gc_paused=True)

    rows = rows_with_transactions(inserts, args.txn_size)
    timed(f"assemble {len(rows)} rows, {args.txn_size} inserts/txn (GC paused)", len(rows),
          lambda: ChangeAssembler(1).feed(rows))
    updates = rows_with_transactions([wire.UPDATE + m[1:] for m in inserts], args.txn_size)
    timed(f"assemble {len(updates)} rows of UPDATEs, {args.txn_size}/txn (GC paused)", len(updates),
          lambda: ChangeAssembler(1).feed(updates))
    single = rows_with_transactions(inserts[: n // 3], 1)
    timed(f"assemble {len(single)} rows, 1 insert/txn (GC paused)", len(single),
          lambda: ChangeAssembler(1).feed(single))

    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover
        return
    # Why values are bytes: the same generated parser with ``.decode()`` on every text value
    # (what returning str would cost), each followed by building the Arrow string columns.
    str_parser = tuples._compile(
        "str parser", ["def generated(buf, pos):",
                       *[line.replace("buf[pos:pos + length]", "buf[pos:pos + length].decode()")
                         for line in tuples._column_code(7)],
                       "    return values, pos, rare"])
    bytes_parser = tuples.tuple_parser(7)
    pad = tuples.PAD
    t_bytes = timed("values as bytes: parse", n, lambda: [bytes_parser(m + pad, 8)[0] for m in inserts],
                    gc_paused=True)
    t_str = timed("values as str: parse", n, lambda: [str_parser(m + pad, 8)[0] for m in inserts],
                  gc_paused=True)
    bytes_columns = list(zip(*(bytes_parser(m + pad, 8)[0] for m in inserts), strict=True))
    str_columns = list(zip(*(str_parser(m + pad, 8)[0] for m in inserts), strict=True))
    t_bytes += timed("values as bytes: Arrow string columns (binary+cast)", n,
                     lambda: [pa.array(c, pa.binary()).cast(pa.string()) for c in bytes_columns], gc_paused=True)
    t_str += timed("values as str: Arrow string columns", n,
                   lambda: [pa.array(c, pa.string()) for c in str_columns], gc_paused=True)
    print(f"end to end, str costs {(t_str - t_bytes) / n * 1e6:+.3f} us/message more than bytes")


if __name__ == "__main__":
    main()
