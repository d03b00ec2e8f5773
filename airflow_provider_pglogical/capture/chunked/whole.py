"""A table the chunked load cannot read in key chunks, loaded whole in an exported snapshot of its own.

A keyless table is a multiset: its changes carry no key (pgoutput sends no ctid), so they cannot
be attributed to a chunk, and DBLog's "the window's events win over the chunk's rows" has nothing
to match on. Such a table (and one whose key cannot bound a range, ``plan.whole_reason``) is
copied as PostgreSQL's own tablesync and this provider's backfill copy a table: a *temporary*
slot's exported snapshot and its consistent LSN ``C_t``, the table copied in that snapshot, a
snapshot batch at ``C_t`` (``backfill.stage_fresh_snapshot``, the backfill's own code). The apply
replaces the table at ``C_t`` and re-applies the changes committed at or after ``C_t``, which the
pipeline's slot (created at ``C`` <= ``C_t``) holds: exact for a multiset too.

The primary's xmin is held from the temporary slot's creation to the batch's commit: for that
one table's copy, not for the load. The batch is the table's one "chunk" in the progress record:
a done table is never copied again; a killed copy leaves a batch without a manifest, which the
resume removes (``progress.remove_unfinished_chunks``) before it copies the table again.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from airflow_provider_pglogical.capture import backfill
from airflow_provider_pglogical.capture.chunked.chunks import APPLICATION_NAME, ChunkEvent, ChunkHooks
from airflow_provider_pglogical.capture.chunked.plan import ChunkedTable
from airflow_provider_pglogical.capture.chunked.progress import CHUNK_DETAILS
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.staging.layout import BatchManifest, StagingPath

#: the temporary slots' name prefix (``pg_replication_slots`` shows which load holds one)
SLOT_PREFIX = "pglogical_chunked_whole"
#: connections copying a whole table at once (ctid ranges of the one snapshot): the faster the
#: copy, the shorter the xmin is held
PARALLELISM = 2


def copy_whole(connect_kwargs: Mapping[str, Any], chunked: ChunkedTable, number: int, root: StagingPath,
               pipeline: str, details: dict, loader_pid: int, hooks: ChunkHooks,
               type_overrides: Mapping[str, str] | None, report: Callable[[str], None]) -> tuple[int, str]:
    """Stage ``chunked``'s table whole as a snapshot batch at a temporary slot's consistent LSN;
    returns its rows and the batch's name. ``number``: its chunk number (0, or the next one when it
    replaces chunks of a column that changed); ``details``: the load's (as its chunks carry them).

    The hooks hear ``low`` once the snapshot is exported (``low`` is ``C_t``), ``read`` after the
    copy, inside the snapshot, before the commit, and ``staged`` after it; ``pid`` is the loader's
    session (which holds no snapshot here: the temporary slot's session and the copy's do)."""
    name = chunked.name
    content = {"table": name, "chunk": number, "start": None, "end": None, "whole": chunked.whole}
    at: dict[str, str] = {}

    def event(rows: int = 0) -> ChunkEvent:
        return ChunkEvent(name, number, None, None, loader_pid, rows, at.get("lsn"))

    def exported(lsn: Lsn) -> None:
        at["lsn"] = str(lsn)
        report(f"{name}: loading it whole in the exported snapshot of a temporary slot at {lsn} "
               f"({chunked.whole}); the primary's xmin is held until this table's copy is staged")
        hooks.low(event())

    def copied(manifest: BatchManifest, rows: dict[str, int]) -> None:
        hooks.read(event(rows.get(name, 0)))
        manifest.details[CHUNK_DETAILS] = {**details[CHUNK_DETAILS], **content, "rows": rows.get(name, 0),
                                           "low": at["lsn"], "high": at["lsn"]}

    manifest, rows = backfill.stage_fresh_snapshot(
        {**connect_kwargs, "application_name": APPLICATION_NAME}, [chunked.table], root, pipeline,
        {**details, "key_range": None}, slot_prefix=SLOT_PREFIX, parallelism=PARALLELISM,
        type_overrides=type_overrides, report=report, exported=exported, copied=copied)
    hooks.staged(event(rows.get(name, 0)))
    return rows.get(name, 0), manifest.name
