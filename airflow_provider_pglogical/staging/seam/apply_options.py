"""What an apply does, as one value: built by ``IcebergApplyOperator``, read by ``spark/jobs/apply_changes.py``.

The operator writes it as one JSON argument of the job (``--options``); the job reads it back and
hands it whole to ``run`` and to each round. Adding an option is a field here (with its check in
:meth:`ApplyOptions.problems`), the operator's keyword, and its use in the job. No secret is an
option: credentials travel in the private properties file.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from airflow_provider_pglogical.staging.contract import (
    DEFAULT_APPLY_LEASE_SECONDS,
    DEFAULT_COMPACT_DELETES_AT,
    DEFAULT_CONCURRENCY,
    DEFAULT_FOLD_ROWS,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_RETENTION_HOURS,
    WRITE_MODES,
)


@dataclasses.dataclass(frozen=True)
class ApplyOptions:
    """One apply of one pipeline.

    :param staging_root: the staging root as Spark reads it (``file:///x``, ``s3a://b/x``).
    :param pipeline: the pipeline: its batches are under ``<staging_root>/<pipeline>/``.
    :param catalog: the Spark catalog name of the Iceberg catalog.
    :param namespace: the Iceberg namespace of the target tables.
    :param table_map: source ``schema.table`` -> target table; default ``<schema>__<table>``.
    :param write_mode: ``merge-on-read`` or ``copy-on-write`` for tables the apply creates.
    :param bucket_count: partition new tables by ``bucket(N, first key column)``.
    :param concurrency: how many tables apply their step of a round at once.
    :param retention_hours: remove applied batches committed longer ago than this; None keeps every batch.
    :param archive: move them under ``_archive/`` instead of deleting them.
    :param row_deltas: apply small batches as Iceberg row deltas the driver commits; False MERGEs every batch.
    :param lease_seconds: how long the run's lease lasts unless renewed (every third of it).
    :param lease_holder: who runs it, for another apply's error (an Airflow task instance).
    :param keep_running: seconds to keep the session and the lease after the first round, applying
        each newly committed batch; 0 applies once and ends.
    :param poll_interval: in such a window, seconds between two listings of the staging area.
    :param compact_deletes_at: compact each table the run wrote that holds this many delete files
        or more; 0 leaves them to housekeeping.
    :param until_loaded: end the window after the first round that leaves the pipeline's tables in
        the lakehouse; ``keep_running`` bounds the wait.
    :param format_version: the Iceberg format version of the tables the apply creates (2 or 3); an
        existing table of another version is refused before any write (``spark/apply/format_versions.py``).
    :param upgrade_format_version: upgrade existing tables of an older version to ``format_version``.
    :param log_level: Spark's log level inside the job.
    :param fold_rows: fold each table's consecutive pending change batches into one step of at most
        this many staged rows (``plan.fold_changes``); 0 applies one step per batch; None (the
        default) folds in a window (``keep_running``: the apply is behind when batches pile up
        between its polls) up to ``DEFAULT_FOLD_ROWS``, and not in a one-off apply.
    """

    staging_root: str
    pipeline: str
    catalog: str = "lake"
    namespace: str = "pglogical"
    table_map: dict[str, str] | None = None
    write_mode: str = "merge-on-read"
    bucket_count: int | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    retention_hours: float | None = DEFAULT_RETENTION_HOURS
    archive: bool = False
    row_deltas: bool = True
    lease_seconds: float = DEFAULT_APPLY_LEASE_SECONDS
    lease_holder: str | None = None
    keep_running: float = 0.0
    poll_interval: float = DEFAULT_POLL_INTERVAL
    compact_deletes_at: int = DEFAULT_COMPACT_DELETES_AT
    until_loaded: bool = False
    format_version: int = 2
    upgrade_format_version: bool = False
    log_level: str = "WARN"
    fold_rows: int | None = None

    def problems(self) -> list[str]:
        """What makes these options unusable, each naming the option and the fix (empty: usable)."""
        found = []
        if self.write_mode not in WRITE_MODES:
            found.append(f"write mode must be one of {WRITE_MODES}, not {self.write_mode!r}")
        if isinstance(self.compact_deletes_at, bool) or not isinstance(self.compact_deletes_at, int) \
                or self.compact_deletes_at < 0:
            found.append(f"compact_deletes_at must be 0 (off) or a number of delete files, not {self.compact_deletes_at!r}")
        if self.until_loaded and not self.keep_running:
            found.append("until_loaded waits for the initial snapshot: give keep_running, the most seconds to wait")
        if self.keep_running < 0:
            found.append(f"keep_running must be a positive number of seconds (0: apply once), not {self.keep_running}")
        if self.keep_running and self.poll_interval <= 0:
            found.append(f"poll_interval must be a positive number of seconds, not {self.poll_interval}")
        if self.concurrency < 1:
            found.append(f"concurrency must be 1 or more tables at once, not {self.concurrency}")
        if self.retention_hours is not None and self.retention_hours < 0:
            found.append(f"retention_hours must not be negative, not {self.retention_hours}; None keeps every batch")
        if self.fold_rows is not None and (isinstance(self.fold_rows, bool) or not isinstance(self.fold_rows, int)
                                           or self.fold_rows < 0):
            found.append(f"fold_rows must be 0 (one step per batch) or a number of staged rows, not {self.fold_rows!r}")
        if self.format_version not in (2, 3):
            found.append(f"format_version must be 2 (the default, read by every engine) or 3, not {self.format_version!r}")
        return found

    def folding(self) -> int:
        """The most staged rows one folded step holds (0: no folding); see ``fold_rows``."""
        if self.fold_rows is not None:
            return self.fold_rows
        return DEFAULT_FOLD_ROWS if self.keep_running else 0

    def replace(self, **changes: Any) -> ApplyOptions:
        """These options with ``changes``."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        """The options as the job's ``--options`` argument."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ApplyOptions:
        """Read :meth:`to_json`'s text; a field this version does not know is refused by name."""
        values = json.loads(text)
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"apply options {unknown} are unknown to this job (the job bundle and the operator "
                             "come from different versions of the provider): install one version on both sides")
        return cls(**values)
