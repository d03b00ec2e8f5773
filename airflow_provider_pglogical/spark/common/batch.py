"""A staged batch as the jobs list it: its name, LSN range, kind and (once read) its manifest.

In ``common/`` because the listing (``hadoop_files.py``) makes them and the plan (``apply/plan.py``)
orders them: both import it, neither imports the other's package.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_pglogical.staging.contract import parse_batch_name
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest


@dataclass
class Batch:
    name: str
    start: int
    end: int
    kind: str
    #: its manifest, typed; None until read
    manifest: BatchManifest | None = None
    #: when its manifest was written (ms since the epoch; from the listing, None when unknown)
    committed_ms: int | None = None

    @classmethod
    def parse(cls, name: str) -> "Batch | None":
        parsed = parse_batch_name(name)
        return cls(name, *parsed) if parsed else None
