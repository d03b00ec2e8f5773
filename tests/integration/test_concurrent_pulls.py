"""N pulls of one slot at once, over a steady workload: every change staged exactly once.

A manual ``airflow tasks test`` beside the schedule, or a second DAG, used to stage overlapping
batches and let the slot move past changes that reached no batch. The consumer lock serialises
them: batches never overlap, and the staged rows equal the source's, each once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.staging.batches import read_table

PULLERS = 3
TRANSACTIONS = 200
ROWS_PER_TRANSACTION = 10
#: transactions written before waiting for a pull to stage them
CHUNK = 10

PULLER = """
import json, sys
from pathlib import Path
from airflow.sdk import ObjectStoragePath
from airflow_provider_pglogical.exceptions import ConcurrentRunError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.capture.pull import run_pull

conn_id, root, stop, out = sys.argv[1:5]
hook, pulls, refused = PgLogicalHook(postgres_conn_id=conn_id), 0, 0
Path(out + ".ready").touch()
while not Path(stop).exists():
    try:
        run_pull(hook, slot="s1", publications=["p"], root=ObjectStoragePath(root), pipeline="p",
                 max_changes=300, lock_wait_seconds=30, report=lambda message: None)
        pulls += 1
    except ConcurrentRunError:
        refused += 1
Path(out).write_text(json.dumps({"pulls": pulls, "refused": refused}))
"""


def test_parallel_pulls_of_one_slot_stage_every_change_exactly_once(publisher, publisher_hook, tmp_path: Path):
    publisher.execute("CREATE TABLE w(id int PRIMARY KEY, v text)")
    publisher_hook.create_publication("p", [PublishedTable("w")])
    root = ObjectStoragePath((tmp_path / "staging").as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")
    stop = tmp_path / "stop"
    pullers = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(PULLER), publisher.conn_id,
                          (tmp_path / "staging").as_uri(), str(stop), str(tmp_path / f"puller{i}.json")],
                         env=dict(os.environ), cwd=Path(__file__).resolve().parents[2])
        for i in range(PULLERS)
    ]
    try:
        for i in range(PULLERS):
            wait_until(lambda: Path(f"{tmp_path}/puller{i}.json.ready").exists(), timeout=120,
                       message=f"puller {i} to start")
        conn = publisher.connect()
        with conn.cursor() as cursor:  # the steady workload, one transaction at a time
            for t in range(TRANSACTIONS):
                first = t * ROWS_PER_TRANSACTION + 1
                cursor.execute("INSERT INTO w SELECT g, 'v' || g FROM generate_series(%s, %s) g",
                               (first, first + ROWS_PER_TRANSACTION - 1))
                if t % CHUNK == CHUNK - 1:  # let the pullers stage it before going on: pulls interleave
                    staged = len(committed_batches(root, "p"))
                    wait_until(lambda: len(committed_batches(root, "p")) > staged, timeout=120,
                               message="a puller to stage the workload so far")
        conn.close()
    finally:
        stop.touch()
        codes = [proc.wait(timeout=300) for proc in pullers]
    assert codes == [0] * PULLERS
    outcomes = [json.loads((tmp_path / f"puller{i}.json").read_text()) for i in range(PULLERS)]
    assert sum(o["pulls"] for o in outcomes) > PULLERS, outcomes  # they really ran side by side
    run_pull(publisher_hook, slot="s1", publications=["p"], root=root, pipeline="p")  # whatever is left

    batches = [(name, start, end) for name, start, end, kind in committed_batches(root, "p") if kind == "changes"]
    for (_n1, _s1, end), (name, start, _e2) in zip(batches, batches[1:]):
        assert start >= end, f"batch {name} overlaps the one before it"
    staged: Counter = Counter()
    for name, _start, _end in batches:
        manifest = read_manifest(root, "p", name)
        if "public.w" in manifest.tables:
            rows = read_table(root, "p", name, manifest.tables["public.w"]).to_pydict()
            staged.update((op, i, v) for op, i, v in zip(rows["_op"], rows["id"], rows["v"]))
    expected = Counter(("I", i, f"v{i}") for i in range(1, TRANSACTIONS * ROWS_PER_TRANSACTION + 1))
    assert staged == expected, (sum(staged.values()), len(staged - expected), len(expected - staged))
    assert publisher_hook.get_slot("s1").confirmed_flush_lsn >= batches[-1][2]
