"""A batch's manifest as typed values: what capture writes (``staging/batches.py``) and the Spark
jobs read (``spark/common/hadoop_files.py``), one set of types on both sides of the seam.

Standard library only: the jobs ship it in their bundle (``spark/launch.py``). :meth:`BatchManifest.from_json`
reads every manifest written so far: keys it does not know are kept (``extra``) and written back,
keys a manifest lacks take their defaults, and tables keyed before keys were quoted are re-keyed
(``contract.keyed_tables``). The free-form ``details`` stay a dict for the writers; the keys the
jobs act on are read through typed properties (:class:`ChangeFacts`, :class:`ColumnEvolution`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_pglogical.staging import contract


def _split(cls: type, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``raw`` as the known fields of ``cls`` and the rest (kept, so a newer writer's keys survive)."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    return {k: v for k, v in raw.items() if k in names}, {k: v for k, v in raw.items() if k not in names}


def _typed(cls: type, raw: Any) -> Any:
    """``raw`` as a ``cls``: itself when it is one already, else its known fields plus ``extra``."""
    if isinstance(raw, cls):
        return raw
    known, extra = _split(cls, raw)
    return cls(**known, extra=extra)


@dataclass(frozen=True)
class Column:
    """One source column of a staged table: its PostgreSQL type as the pull saw it."""

    name: str = ""
    #: ``pg_type.typname`` (``int4``, ``numeric``, ``_text``)
    type: str = "text"
    type_oid: int | None = None
    typmod: int | None = None
    #: ``format_type(oid, typmod)`` (``numeric(12,2)``)
    formatted: str | None = None
    #: an array's element ``typname``; None for other types
    element_type: str | None = None
    #: part of the replica-identity key
    key: bool = False
    #: the lakehouse type it was overridden to (``type_overrides``); None: its own type's
    override: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_dict(cls, raw: "dict[str, Any] | Column") -> "Column":
        return _typed(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        """The manifest entry; ``override`` only when there is one (as written before types)."""
        out = {"name": self.name, "type": self.type, "type_oid": self.type_oid, "typmod": self.typmod,
               "formatted": self.formatted, "element_type": self.element_type, "key": self.key, **self.extra}
        if self.override is not None:
            out["override"] = self.override
        return out


@dataclass
class FileEntry:
    """One Parquet file of a table in a batch: its name in the batch directory, rows, length and SHA-256
    (computed while it was written; None for files staged before they were recorded)."""

    path: str
    rows: int = 0
    size: int | None = None
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: "dict[str, Any] | FileEntry") -> "FileEntry":
        return _typed(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "rows": self.rows, **self.extra}
        if self.size is not None:
            out[contract.FILE_SIZE] = self.size
        if self.sha256 is not None:
            out[contract.FILE_SHA256] = self.sha256
        return out


@dataclass(frozen=True)
class ChangeFacts:
    """What the pull knows of a table's change rows (``contract.CHANGE_FACTS``), so the apply need
    not read them once to learn it."""

    rows: int = 0
    first_commit_lsn: int | None = None
    #: some row keeps an unchanged (TOASTed) value
    unchanged: bool = False
    #: some row carries an old key
    old_keys: bool = False
    first_commit_ts: str | None = None
    last_commit_ts: str | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ChangeFacts":
        known, _ = _split(cls, raw)
        return cls(**known)


@dataclass(frozen=True)
class ColumnEvolution:
    """Columns renamed (same attnum: old -> new) or dropped at the source before a change batch."""

    renamed: dict[str, str] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class KeyRange:
    """The rows a ranged backfill copied: ``start <= column < end`` (a None bound is open)."""

    column: str
    start: Any = None
    end: Any = None


@dataclass(frozen=True)
class ChunkedLoad:
    """A snapshot that is part of a chunked initial load (``contract.CHUNKED_LOAD``): its empty
    start, or one of its chunks (the chunk's ``key_range`` ends the table when its end is null; a
    table loaded whole is one chunk without a range, applied as a whole snapshot)."""

    empty_start: bool = False


@dataclass(frozen=True)
class SnapshotScope:
    """What a snapshot says of the rows it holds: all of the table, or a range of it."""

    key_range: KeyRange | None = None
    #: the PostgreSQL filter it was copied with (Spark cannot evaluate it: a key range must say the rows)
    extra_where: str | None = None
    #: part of a chunked initial load; None for any other snapshot
    chunked_load: ChunkedLoad | None = None

    @property
    def ranged(self) -> bool:
        return self.key_range is not None or bool(self.extra_where)


@dataclass
class TableManifest:
    """One source table inside a batch."""

    schema: str = ""
    name: str = ""
    columns: list[Column] = field(default_factory=list)
    #: replica-identity key column names (all columns for REPLICA IDENTITY FULL without a key)
    key: list[str] = field(default_factory=list)
    replica_identity: str = "d"
    #: no replica-identity column at all (``key`` then lists every column): a multiset
    keyless: bool = False
    files: list[FileEntry] = field(default_factory=list)
    rows: int = 0
    #: free-form facts: ``truncated``, ``key_range``, ``change_facts`` ... (typed reads below)
    details: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # writers hand the decoder's column entries (dicts); the manifest holds typed values
        self.columns = [Column.from_dict(column) for column in self.columns]
        self.files = [FileEntry.from_dict(entry) for entry in self.files]
        self.key = list(self.key)

    @property
    def qualified_name(self) -> str:
        return contract.table_key(self.schema, self.name)

    @property
    def column_names(self) -> list[str]:
        return [column.name for column in self.columns]

    @property
    def is_multiset(self) -> bool:
        """No key: REPLICA IDENTITY FULL or none at all (``contract.is_multiset``)."""
        return self.replica_identity == "f" or self.keyless

    @property
    def truncated(self) -> bool:
        return bool(self.details.get("truncated"))

    @property
    def replace_table(self) -> Any:
        """Why the apply replaces the Iceberg table before this snapshot (``contract.REPLACE_TABLE``); None: it does not."""
        return self.details.get(contract.REPLACE_TABLE)

    @property
    def change_facts(self) -> ChangeFacts | None:
        raw = self.details.get(contract.CHANGE_FACTS)
        return ChangeFacts.from_dict(raw) if raw else None

    @property
    def column_evolution(self) -> ColumnEvolution | None:
        raw = self.details.get(contract.COLUMN_EVOLUTION)
        if not raw:
            return None
        return ColumnEvolution(dict(raw.get("renamed") or {}), tuple(raw.get("dropped") or ()))

    def facts_decide(self, position: int) -> ChangeFacts | None:
        """The pull's facts when they answer what the apply would otherwise aggregate (``contract.facts_decide``)."""
        return ChangeFacts.from_dict(decided) if (decided := contract.facts_decide(self.details, position)) else None

    @classmethod
    def from_dict(cls, raw: "dict[str, Any] | TableManifest") -> "TableManifest":
        return _typed(cls, raw)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "name": self.name, "columns": [c.to_dict() for c in self.columns],
                "key": list(self.key), "replica_identity": self.replica_identity, "keyless": self.keyless,
                "files": [f.to_dict() for f in self.files], "rows": self.rows, "details": self.details, **self.extra}


@dataclass
class BatchManifest:
    """A committed batch: its pipeline, kind, LSN range (``X/Y`` text) and tables."""

    pipeline: str = ""
    kind: str = "changes"
    start_lsn: str = "0/0"
    end_lsn: str = "0/0"
    tables: dict[str, TableManifest] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    format_version: int = contract.FORMAT_VERSION
    #: schema changes seen inside the batch: ``[{"table", "lsn", "columns"}]``
    schema_changes: list[dict] = field(default_factory=list)
    #: logical messages (``pg_logical_emit_message``) decoded in the batch
    messages: list[dict] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    #: a change batch: where the change batch before it ended (``contract.PREVIOUS_END``); None
    #: for snapshots and for change batches staged before it was recorded
    previous_end: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tables = {key: TableManifest.from_dict(value) for key, value in self.tables.items()}

    @property
    def name(self) -> str:
        return contract.format_batch_name(contract.parse_lsn(self.start_lsn), contract.parse_lsn(self.end_lsn),
                                          self.kind)

    @property
    def initial(self) -> bool:
        """The pipeline's initial snapshot (retention keeps its manifest)."""
        return bool(self.details.get("initial"))

    def scope(self, source: str) -> dict[str, Any]:
        """The batch's details overlaid with the table's (the table's win; nulls do not count):
        what a snapshot says of its range (``key_range``, ``extra_where``)."""
        merged = {k: v for k, v in self.details.items() if v is not None}
        merged.update({k: v for k, v in self.tables[source].details.items() if v is not None})
        return merged

    def snapshot_scope(self, source: str) -> SnapshotScope:
        """The range a snapshot of ``source`` covers, from :meth:`scope`."""
        merged = self.scope(source)
        key_range = merged.get("key_range")
        chunked = merged.get(contract.CHUNKED_LOAD)
        return SnapshotScope(KeyRange(key_range["column"], key_range.get("start"), key_range.get("end"))
                             if key_range else None, merged.get("extra_where") or None,
                             ChunkedLoad(bool(chunked.get("empty_start"))) if chunked else None)

    def without_files(self) -> "BatchManifest":
        """A copy listing no files (what retention keeps of a removed initial snapshot)."""
        copy = BatchManifest.from_dict(self.to_dict())
        for table in copy.tables.values():
            table.files = []
        return copy

    @classmethod
    def from_dict(cls, raw: "dict[str, Any] | BatchManifest") -> "BatchManifest":
        if isinstance(raw, BatchManifest):
            return raw
        known, extra = _split(cls, raw)
        known["tables"] = contract.keyed_tables({k: v.to_dict() if isinstance(v, TableManifest) else v
                                                 for k, v in (known.get("tables") or {}).items()})
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "kind": self.kind, "start_lsn": self.start_lsn, "end_lsn": self.end_lsn,
                "tables": {k: t.to_dict() for k, t in self.tables.items()}, "created_at": self.created_at,
                "format_version": self.format_version, "schema_changes": self.schema_changes,
                "messages": self.messages, "details": self.details, "previous_end": self.previous_end, **self.extra}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "BatchManifest":
        return cls.from_dict(json.loads(text))
