"""The pipeline's own record of what it created and where it stands, kept under staging.

``<root>/<pipeline>/_pipeline.json`` names the slot the pipeline created, with the slot's plugin,
database and creation LSN (its consistent point), the publications it snapshotted, and its state:

- ``snapshotting``: the slot exists and the initial snapshot is being copied; nothing may pull.
- ``streaming``: the initial snapshot batch is committed; pulls continue it.

The record is written only *after* the slot exists, so an attempt that failed earlier leaves no
claim on a slot name that another tool may later take. A slot is the pipeline's only when the
record names it and the live slot still has the recorded plugin and database, and, while the
snapshot is unfinished, a confirmed position equal to the recorded creation LSN (nothing has
consumed it since): only then may the initial sync drop and recreate it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Sequence

from airflow_provider_pglogical.replication.lsn import Lsn
from airflow_provider_pglogical.replication.slots import SlotInfo
from airflow_provider_pglogical.replication.staging import StagingPath

RECORD = "_pipeline.json"
SNAPSHOTTING = "snapshotting"
STREAMING = "streaming"


@dataclass
class PipelineRecord:
    slot: str
    plugin: str
    database: str
    created_lsn: str
    publications: list[str]
    state: str = SNAPSHOTTING
    #: the committed initial snapshot batch (state ``streaming``)
    snapshot_batch: str | None = None
    extra: dict = field(default_factory=dict)

    def same_publications(self, publications: Sequence[str]) -> bool:
        return sorted(set(self.publications)) == sorted(set(publications))

    def created(self, slot: SlotInfo) -> bool:
        """Whether ``slot`` is provably the one this record describes, still unconsumed."""
        return (
            slot.name == self.slot and slot.plugin == self.plugin and slot.database == self.database
            and slot.slot_type == "logical" and slot.confirmed_flush_lsn == Lsn.parse(self.created_lsn)
        )


def read_record(root: StagingPath, pipeline: str) -> PipelineRecord | None:
    path = root / pipeline / RECORD
    if not path.exists():
        return None
    with path.open("rb") as fh:
        raw = json.loads(fh.read().decode())
    if "plugin" not in raw:  # a record of an older version: it named the slot only
        return None
    return PipelineRecord(**raw)


def write_record(root: StagingPath, pipeline: str, record: PipelineRecord) -> None:
    """Write the record through a temporary name and a rename, so readers never see half of it."""
    directory = root / pipeline
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (RECORD + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(json.dumps(asdict(record), indent=1, sort_keys=True).encode())
    tmp.rename(directory / RECORD)
