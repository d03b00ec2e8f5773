"""Turn assembled transactions into per-table Arrow tables of the staging contract.

A change row carries ``_op`` (I, U, D, T), ``_commit_lsn``, ``_seq`` (order inside its
transaction), ``_xid``, ``_commit_ts``, ``_unchanged_toast`` (columns sent as unchanged TOAST:
the lakehouse keeps its value), the column values, and ``_old_<key>`` when an UPDATE sent its
old key. Values arrive as PostgreSQL text bytes and are parsed column-wise by ``values.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import pyarrow as pa

from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.decoding.assembler import TableChanges, Transaction
from airflow_provider_pglogical.decoding.pgoutput import Relation
from airflow_provider_pglogical.staging.typemap import MappedType, apply_overrides, map_column

#: ``(type_oid, typmod) -> (typname, format_type, element typname)``, looked up on the publisher
TypeInfo = dict[tuple[int, int], tuple[str, str, str | None]]

UNCHANGED_TYPE = pa.list_(pa.string())


@dataclass
class _Chunk:
    """One TableChanges (or a TRUNCATE) with its transaction's commit facts."""

    txn: Transaction
    changes: TableChanges | None
    truncate_seq: int | None = None


class StagedTableNames:
    """The staged key and name of a table's changes, from its newest ``relation`` and the
    manifest ``columns`` (shared by both decoders' per-table results)."""

    relation: Relation
    columns: list[dict]

    @property
    def key(self) -> list[str]:
        """The replica-identity columns; every column when the table has none."""
        key = list(self.relation.key_columns)
        return key or [c["name"] for c in self.columns]

    @property
    def keyless(self) -> bool:
        """No replica-identity column (``key`` is then every column)."""
        return not self.relation.key_columns

    @property
    def qualified_name(self) -> str:
        return self.relation.qualified_name


@dataclass
class TableBatch(StagedTableNames):
    """All changes of one table in one batch, and the schema they are staged under."""

    relation: Relation  # the newest version seen in the batch
    columns: list[dict]  # manifest column entries (union of the versions seen, newest order first)
    chunks: list[_Chunk] = field(default_factory=list)

    @property
    def versions(self) -> list[Relation]:
        """Every schema version of the table in the batch, the newest first."""
        return [self.relation] + [c.changes.relation for c in self.chunks if c.changes is not None]

    @property
    def truncated(self) -> bool:
        return any(c.changes is None for c in self.chunks)

    def build(self, types: TypeInfo, type_overrides: Mapping[str, str] | None = None) -> pa.Table:
        return build_table(self, types, type_overrides)


def group_by_table(transactions: Sequence[Transaction], relations: dict[int, Relation]) -> dict[int, TableBatch]:
    """Group row changes and truncates per table oid, in commit order."""
    tables: dict[int, TableBatch] = {}
    for txn in transactions:
        for changes in txn.tables:
            rel = changes.relation
            batch = tables.get(rel.oid)
            if batch is None:
                batch = tables[rel.oid] = TableBatch(rel, [])
            batch.relation = rel
            batch.chunks.append(_Chunk(txn, changes))
        for truncate in txn.truncates:
            for oid in truncate.relation_oids:
                rel = relations.get(oid)
                if rel is None:
                    continue  # a table of the TRUNCATE that this publication does not publish
                batch = tables.get(oid)
                if batch is None:
                    batch = tables[oid] = TableBatch(rel, [])
                batch.chunks.append(_Chunk(txn, None, truncate.seq))
    return tables


def column_entries(batch: TableBatch, types: TypeInfo, type_overrides: Mapping[str, str] | None = None) -> list[dict]:
    """Manifest columns: the newest relation's columns, then columns only older versions had."""
    return union_columns(batch.versions, types, type_overrides)


def union_columns(versions: Sequence[Relation], types: TypeInfo,
                  type_overrides: Mapping[str, str] | None = None) -> list[dict]:
    """Manifest column entries of ``versions`` (newest first): its columns, then older-only ones,
    with the ``type_overrides`` that name them (docs/types.md)."""
    seen: dict[str, dict] = {}
    for rel in versions:
        for col in rel.columns:
            if col.name in seen:
                continue
            typname, formatted, element = types.get((col.type_oid, col.typmod), ("text", "text", None))
            seen[col.name] = {
                "name": col.name, "type": typname, "type_oid": col.type_oid, "typmod": col.typmod,
                "formatted": formatted, "element_type": element, "key": bool(col.flags & 1),
            }
    return apply_overrides(versions[0].qualified_name, list(seen.values()), type_overrides)


def mapped_type(entry: dict) -> MappedType:
    return map_column(entry)


def _text_column(raw: Iterable, mapped: MappedType, name: str, table: str) -> pa.Array:
    texts = pa.array(raw, pa.binary()).cast(pa.string())
    return values.text_to_arrow(texts, mapped, name, table)


def build_table(batch: TableBatch, types: TypeInfo, type_overrides: Mapping[str, str] | None = None) -> pa.Table:
    """The staged Arrow table of one table's changes (metadata columns first)."""
    batch.columns = column_entries(batch, types, type_overrides)
    key = batch.key
    mapped = {c["name"]: mapped_type(c) for c in batch.columns}
    schema = change_schema(batch.columns, key)
    parts = [_chunk_table(chunk, batch.columns, key, mapped, schema, batch.qualified_name) for chunk in batch.chunks]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def change_schema(columns: list[dict], key: list[str]) -> pa.Schema:
    mapped = {c["name"]: mapped_type(c) for c in columns}
    fields = [
        pa.field(contract.OP, pa.string()),
        pa.field(contract.COMMIT_LSN, pa.int64()),
        pa.field(contract.SEQ, pa.int64()),
        pa.field(contract.XID, pa.int64()),
        pa.field(contract.COMMIT_TS, pa.timestamp("us", tz="UTC")),
        pa.field(contract.UNCHANGED, UNCHANGED_TYPE),
    ]
    fields += [pa.field(contract.staged_name(c["name"]), mapped[c["name"]].arrow) for c in columns]
    fields += [pa.field(contract.OLD_KEY_PREFIX + k, mapped[k].arrow) for k in key]
    return pa.schema(fields)


def _repeat(value, n: int, type_: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, type_), n) if value is not None else pa.nulls(n, type_)


def _commit_ts(txn: Transaction):
    return txn.commit_time


def _chunk_table(chunk: _Chunk, columns: list[dict], key: list[str], mapped: dict[str, MappedType],
                 schema: pa.Schema, table: str) -> pa.Table:
    txn = chunk.txn
    if chunk.changes is None:  # a TRUNCATE: one row, no values
        arrays = [pa.array(["T"]), pa.array([txn.commit_lsn], pa.int64()), pa.array([chunk.truncate_seq], pa.int64())]
        arrays += [pa.array([txn.xid], pa.int64()), pa.array([_commit_ts(txn)], pa.timestamp("us", tz="UTC"))]
        arrays += [pa.nulls(1, f.type) for f in list(schema)[5:]]
        return pa.Table.from_arrays(arrays, schema=schema)
    changes = chunk.changes
    n = len(changes)
    rel = changes.relation
    position = {c.name: i for i, c in enumerate(rel.columns)}
    by_column = changes.columns()
    arrays: list[pa.Array] = [
        pa.array(changes.ops, pa.string()),
        _repeat(txn.commit_lsn, n, pa.int64()),
        pa.array(changes.seqs, pa.int64()),
        _repeat(txn.xid, n, pa.int64()),
        _repeat(_commit_ts(txn), n, pa.timestamp("us", tz="UTC")),
        _unchanged_array(changes, rel, columns, n),
    ]
    for entry in columns:
        name = entry["name"]
        index = position.get(name)
        arrays.append(_text_column(by_column[index], mapped[name], name, table) if index is not None
                      else pa.nulls(n, mapped[name].arrow))
    key_positions = {name: i for i, name in enumerate(rel.key_columns)}
    for name in key:
        if not changes.old_keys or name not in key_positions:
            arrays.append(pa.nulls(n, mapped[name].arrow))
            continue
        i = key_positions[name]
        raw = [None] * n
        for row, old in changes.old_keys.items():
            raw[row] = old[i]
        arrays.append(_text_column(raw, mapped[name], name, table))
    return pa.Table.from_arrays(arrays, schema=schema)


def _unchanged_array(changes: TableChanges, rel: Relation, columns: list[dict], n: int) -> pa.Array:
    """Per row, the columns whose value must be kept: sent as 'u', or absent from the row's schema
    version in an UPDATE (a column dropped mid-batch keeps its last value)."""
    names = [c.name for c in rel.columns]
    present = set(names)
    absent = [c["name"] for c in columns if c["name"] not in present]
    if not changes.unchanged and not absent:
        return pa.nulls(n, UNCHANGED_TYPE)
    out: list[list[str] | None] = [None] * n
    for row, indices in changes.unchanged.items():
        out[row] = [names[i] for i in indices]
    if absent:
        for row, op in enumerate(changes.ops):
            if op == "U":
                out[row] = (out[row] or []) + absent
    return pa.array(out, UNCHANGED_TYPE)


_TYPES = """
SELECT t.oid, m.typmod, t.typname, format_type(t.oid, m.typmod), et.typname
  FROM unnest(%s::oid[], %s::int[]) AS m(oid, typmod)
  JOIN pg_type t ON t.oid = m.oid
  LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
"""


def lookup_types(cursor, relations: Iterable[Relation]) -> TypeInfo:
    """Type names for every (oid, typmod) the relations use, in one query."""
    pairs = sorted({(c.type_oid, c.typmod) for rel in relations for c in rel.columns})
    if not pairs:
        return {}
    cursor.execute(_TYPES, ([p[0] for p in pairs], [p[1] for p in pairs]))
    return {(oid, typmod): (name, formatted, element) for oid, typmod, name, formatted, element in cursor.fetchall()}


def relations_of(batches) -> list[Relation]:
    """Every relation version of the batch's tables (TableBatch or columnar tables alike)."""
    return [rel for b in batches.values() for rel in b.versions]

