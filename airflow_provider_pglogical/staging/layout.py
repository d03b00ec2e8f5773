"""Staged batches: names, manifests and listing; the seam between capture and the Spark apply job.

A batch is ``<root>/<pipeline>/<start_lsn>-<end_lsn>-<kind>/`` (LSNs as 16 hex digits, so names
sort in LSN order whatever the kind) holding Parquet files per table and ``_manifest.json``,
written last through write-then-rename. A batch without a manifest does not exist: readers skip
it and writers may delete it.

Position semantics shared by both sides: a *position* P means "every transaction whose commit
LSN is < P is reflected, none at or after it". A change batch covers positions
``[start_lsn, end_lsn)``; a snapshot batch is a single position (``start_lsn == end_lsn``).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Protocol

from airflow_provider_pglogical.lsn import Lsn
# names, patterns and rules shared with the Spark job live in the stdlib-only contract module
from airflow_provider_pglogical.staging import contract, private_files
from airflow_provider_pglogical.staging.contract import MANIFEST
# the manifest's typed values, one set for capture and the Spark job (re-exported: the writers import them here)
from airflow_provider_pglogical.staging.seam.manifests import (  # noqa: F401
    BatchManifest,
    ChangeFacts,
    Column,
    FileEntry,
    TableManifest,
)


class StagingPath(Protocol):
    """What we need of a path: Airflow's ``ObjectStoragePath`` (file://, s3://, gs://, ...)."""

    def __truediv__(self, other: str) -> "StagingPath": ...
    def open(self, mode: str = ...) -> Any: ...
    def exists(self) -> bool: ...
    def iterdir(self) -> Iterator["StagingPath"]: ...
    def mkdir(self, parents: bool = ..., exist_ok: bool = ...) -> None: ...
    def rename(self, target: "StagingPath") -> Any: ...

    @property
    def name(self) -> str: ...


def batch_name(start: Lsn, end: Lsn, kind: str) -> str:
    return contract.format_batch_name(int(start), int(end), kind)


def parse_batch_name(name: str) -> tuple[Lsn, Lsn, str] | None:
    parsed = contract.parse_batch_name(name)
    return (Lsn(parsed[0]), Lsn(parsed[1]), parsed[2]) if parsed else None


def committed_batches(root: StagingPath, pipeline: str) -> list[tuple[str, Lsn, Lsn, str]]:
    """``(name, start, end, kind)`` of every committed batch, in LSN order."""
    directory = root / pipeline
    if not directory.exists():
        return []
    found = []
    for child in directory.iterdir():
        parsed = parse_batch_name(child.name)
        if parsed and (child / MANIFEST).exists():
            found.append((child.name, *parsed))
    return sorted(found, key=lambda row: row[0])


def read_manifest(root: StagingPath, pipeline: str, name: str) -> BatchManifest:
    with (root / pipeline / name / MANIFEST).open("rb") as fh:
        return BatchManifest.from_json(fh.read().decode())


def read_pipeline_file(root: StagingPath, pipeline: str, name: str) -> dict | None:
    """A small JSON file of the pipeline's (``<root>/<pipeline>/<name>``); None when there is none."""
    path = root / pipeline / name
    forget_cached_listing(path)
    if not path.exists():
        path = root / pipeline / (name + ".tmp")  # the Spark side was killed mid-replace: see hadoop_files
        if not path.exists():
            return None
    with path.open("rb") as fh:
        return json.loads(fh.read().decode())


def forget_cached_listing(path: StagingPath) -> None:
    """Drop what this process's object-store file system cached of ``path``'s directory. The Spark
    job rewrites the pipeline's files: s3fs would take a replaced file's old ETag from a listing
    cached earlier (a pull, an apply's pending batches) and fail to open it (``FileExpired``)."""
    fs = getattr(path, "fs", None)
    if fs is not None and hasattr(path, "path"):
        fs.invalidate_cache(path.path)


def write_pipeline_file(root: StagingPath, pipeline: str, name: str, data: dict) -> None:
    """Write it through a temporary name and a rename, so readers never see half of it."""
    directory = root / pipeline
    private_files.make_dirs(directory)
    tmp = directory / (name + ".tmp")
    with private_files.open_new(tmp) as fh:
        fh.write(json.dumps(data, indent=1, sort_keys=True).encode())
    tmp.rename(directory / name)

