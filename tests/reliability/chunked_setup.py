"""The reliability harness's chunked set-up: the initial load with ``snapshot_mode="chunked"``,
killed inside a chunk and inside a keyless table's whole copy while the workload writes, each time
resumed with the same slot (kill point ``chunked_load_mid_chunk``); the rounds after it compare
with the native subscriber as always."""

from __future__ import annotations

import json
import threading

from airflow_provider_pglogical.capture.chunked.chunks import ChunkHooks
from airflow_provider_pglogical.capture.chunked.load import run_chunked_sync
from airflow_provider_pglogical.capture.chunked.progress import read_load
from tests.reliability.harness import CHUNK_ROWS, CHUNKED_KILL_AT_READ, CHUNKED_KILL_TABLE, PIPELINE, SLOT, Harness
from tests.reliability.workload import TYPE_OVERRIDES


def chunked_load(harness: Harness, kill: bool, changes: int = 300) -> None:
    """Killed twice (``kill``), each time while ``changes`` are written from another session: inside
    the load's n-th chunk read, then, resumed, inside the whole copy of the keyless ``bag``
    (duplicate rows); then resumed to the end while the first three chunks' low watermarks each
    write ``changes // 3`` more. The keyless tables (``audit``, ``bag``) and keys that cannot bound
    a range are loaded whole. A fixed number of changes either way: the seed issues the same SQL,
    only its interleaving with the load varies."""
    killed = []
    for target in ({"KILL_AT_READ": CHUNKED_KILL_AT_READ}, {"KILL_TABLE": CHUNKED_KILL_TABLE}) if kill else ():
        done: list = []
        writer = threading.Thread(target=lambda: done.append(harness.workload.run(changes)), daemon=True)
        writer.start()
        note = harness.workdir / "logs" / "chunked-kill.json"
        hit = harness.killed_subprocess("chunked_load_mid_chunk", CHUNK_ROWS=CHUNK_ROWS, KILL_NOTE=note, **target)
        writer.join(timeout=600)
        if writer.is_alive() or not done:
            harness.fail("the workload's writes beside the killed chunked load did not finish")
        harness.figures.counts.add(done[0])
        staged = read_load(harness.root, PIPELINE)
        if not hit or staged is None or staged.complete:
            harness.fail(f"the chunked load was not killed mid-way ({target}): {staged}")
        at = json.loads(note.read_text())
        whole = staged.tables[at["table"]].whole
        killed.append(f"{at['table']}'s " + ("whole copy" if whole else f"chunk {at['chunk']}"))
    writes = [3]  # the first low watermarks of the resumed load write inside the load, the rest none

    def low(event) -> None:
        if writes[0]:
            writes[0] -= 1
            harness.figures.counts.add(harness.workload.run(changes // 3))

    result = run_chunked_sync(harness.hook(), slot=SLOT, publications=harness.publications, root=harness.root,
                              pipeline=PIPELINE, chunk_rows=CHUNK_ROWS, type_overrides=TYPE_OVERRIDES,
                              report=lambda m: None, hooks=ChunkHooks(low=low))
    load = read_load(harness.root, PIPELINE)
    if not load.complete or writes[0]:
        harness.fail(f"the chunked load did not complete, or wrote under too few chunks: {load}, {result}")
    harness.figures.whole_tables = sorted(name for name, t in load.tables.items() if t.whole)
    harness.report(f"[seed {harness.seed}] chunked set-up: killed inside {', then '.join(killed) or 'nothing'}, "
                   f"resumed; {load.rows:,} rows in {load.chunks} chunks of {len(load.tables)} tables, loaded whole: "
                   + "; ".join(f"{name} ({load.tables[name].whole})" for name in harness.figures.whole_tables))
