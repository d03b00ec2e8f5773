"""DDL on the source: followed where it can be made exact, else the table is re-snapshotted.

pgoutput's Relation messages carry a table's OID, name and columns, but not attnums, so a
``RENAME b TO c`` and a ``DROP b; ADD c`` look alike in the stream. The pipeline record keeps, per
table OID, its first name (its *identity*: the Iceberg target follows it), its columns with their
attnums, its replica-identity key and the labels of its enum types, as of its snapshot and then
of each committed pull. A pull compares them with the catalog (:func:`review`):

- followed: a renamed table (same OID) stays staged under its identity; a renamed column (same
  attnum) is staged under its new name and renamed in Iceberg (same field id, same values); a
  dropped column is dropped from Iceberg; a column added without a default is added (NULL in the
  existing rows, as at the source); a type change Iceberg promotes (int4 -> int8, float4 ->
  float8, a wider numeric or varchar) is promoted;
- re-snapshotted (a snapshot batch that replaces the Iceberg table): a re-created table (a new
  OID under a known name), a column added with a default or a dropped name added again
  (PostgreSQL changed existing rows without row changes in the WAL), a type change Iceberg cannot
  promote, a renamed enum label, a changed replica-identity key, and window versions that match
  no column layout the record knows (several DDLs since the last pull: the catalog cannot prove
  which rows had which columns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.capture import published_changes
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.layout import BatchManifest
from airflow_provider_pglogical.staging.pipeline_record import PipelineRecord

#: earlier column layouts kept per table (to read the rows of windows that predate a change)
SHAPES_KEPT = 8
_INT4, _INT8, _FLOAT4, _FLOAT8, _NUMERIC, _TEXT, _VARCHAR = 23, 20, 700, 701, 1700, 25, 1043


@dataclass
class Review:
    """What one pull does about DDL; nothing of it has been done yet."""

    #: table OID -> why it is re-snapshotted (a replacing snapshot batch before the change batch)
    resnapshot: dict[int, str] = field(default_factory=dict)
    #: window OIDs whose changes are superseded by a (re-)snapshot: not staged
    superseded: set[int] = field(default_factory=set)
    #: table OID -> its identity ``(schema, name)`` when its current name differs
    identities: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: table OID -> {staged column name: current name, None when dropped} (only the names that move)
    columns: dict[int, dict[str, str | None]] = field(default_factory=dict)
    #: table OID -> ``{"renamed": {old: new}, "dropped": [...]}``: what the apply does to the Iceberg table
    evolution: dict[int, dict] = field(default_factory=dict)
    #: tables that cannot be followed nor re-snapshotted: the pull stops
    refused: list[str] = field(default_factory=list)
    #: record entries (``str(oid)`` -> entry) to keep once the batch is committed
    relations: dict[str, dict] = field(default_factory=dict)
    #: re-snapshotted tables the pipeline never held (a root or partitions a via_root flip publishes)
    fresh: set[int] = field(default_factory=set)
    #: known table OID -> why no change reaches it any more (a via_root flip moved its rows)
    orphaned: dict[int, str] = field(default_factory=dict)
    #: what the pull did, for its result and the pipeline's history: ``resnapshotted`` (table -> why)
    #: and ``orphaned`` (table OID -> why)
    summary: dict = field(default_factory=dict)


def shape_of(table: ResolvedTable) -> list[list]:
    """The published columns as ``[attnum, name, type_oid, typmod]``, in attnum order."""
    return [[c.attnum, c.name, c.type_oid, c.typmod] for c in table.columns]


def relation_entry(table: ResolvedTable, enums: Mapping[str, Mapping[str, str]], identity: Sequence[str],
                   since: str | None, earlier: dict | None = None) -> dict:
    """The record's entry of a table: what a later pull compares the catalog with."""
    shapes: list = []
    if earlier is not None:
        shapes = [earlier["columns"]] + [s for s in earlier.get("shapes", []) if s != earlier["columns"]]
    types = {str(c.type_oid) for c in table.columns}
    return {
        "oid": table.oid, "identity": list(identity), "schema": table.schema, "name": table.name, "columns": shape_of(table),
        "key": list(table.key), "keyless": table.keyless, "shapes": shapes[:SHAPES_KEPT],
        "enums": {t: dict(labels) for t, labels in enums.items() if t in types}, "since": since,
        **published_changes.recorded_fields(table),
    }


def enum_labels(cursor, type_oids: Iterable[int]) -> dict[str, dict[str, str]]:
    """``{type oid: {label oid: label}}`` of the enum types (and arrays of them) among ``type_oids``."""
    cursor.execute(
        "SELECT t.oid, e.oid, e.enumlabel FROM pg_type t JOIN pg_enum e ON e.enumtypid = "
        "CASE WHEN t.typelem <> 0 THEN t.typelem ELSE t.oid END WHERE t.oid = ANY(%s::oid[])",
        (sorted(set(type_oids)),),
    )
    labels: dict[str, dict[str, str]] = {}
    for type_oid, label_oid, label in cursor.fetchall():
        labels.setdefault(str(type_oid), {})[str(label_oid)] = label
    return labels


def with_defaults(cursor, oids: Iterable[int]) -> set[tuple[int, int]]:
    """``(table oid, attnum)`` of columns that have a default or a stored "missing" value."""
    cursor.execute(
        "SELECT attrelid::int8, attnum FROM pg_attribute WHERE attrelid = ANY(%s::oid[]) AND attnum > 0 "
        "AND NOT attisdropped AND (atthasmissing OR atthasdef)", (sorted(set(oids)),),
    )
    return {(int(oid), int(attnum)) for oid, attnum in cursor.fetchall()}


def promotes(old: Sequence, new: Sequence) -> bool:
    """Whether Iceberg promotes the old column type to the new one with every value unchanged."""
    (old_type, old_mod), (new_type, new_mod) = old, new
    if (old_type, new_type) in {(_INT4, _INT8), (_FLOAT4, _FLOAT8)}:
        return True
    if old_type == new_type == _NUMERIC and old_mod > 4 and new_mod > 4:
        (p, s), (q, t) = divmod(old_mod - 4, 65536), divmod(new_mod - 4, 65536)
        return s == t and q > p
    if old_type == _VARCHAR and new_type in (_VARCHAR, _TEXT):
        return new_type == _TEXT or new_mod < 0 or (old_mod >= 0 and new_mod >= old_mod)
    return False


def review(record_tables: Mapping[str, int | None], relations: Mapping[str, dict],
           published: Mapping[int, ResolvedTable], defaults: set[tuple[int, int]],
           enums: Mapping[str, Mapping[str, str]], window: Mapping[int, Sequence], start: Lsn, end: Lsn,
           truncated: frozenset[int] | set[int] = frozenset()) -> Review:
    """Compare the record with the catalog and the window's column versions (``oid -> Relation
    versions, newest first``; ``truncated``: the tables the window truncates); pure, so every DDL
    shape is unit-testable."""
    out = Review()
    for name, oid in record_tables.items():  # a pipeline recorded before relations were: adopt them
        if oid is not None and str(oid) not in relations and oid in published:
            out.relations[str(oid)] = relation_entry(published[oid], enums, contract.parse_table_key(name), None)
    known = {**relations, **out.relations}
    for key, entry in known.items():
        oid = int(key)
        table = published.get(oid)
        if table is None:
            continue  # dropped, or no longer published: the lakehouse keeps its last rows
        _review_table(out, oid, entry, table, defaults, enums, window.get(oid), start, end, oid in truncated)
    by_identity = {tuple(e["identity"]): int(k) for k, e in known.items()}
    by_identity.update({contract.parse_table_key(n): o for n, o in record_tables.items() if o is not None})
    for oid, table in published.items():
        if str(oid) in known:
            continue
        previous = by_identity.get((table.schema, table.name))
        if previous is None or previous == oid:
            continue
        if previous in published:
            out.refused.append(
                f"table {table.qualified_name} (OID {oid}) has the name table OID {previous} (now "
                f"{published[previous].qualified_name}) had when the pipeline snapshotted it, and that table "
                "still writes the Iceberg table of that name: remove one of them from the publications, or use "
                "another pipeline for the new table")
            continue
        out.resnapshot[oid] = "it was dropped and created again (a new OID under its name)"
        out.superseded.update({oid, previous})
    for oid, orphans in published_changes.via_root_flips(known, published).items():
        table = published[oid]
        names = ", ".join(".".join(known[str(o)]["identity"]) for o in orphans)
        turned = "on" if table.relkind == "p" else "off"
        out.resnapshot[oid] = (f"publish_via_partition_root was turned {turned}: the rows of {names} now arrive "
                               f"under {table.qualified_name}")
        out.superseded.add(oid)
        out.fresh.add(oid)
        for orphan in orphans:
            out.orphaned[orphan] = (f"publish_via_partition_root was turned {turned}: its rows now arrive under "
                                    f"{table.qualified_name}, no change reaches this table any more")
    return out


def _review_table(out: Review, oid: int, entry: dict, table: ResolvedTable, defaults: set[tuple[int, int]],
                  enums: Mapping[str, Mapping[str, str]], versions: Sequence | None, start: Lsn, end: Lsn,
                  truncated: bool = False) -> None:
    identity = tuple(entry["identity"])
    if identity != (table.schema, table.name):
        out.identities[oid] = identity  # type: ignore[assignment]
    recorded = {a: (n, t, m) for a, n, t, m in entry["columns"]}
    current = {c.attnum: (c.name, c.type_oid, c.typmod) for c in table.columns}
    renamed = {recorded[a][0]: current[a][0] for a in recorded if a in current and recorded[a][0] != current[a][0]}
    dropped = [recorded[a][0] for a in recorded if a not in current]
    names = {n for n, _, _ in recorded.values()}
    why = []
    for attnum in (a for a in current if a not in recorded):
        name = current[attnum][0]
        if name in names:
            why.append(f"column {name} was dropped and added again (a new column)")
        elif (oid, attnum) in defaults:
            why.append(f"column {name} was added with a default, which PostgreSQL gave the existing rows "
                       "without row changes")
    for attnum in recorded.keys() & current.keys():
        if recorded[attnum][1:] != current[attnum][1:] and not promotes(recorded[attnum][1:], current[attnum][1:]):
            why.append(f"column {current[attnum][0]} changed type in a way Iceberg cannot promote")
    if set(entry["key"]) & (set(renamed) | set(dropped)) or (
            not entry.get("keyless") and list(entry["key"]) != list(table.key)):
        why.append("its replica-identity key changed")
    if set(renamed.values()) & names:
        why.append("its columns swapped names")
    why += published_changes.resnapshot_reasons(entry, table, truncated)
    for type_oid, labels in entry.get("enums", {}).items():
        now = enums.get(type_oid, {})
        moved = [f"{old!r} -> {now[o]!r}" for o, old in labels.items() if now.get(o, old) != old]
        if moved:
            why.append(f"enum labels were renamed ({', '.join(moved)})")
    since = Lsn.parse(entry["since"]) if entry.get("since") else None
    mapping: dict[str, str | None] = {}
    if versions and since is not None and since >= end:
        out.superseded.add(oid)  # every change of the window is older than the table's snapshot
    elif versions and since is not None and since > start:
        mapping = _by_attnum(versions, [entry["columns"], shape_of(table)], current, straddles=True) or {}
    elif versions:
        found = _by_attnum(versions, [entry["columns"], *entry.get("shapes", []), shape_of(table)], current)
        if found is None:
            why.append("its columns changed more than once since the last pull, so the catalog cannot prove "
                       "which rows had which columns")
        mapping = found or {}
    if why:
        out.resnapshot[oid] = "; ".join(why)
        out.superseded.add(oid)
        return
    moves = {s: t for s, t in mapping.items() if s != t}
    if moves:
        out.columns[oid] = moves
    if renamed or dropped:
        out.evolution[oid] = {"renamed": renamed, "dropped": dropped}
    fresh = relation_entry(table, enums, identity, entry.get("since"), entry)
    if fresh["columns"] == entry["columns"]:
        fresh["shapes"] = entry.get("shapes", [])
    if fresh != entry:
        out.relations[str(oid)] = fresh


def _by_attnum(versions: Sequence, shapes: list[list], current: Mapping[int, tuple],
               straddles: bool = False) -> dict[str, str | None] | None:
    """Each staged column name -> its current name (None: dropped), by the attnums of the known
    layout each version matches; None when a version matches none, or layouts disagree."""
    mapping: dict[str, str | None] = {}
    for version in versions:
        signature = [(c.name, c.type_oid, c.typmod) for c in version.columns]
        attnums = {tuple(a for a, *_ in s) for s in shapes if [(n, t, m) for _, n, t, m in s] == signature}
        if len(attnums) != 1:
            if not straddles:
                return None
            # rows older than the table's snapshot, which the apply skips: only keep their columns
            # from coming back (a column the snapshot no longer had is not staged)
            names = {name for name, *_ in current.values()}
            for column in version.columns:
                mapping.setdefault(column.name, column.name if column.name in names else None)
            continue
        for column, attnum in zip(version.columns, attnums.pop()):
            target = current[attnum][0] if attnum in current else None
            if mapping.setdefault(column.name, target) != target:
                return None
    return mapping


def restage(data: pa.Table, columns: list[dict], moves: Mapping[str, str | None]) -> tuple[pa.Table, list[dict]]:
    """Stage a window's columns under their current names: a renamed column's older values join
    the new name's, a dropped column goes, and so do their unchanged-TOAST marks."""
    both = {old: new for old, new in moves.items() if new is not None
            and contract.staged_name(old) in data.column_names and contract.staged_name(new) in data.column_names}
    for old, new in moves.items():
        old_name = contract.staged_name(old)
        if old_name not in data.column_names:
            continue
        values = data[old_name]
        data = data.drop_columns([old_name])
        if new is None:
            continue
        new_name = contract.staged_name(new)
        if new_name in data.column_names:
            index = data.schema.get_field_index(new_name)
            merged = pc.coalesce(data[new_name], values.cast(data.schema.field(new_name).type))
            data = data.set_column(index, new_name, merged)
        else:
            data = data.append_column(pa.field(new_name, values.type), values)
    if contract.UNCHANGED in data.column_names:
        marks = data[contract.UNCHANGED]
        kept = [None if row is None else (_marks(row, moves, both) or None) for row in marks.to_pylist()]
        data = data.set_column(data.schema.get_field_index(contract.UNCHANGED), contract.UNCHANGED,
                               pa.array(kept, type=marks.type))
    entries, seen = [], set()
    for column in columns:
        name = moves.get(column["name"], column["name"])
        if name is None or name in seen:
            continue
        seen.add(name)
        entries.append({**column, "name": name})
    return data, entries


def _marks(row: list[str], moves: Mapping[str, str | None], both: Mapping[str, str]) -> list[str]:
    """A row's unchanged marks under the current names. A row of a version without a column has
    it marked (the lakehouse keeps its value): when a window holds a column under its old and its
    new name, the current one keeps the lakehouse's value only if neither name carried one."""
    marked, olds = set(row), {new: old for old, new in both.items()}
    out: list[str] = []
    for name in row:
        if name in moves:
            new = moves[name]
            if new is None or (name in both and new not in marked):
                continue
            name = new
        elif name in olds and olds[name] not in marked:
            continue
        if name not in out:
            out.append(name)
    return out

def record_snapshot(record: PipelineRecord, manifest: BatchManifest) -> None:
    """Keep in the record what a whole-table snapshot batch saw of its tables: the apply holds
    them as of the snapshot's LSN (a re-created table's old OID is forgotten)."""
    for qualified, table in manifest.tables.items():
        entry = table.details.get("relation")
        if not entry:
            continue
        key = str(entry["oid"])
        fresh = {**entry, "since": manifest.start_lsn}
        earlier = record.relations.get(key)
        if earlier is not None:
            fresh["shapes"] = earlier.get("shapes", [])
            if earlier["columns"] != fresh["columns"]:
                fresh["shapes"] = ([earlier["columns"]] + fresh["shapes"])[:SHAPES_KEPT]
        for other, old in list(record.relations.items()):
            if other != key and old["identity"] == fresh["identity"]:
                del record.relations[other]
        record.relations[key] = fresh
        record.tables[qualified] = entry["oid"]


def catalog_review(cursor, record: PipelineRecord, published: Sequence[ResolvedTable],
                   window: Mapping[int, Sequence], start: Lsn, end: Lsn,
                   truncated: frozenset[int] | set[int] = frozenset()) -> Review:
    """:func:`review` of the catalog as it is now (the tables' defaults and enum labels looked up)."""
    tables = {t.oid: t for t in published}
    oids = set(tables) | {int(k) for k in record.relations}
    types = {c.type_oid for t in published for c in t.columns}
    types |= {int(t) for entry in record.relations.values() for t in entry.get("enums", {})}
    return review(record.tables, record.relations, tables, with_defaults(cursor, oids), enum_labels(cursor, types),
                  window, start, end, truncated)
