"""Freshness judged by Iceberg's own snapshots, not by the pipeline's history (issue 51).

The writer commits marker rows: it updates one of ``MARKERS`` rows of the source's ``events``
table (ids from ``MARKER_BASE``) to ``m<seq>``, one commit per sequence number, round robin. A
commit ``seq`` is held by a snapshot when its marker row reads ``m<seq'>`` with ``seq' >= seq``
there (a row's later commits come in order). Its freshness is the commit timestamp of the first
snapshot of the Iceberg table that holds it, minus the commit's time.

The judge reads the table's snapshots while the run goes (housekeeping expires snapshots after an
hour, and their files with them): for each new snapshot, the marker rows of the data files it
added (a row's value changes only where a snapshot adds a file holding it). Every ``verify_every``
seconds it checks that reconstruction against a real time-travel read of the newest snapshot
(pyiceberg's ``scan(snapshot_id=…)``, deletes applied): the two must agree row for row, or the
judge fails. Cheap enough to run beside the pipeline on 2 cores, unlike a full scan per snapshot.
"""

from __future__ import annotations

import bisect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

#: marker rows of the source's events table: ids, count, and the day they live on (a partition)
MARKER_BASE = 900_000_000
MARKERS = 600
MARKER_DAY = "2026-12-31"


def create_markers(connection) -> None:
    """Insert the marker rows (before the initial snapshot, so it copies them)."""
    with connection.cursor() as cur:
        cur.execute("INSERT INTO events (id, day, kind, payload) SELECT %s + g, %s, 'm-1', '{}' "
                    "FROM generate_series(0, %s) g", (MARKER_BASE, MARKER_DAY, MARKERS - 1))
    connection.commit()


def mark(cursor, seq: int) -> None:
    """The writer's commit ``seq``: one UPDATE of its marker row (the caller commits)."""
    cursor.execute("UPDATE events SET kind = %s WHERE id = %s AND day = %s",
                   (f"m{seq}", MARKER_BASE + seq % MARKERS, MARKER_DAY))


def seq_of(kind: str | None) -> int:
    return int(kind[1:]) if kind and kind.startswith("m") else -1


@dataclass
class SnapshotJudge:
    """Reads the Iceberg table at ``table_dir`` (a Hadoop-catalog table) snapshot by snapshot."""

    table_dir: Path
    verify_every: float = 300.0
    #: per snapshot in commit order: (commit time in epoch seconds, snapshot id)
    snapshots: list[tuple[float, int]] = field(default_factory=list)
    #: per marker row (0..MARKERS-1): ascending (first time seen, seq) — when each value first appeared
    history: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    visible: dict[int, int] = field(default_factory=dict)
    verified: int = 0
    read_seconds: float = 0.0
    _seen: set[int] = field(default_factory=set)
    _last_verify: float = 0.0

    def _table(self):
        from pyiceberg.table import StaticTable

        metadata = self.table_dir / "metadata"
        version = int((metadata / "version-hint.text").read_text().strip())
        for candidate in range(version + 5, version - 1, -1):  # the hint can lag a commit behind
            path = metadata / f"v{candidate}.metadata.json"
            if path.exists():
                return StaticTable.from_metadata(str(path))
        raise FileNotFoundError(f"no metadata file at or after v{version} under {metadata}")

    def poll(self) -> None:
        """Read the snapshots committed since the last poll (a commit racing the read: next poll)."""
        started = time.monotonic()
        try:
            table = self._table()
        except (FileNotFoundError, ValueError, json.JSONDecodeError):
            return
        new = sorted((s for s in table.metadata.snapshots if s.snapshot_id not in self._seen),
                     key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
        for snapshot in new:
            at = snapshot.timestamp_ms / 1000.0
            for row, seq in self._added_markers(table, snapshot):
                if seq > self.visible.get(row, -1):
                    self.visible[row] = seq
                    self.history.setdefault(row, []).append((at, seq))
            self._seen.add(snapshot.snapshot_id)
            self.snapshots.append((at, snapshot.snapshot_id))
        if new and time.monotonic() - self._last_verify >= self.verify_every:
            self.verify(table, new[-1])
            self._last_verify = time.monotonic()
        self.read_seconds += time.monotonic() - started

    def _added_markers(self, table, snapshot) -> list[tuple[int, int]]:
        """(marker row, seq) of every marker row in the data files ``snapshot`` added."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

        out = []
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if (entry.status != ManifestEntryStatus.ADDED or entry.snapshot_id != snapshot.snapshot_id
                        or entry.data_file.content != DataFileContent.DATA):
                    continue
                path = entry.data_file.file_path.removeprefix("file:").removeprefix("//")
                rows = pq.read_table(path, columns=["id", "kind"])
                rows = rows.filter(pc.greater_equal(rows["id"], MARKER_BASE))
                out += [(i - MARKER_BASE, seq_of(k)) for i, k in zip(rows["id"].to_pylist(), rows["kind"].to_pylist())]
        return out

    def verify(self, table, snapshot) -> None:
        """A time-travel read of ``snapshot`` must show what the judge reconstructed at it."""
        from pyiceberg.expressions import GreaterThanOrEqual

        at = snapshot.timestamp_ms / 1000.0
        arrow = table.scan(snapshot_id=snapshot.snapshot_id, row_filter=GreaterThanOrEqual("id", MARKER_BASE),
                           selected_fields=("id", "kind")).to_arrow()
        read = {i - MARKER_BASE: seq_of(k) for i, k in zip(arrow["id"].to_pylist(), arrow["kind"].to_pylist())}
        expected = {row: self.value_at(row, at) for row in range(MARKERS)}
        if read != expected:
            wrong = sorted(row for row in expected if read.get(row) != expected[row])[:5]
            raise SystemExit(f"snapshot judge: snapshot {snapshot.snapshot_id} read by time travel differs from the "
                             f"reconstruction at rows {wrong}: {[(read.get(r), expected[r]) for r in wrong]}")
        self.verified += 1

    def value_at(self, row: int, at: float) -> int:
        """The seq marker row ``row`` held at time ``at`` (-1: the initial value)."""
        values = self.history.get(row, [])
        index = bisect.bisect_right(values, (at, float("inf"))) - 1
        return values[index][1] if index >= 0 else -1

    def held_at(self, seq: int) -> float | None:
        """The commit time of the first snapshot that holds commit ``seq`` (None: none yet)."""
        for at, value in self.history.get(seq % MARKERS, []):
            if value >= seq:
                return at
        return None

    def freshness(self, commits: list[tuple[float, int]]) -> list[float | None]:
        """Per (commit time, seq): seconds until the first snapshot holding it (None: not yet held)."""
        out = []
        for committed, seq in commits:
            at = self.held_at(seq)
            out.append(None if at is None else max(0.0, at - committed))
        return out


def events_table(warehouse: Path, namespace: str = "shop") -> Path:
    """The Hadoop-catalog directory of the events table's Iceberg table."""
    candidates = sorted(p for p in (warehouse / namespace).glob("*events*") if (p / "metadata").is_dir())
    if not candidates:
        raise FileNotFoundError(f"no events table under {warehouse / namespace}")
    return candidates[0]
