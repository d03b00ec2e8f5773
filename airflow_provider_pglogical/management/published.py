"""Which tables, columns and rows a set of publications publishes, by PostgreSQL's rules.

PostgreSQL decides membership (``pg_get_publication_tables`` expands FOR ALL TABLES, TABLES IN
SCHEMA and ``publish_via_partition_root``); we combine the publications the way its own
table-sync worker does (PostgreSQL 15):

- row filters of several publications are OR-ed; one publication without a filter (or FOR ALL
  TABLES / TABLES IN SCHEMA) makes the table unfiltered;
- the ``publish`` operations are ignored for the initial copy, as the native subscriber does;
- column lists must agree (no list = every column); differing lists are an error;
- a partition one publication publishes directly while another publishes its root with
  ``publish_via_partition_root``: on PostgreSQL 16+ it is left out, as
  ``pg_get_publication_tables`` of the publications together does (its rows travel under the
  root); 15 lists both, and so do we there (:func:`_follow_server_partitions`).

Generated columns: PostgreSQL 15-17 never publish them, and a column list cannot name one. On 18 a
publication with ``publish_generated_columns = stored`` publishes the stored ones, and a column
list naming a stored generated column publishes it whatever that option says (the list wins);
virtual generated columns are never published. ``pg_get_publication_tables`` applies these rules
in its ``attrs`` (16+; on 15 a table without a list has ``attrs`` NULL: its plain columns), so the
snapshot copies exactly the columns pgoutput sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from airflow_provider_pglogical.exceptions import ColumnListConflict, PublicationError
from airflow_provider_pglogical.staging.contract import table_key


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    attnum: int
    type_oid: int
    typmod: int
    type: str  # pg_type.typname
    formatted: str  # format_type(oid, typmod)
    element_type: str | None
    not_null: bool
    key: bool
    #: ``pg_attribute.attgenerated``: ``''`` plain, ``'s'`` stored generated, ``'v'`` virtual (18)
    generated: str = ""
    #: how PostgreSQL fills it without row changes: ``identity``, ``missing`` (a stored value for
    #: rows older than the column), ``default``, or ``''``
    fill: str = ""

    def manifest_entry(self) -> dict:
        return {
            "name": self.name, "type": self.type, "type_oid": self.type_oid, "typmod": self.typmod,
            "formatted": self.formatted, "element_type": self.element_type, "key": self.key,
        }


@dataclass
class ResolvedTable:
    """One published table with its effective column list and combined row filter."""

    oid: int
    schema: str
    name: str
    relkind: str
    replica_identity: str  # d, f, i, n
    #: published columns in attnum order (the whole table when no publication has a list)
    columns: list[ColumnInfo]
    has_column_list: bool
    #: the OR of the publications' filters, or None when any publication publishes every row
    row_filter: str | None
    publications: list[str] = field(default_factory=list)
    #: operations published by at least one of the publications
    publish: set[str] = field(default_factory=set)
    #: a publication publishing it has ``publish_via_partition_root`` (its partitions' changes
    #: arrive under its name)
    via_root: bool = False
    #: ``[[relation oid, relfilenode], …]`` of the table, or of each leaf of a partitioned one: a
    #: rewrite (and TRUNCATE, VACUUM FULL, CLUSTER, a partition attached or detached) changes it
    storage: list[list[int]] = field(default_factory=list)
    #: ``[[publication, its row's xmin, its rows of the table (or an ancestor, or its schema) as
    #: "oid:xmin"], …]``: every ``ALTER PUBLICATION`` that touches the table changes it, even one
    #: changed back before the next pull
    publication_rows: list[list] = field(default_factory=list)

    @property
    def qualified_name(self) -> str:
        return table_key(self.schema, self.name)

    @property
    def key(self) -> list[str]:
        """Replica-identity columns that are published; all columns when there is no usable key."""
        key = [c.name for c in self.columns if c.key]
        return key or [c.name for c in self.columns]

    @property
    def keyless(self) -> bool:
        """No replica-identity column is published (no key, or REPLICA IDENTITY NOTHING)."""
        return not any(c.key for c in self.columns)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


_MISSING_PUBLICATIONS = "SELECT unnest(%s::text[]) EXCEPT SELECT pubname FROM pg_publication"

_PUBLISHED = """
SELECT p.pubname, gpt.relid, n.nspname, c.relname, c.relkind, c.relreplident,
       gpt.attrs::int2[], pg_get_expr(gpt.qual, gpt.relid),
       p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot
  FROM pg_publication p
 CROSS JOIN LATERAL pg_get_publication_tables(p.pubname) gpt
  JOIN pg_class c ON c.oid = gpt.relid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE p.pubname = ANY(%s)
 ORDER BY n.nspname, c.relname, p.pubname
"""

# Live columns with their types, replica-identity membership and whether they are generated.
_COLUMNS = """
SELECT a.attrelid, a.attname, a.attnum, a.atttypid, a.atttypmod, t.typname,
       format_type(a.atttypid, a.atttypmod), et.typname, a.attnotnull,
       CASE c.relreplident
         WHEN 'f' THEN true
         WHEN 'n' THEN false
         WHEN 'i' THEN a.attnum = ANY(SELECT unnest(i.indkey) FROM pg_index i
                                       WHERE i.indrelid = c.oid AND i.indisreplident)
         ELSE a.attnum = ANY(SELECT unnest(i.indkey) FROM pg_index i
                              WHERE i.indrelid = c.oid AND i.indisprimary)
       END,
       a.attgenerated::text,
       CASE WHEN a.attidentity <> '' THEN 'identity' WHEN a.atthasmissing THEN 'missing'
            WHEN a.atthasdef THEN 'default' ELSE '' END
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
 WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attrelid, a.attnum
"""

# The storage of each table, or of each leaf of a partitioned table
_STORAGE = """
SELECT t.oid, array_agg(ARRAY[c.oid::int8, c.relfilenode::int8] ORDER BY c.oid)
  FROM unnest(%s::oid[]) t(oid)
 CROSS JOIN LATERAL (SELECT t.oid UNION SELECT relid FROM pg_partition_tree(t.oid) WHERE isleaf) l(relid)
  JOIN pg_class c ON c.oid = l.relid AND c.relkind <> 'p'
 GROUP BY t.oid
"""

# The catalog rows that say how each publication publishes each table (ALTER PUBLICATION writes them)
_VERSIONS = """
SELECT t.oid, p.pubname, p.xmin::text, ARRAY(
       SELECT r.oid::text || ':' || r.xmin::text FROM pg_publication_rel r
        WHERE r.prpubid = p.oid AND (r.prrelid = t.oid OR r.prrelid IN (SELECT relid FROM pg_partition_ancestors(t.oid)))
       UNION ALL
       SELECT n.oid::text || ':' || n.xmin::text FROM pg_publication_namespace n JOIN pg_class c ON c.oid = t.oid
        WHERE n.pnpubid = p.oid AND n.pnnspid = c.relnamespace
        ORDER BY 1)
  FROM unnest(%s::oid[]) t(oid) CROSS JOIN pg_publication p
 WHERE p.pubname = ANY(%s)
 ORDER BY 1, 2
"""

# PostgreSQL 16+: the tables a subscriber of all the publications at once copies (a partition
# whose root another of them publishes via the root is left out, so it is published once)
_SERVER_SET = "SELECT DISTINCT relid FROM pg_get_publication_tables(VARIADIC %s::text[])"


def table_columns(cursor, oids: Sequence[int], *, generated: bool = False) -> dict[int, list[ColumnInfo]]:
    """Columns of the given tables, in attnum order, keyed by table oid.

    :param generated: include generated columns (only a publication's ``attrs`` may select them).
    """
    cursor.execute(_COLUMNS, (list(oids),))
    columns: dict[int, list[ColumnInfo]] = {}
    for relid, *rest in cursor.fetchall():
        column = ColumnInfo(*rest)
        if generated or not column.generated:
            columns.setdefault(relid, []).append(column)
    return columns


def require_publications(cursor, publications: Sequence[str], slot: str, pipeline: str) -> None:
    """Refuse a pull whose publications are gone, before and after its peek.

    pgoutput looks publications up by name as of each change it decodes: after a ``DROP
    PUBLICATION`` PostgreSQL 15-17 fail every decode of a later change (``UndefinedObject``), and 18
    skips the publication, so its tables' changes would be passed over. Either way retrying cannot
    help, and the changes made since the drop are not in the slot for the pipeline any more.
    """
    cursor.execute(_MISSING_PUBLICATIONS, (list(publications),))
    missing = sorted(r[0] for r in cursor.fetchall())
    if missing:
        raise PublicationError(
            f"publication(s) {', '.join(missing)} of pipeline {pipeline!r} no longer exist on the publisher (dropped): "
            f"slot {slot!r} cannot decode the changes made since, and retrying cannot bring them back. Re-create "
            f"{'it' if len(missing) == 1 else 'them'} with the same tables (PgCreatePublicationOperator, or CREATE "
            f"PUBLICATION … FOR TABLE …), then resync: drop slot {slot!r} (PgLogicalHook.drop_slot) and pull with "
            "on_slot_lost='resync', which re-snapshots every table. Nothing was changed"
        )


def resolve_published_tables(cursor, publications: Sequence[str]) -> list[ResolvedTable]:
    """Resolve what ``publications`` publish, combined by PostgreSQL's rules.

    :raises PublicationError: a publication does not exist.
    :raises ColumnListConflict: publications give one table different column lists.
    """
    if not publications:
        raise PublicationError("no publications given: name at least one publication")
    cursor.execute(_MISSING_PUBLICATIONS, (list(publications),))
    missing = sorted(r[0] for r in cursor.fetchall())
    if missing:
        raise PublicationError(
            f"publication(s) {', '.join(missing)} do not exist on the publisher: create them "
            "(PgLogicalHook.create_publication) or fix the names"
        )
    cursor.execute(_PUBLISHED, (list(publications),))
    rows = cursor.fetchall()
    by_oid: dict[int, dict] = {}
    for pubname, relid, schema, name, relkind, replident, attrs, qual, ins, upd, dele, trunc, viaroot in rows:
        entry = by_oid.setdefault(
            relid,
            {"schema": schema, "name": name, "relkind": relkind, "replident": replident,
             "lists": {}, "filters": [], "unfiltered": False, "pubs": [], "publish": set(), "via_root": False},
        )
        entry["via_root"] |= bool(viaroot)
        entry["pubs"].append(pubname)
        entry["lists"][pubname] = tuple(attrs) if attrs else None
        if qual is None:
            entry["unfiltered"] = True
        elif qual not in entry["filters"]:
            entry["filters"].append(qual)
        entry["publish"] |= {op for op, on in zip(("insert", "update", "delete", "truncate"), (ins, upd, dele, trunc)) if on}

    _follow_server_partitions(cursor, by_oid)
    columns = table_columns(cursor, list(by_oid), generated=True)
    cursor.execute(_STORAGE, (list(by_oid),))
    storage = {int(oid): [[int(a), int(b)] for a, b in leaves] for oid, leaves in cursor.fetchall()}
    cursor.execute(_VERSIONS, (list(by_oid), sorted({p for e in by_oid.values() for p in e["pubs"]})))
    versions: dict[int, list[list]] = {}
    for oid, pubname, xmin, rows in cursor.fetchall():
        if pubname in by_oid[oid]["pubs"]:
            versions.setdefault(int(oid), []).append([pubname, xmin, list(rows)])
    resolved = []
    for oid, entry in by_oid.items():
        table_cols = columns.get(oid, [])
        distinct = {_normalise(lst, table_cols) for lst in entry["lists"].values()}
        if len(distinct) > 1:
            described = "; ".join(
                f"{pub}: {_describe_list(lst, table_cols)}" for pub, lst in sorted(entry["lists"].items())
            )
            raise ColumnListConflict(
                f"table {entry['schema']}.{entry['name']} is published with different column lists "
                f"({described}). PostgreSQL cannot combine them: give every publication the same "
                "column list for this table, or subscribe to only one of them."
            )
        chosen = distinct.pop()
        published = [c for c in table_cols if (not c.generated if chosen is None else c.attnum in chosen)]
        row_filter = None
        filters = entry["filters"]
        if not entry["unfiltered"] and filters:
            row_filter = filters[0] if len(filters) == 1 else " OR ".join(f"({f})" for f in filters)
        resolved.append(
            ResolvedTable(
                oid=oid, schema=entry["schema"], name=entry["name"], relkind=entry["relkind"],
                replica_identity=entry["replident"], columns=published,
                has_column_list=chosen is not None, row_filter=row_filter,
                publications=entry["pubs"], publish=entry["publish"], via_root=entry["via_root"],
                storage=storage.get(oid, []), publication_rows=versions.get(oid, []),
            )
        )
    return sorted(resolved, key=lambda t: (t.schema, t.name))


def _normalise(attrs: tuple[int, ...] | None, columns: list[ColumnInfo]) -> frozenset[int] | None:
    """The published attnums; None for "every plain column" (no list, or one naming each of them,
    as PostgreSQL's table sync treats it). Generated columns count only where ``attrs`` names them."""
    plain = {c.attnum for c in columns if not c.generated}
    if attrs is None or set(attrs) == plain:
        return None
    return frozenset(attrs)


def _describe_list(attrs: tuple[int, ...] | None, columns: list[ColumnInfo]) -> str:
    if attrs is None:
        return "all columns"
    names = [c.name for c in columns if c.attnum in attrs]
    return "(" + ", ".join(names) + ")"


def _follow_server_partitions(cursor, by_oid: dict[int, dict]) -> None:
    """Keep the tables the server's own subscriber would copy for these publications together.

    A partition published directly by one publication whose root another publishes with
    ``publish_via_partition_root``: pgoutput sends its changes once, under the root, on every
    version; PostgreSQL 16+ also leaves the partition out of ``pg_get_publication_tables`` of the
    publications together (so its subscriber copies it once, into the root's table), while 15 lists
    both (its subscriber copies the partition's rows twice). We follow the server of each version.
    """
    cursor.execute("SELECT current_setting('server_version_num')::int")
    if cursor.fetchone()[0] < 160000 or not by_oid:
        return
    publications = sorted({pub for entry in by_oid.values() for pub in entry["pubs"]})
    cursor.execute(_SERVER_SET, (publications,))
    kept = {int(relid) for (relid,) in cursor.fetchall()}
    for oid in [oid for oid in by_oid if oid not in kept]:
        del by_oid[oid]
