"""Verify, source side: PostgreSQL digests the published projection itself, by another road than capture.

``verify`` is the pipeline's independent witness (DESIGN invariant 15): a bug in the capture's
COPY parser or in its value conversion must not hide from it, so nothing here goes through them.
PostgreSQL computes, inside one REPEATABLE READ snapshot, a digest per row of
``SELECT <published columns> FROM <table> WHERE <row filter>`` over a canonical text form of each
value that the Spark job (``spark/jobs/verify_tables.py``) reproduces from the Iceberg value alone
(:func:`canonical`; the forms are listed in docs/reliability.md). Only per-bucket counts and
digest sums leave PostgreSQL first; rows are compared, in PostgreSQL, only for the buckets whose
sums differ (:func:`differences`). Verify files live under ``<root>/_verify/<pipeline>/``, where
the apply job never looks.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import psycopg2
from psycopg2 import sql

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.management.validation import check_table_map
from airflow_provider_pglogical.staging.contract import default_target_name
from airflow_provider_pglogical.staging.column_types import column_type
from airflow_provider_pglogical.staging.seam.pg_types import SparkType
from airflow_provider_pglogical.staging.typemap import apply_overrides

VERIFY_DIR = "_verify"
#: hex digits of the key digest that name a bucket (256 buckets)
BUCKET_DIGITS = 2
#: the text output the lakehouse's string columns hold (docs/types.md), stated here on its own
#: rather than taken from capture, so that a change there shows up as a difference
TEXT_OUTPUT = {"DateStyle": "ISO, YMD", "TimeZone": "UTC", "IntervalStyle": "iso_8601", "bytea_output": "hex",
               "extra_float_digits": "3"}


@dataclass
class SourceTable:
    """One published table as verify compares it: its projection, and its target's expected types."""

    table: ResolvedTable
    target: list[str]  # catalog, namespace, table
    #: column name -> its lakehouse (Spark SQL) type: what the canonical form follows
    types: dict[str, str]
    key: list[str]
    keyed: bool
    #: bucket -> [rows, digest sum 1, digest sum 2] (sums as decimal text), filled by :func:`bucket_sums`
    buckets: dict[str, list] = field(default_factory=dict)

    def spec(self) -> dict:
        """What the Spark job needs of this table (JSON)."""
        return {"source": self.table.qualified_name, "target": self.target, "key": self.key, "keyed": self.keyed,
                "columns": [{"name": name, "type": kind} for name, kind in self.types.items()],
                "buckets": self.buckets}


def source_tables(tables: Sequence[ResolvedTable], catalog: str, namespace: str, *,
                  table_map: Mapping[str, str] | None = None, type_overrides: Mapping[str, str] | None = None,
                  apply_row_filters: bool = True) -> list[SourceTable]:
    """The tables to compare, each with the lakehouse type of every published column.

    :param apply_row_filters: False when reading a native subscriber, which holds filtered rows already.
    :param type_overrides: the pipeline's ``type_overrides`` (docs/types.md): an overridden column is
        a string column in the lakehouse, compared as PostgreSQL's text output.
    """
    out = []
    table_map = check_table_map(table_map)  # keys as the pipeline's table keys ('"x.y".z' -> '"x.y"."z"')
    for table in sorted(tables, key=lambda t: t.qualified_name):
        if not apply_row_filters and table.row_filter:
            table = ResolvedTable(
                oid=table.oid, schema=table.schema, name=table.name, relkind=table.relkind,
                replica_identity=table.replica_identity, columns=table.columns,
                has_column_list=table.has_column_list, row_filter=None, publications=table.publications,
                publish=table.publish,
            )
        entries = apply_overrides(table.qualified_name, [c.manifest_entry() for c in table.columns], type_overrides)
        keyed = table.replica_identity != "f" and any(c.key for c in table.columns)
        target = table_map.get(table.qualified_name) or default_target_name(table.qualified_name)
        out.append(SourceTable(table=table, target=[catalog, namespace, target],
                               types={e["name"]: column_type(e) for e in entries}, key=table.key, keyed=keyed))
    return out


@contextlib.contextmanager
def source_snapshot(connect_kwargs: Mapping[str, Any]) -> Iterator[tuple[Any, Lsn]]:
    """A cursor in one read-only REPEATABLE READ transaction, and the WAL position it started at.

    Every query of one verify runs in it, so the bucket sums and the rows compared later see the
    same snapshot; it stays open while the Spark job runs (it holds back the publisher's xmin).
    """
    conn = psycopg2.connect(**connect_kwargs)
    try:
        with conn.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            for name, value in TEXT_OUTPUT.items():
                cursor.execute("SELECT set_config(%s, %s, true)", (name, value))
            cursor.execute("SELECT pg_current_wal_lsn()::text")
            (lsn,) = cursor.fetchone()
            yield cursor, Lsn.parse(lsn)
    finally:
        conn.close()


# --- canonical forms: keep in step with spark/jobs/verify_tables.py ----------------------------------

def canonical(value: sql.Composable, kind: "str | SparkType") -> sql.Composable:
    """The canonical text of a non-NULL value whose lakehouse type is ``kind`` (Spark SQL type).

    Numbers and instants as integers (days, microseconds since 1970), floats as their IEEE bits,
    decimals with their scale, bytes as hex, strings as PostgreSQL's text output. A value the
    lakehouse type cannot hold (an infinite date, a multi-dimensional array, ...) gets a form no
    lakehouse value has, so it always shows as a difference.
    """
    v = {"v": value}
    spark_type = kind if isinstance(kind, SparkType) else SparkType.parse(kind)
    kind = spark_type.kind
    if spark_type.is_array:
        element = sql.Identifier("_e", "x")
        return sql.SQL(
            "CASE WHEN array_ndims({v}) > 1 OR array_lower({v}, 1) <> 1 THEN 'R' || {v}::text ELSE 'A' || "
            "(SELECT coalesce(string_agg({e}, '' ORDER BY _e.o), '') FROM unnest({v}) WITH ORDINALITY AS _e(x, o)) END"
        ).format(e=element_text(element, spark_type.element), **v)
    if kind == "boolean":
        return sql.SQL("CASE WHEN {v} THEN 't' ELSE 'f' END").format(**v)
    if kind in ("int", "bigint", "decimal"):
        return sql.SQL("{v}::text").format(**v)
    if kind in ("float", "double"):
        send, bits = ("float4send", "bit(32)::int") if kind == "float" else ("float8send", "bit(64)::bigint")
        return sql.SQL("CASE WHEN {v} = 'NaN' THEN 'NaN' ELSE (('x' || encode({send}({v}), 'hex'))::{bits})::text END"
                       ).format(send=sql.SQL(send), bits=sql.SQL(bits), **v)
    if kind == "date":
        return sql.SQL("CASE WHEN isfinite({v}) THEN ({v} - DATE '1970-01-01')::text ELSE {v}::text END").format(**v)
    if kind in ("timestamp", "timestamp_ntz"):
        # days and time of day apart: extract(epoch …) rounds past 2^63 microseconds (a slower path)
        wall = sql.SQL("({} AT TIME ZONE 'UTC')").format(value) if kind == "timestamp" else value
        return sql.SQL("CASE WHEN isfinite({v}) THEN trunc(({w}::date - DATE '1970-01-01')::numeric * 86400000000 "
                       "+ extract(epoch FROM {w}::time) * 1000000)::text ELSE {v}::text END").format(w=wall, **v)
    if kind == "binary":
        return sql.SQL("encode({v}, 'hex')").format(**v)
    # a string column: the type's own output function (concat keeps char(n)'s padding, ::text would not)
    return sql.SQL("concat({v})").format(**v)


def element_text(value: sql.Composable, kind: "str | SparkType") -> sql.Composable:
    """One value as ``N`` (NULL) or ``<length>:<canonical text>``: never ambiguous when concatenated."""
    text = canonical(value, kind)
    return sql.SQL("CASE WHEN {v} IS NULL THEN 'N' ELSE length({t})::text || ':' || {t} END").format(v=value, t=text)


def _digest(columns: Sequence[str], types: Mapping[str, str]) -> sql.Composable:
    parts = [element_text(sql.Identifier("p", name), types[name]) for name in columns]
    return sql.SQL("md5(convert_to({}, 'UTF8'))").format(sql.SQL(" || ").join(parts) if parts else sql.Literal(""))


def digests(table: SourceTable, *, with_rows: bool = False) -> sql.Composed:
    """``SELECT kd, rd[, row]``: per row of the projection the key digest, the row digest (and the row as JSON).

    A keyless table is a multiset: its key digest is its row digest.
    """
    t = table.table
    columns = list(table.types)
    where = sql.SQL(" WHERE ({})").format(sql.SQL(t.row_filter)) if t.row_filter else sql.SQL("")
    projection = sql.SQL("SELECT {} FROM {}{}{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        sql.SQL("") if t.relkind == "p" else sql.SQL("ONLY "),  # a partition root reads its partitions
        sql.Identifier(t.schema, t.name), where,
    )
    row = _digest(columns, table.types)
    key = _digest(table.key, table.types) if table.keyed else row
    extra = sql.SQL(", row_to_json(p.*)::text AS row") if with_rows else sql.SQL("")
    return sql.SQL("SELECT {} AS kd, {} AS rd{} FROM ({}) AS p").format(key, row, extra, projection)


def bucket_sums(cursor, table: SourceTable) -> None:
    """Fill ``table.buckets``: per bucket the row count and two sums of 60-bit slices of the row digests."""
    cursor.execute(sql.SQL(
        "SELECT substr(d.kd, 1, {n}), count(*), sum(('x' || substr(d.rd, 1, 15))::bit(60)::bigint)::text, "
        "sum(('x' || substr(d.rd, 16, 15))::bit(60)::bigint)::text FROM ({q}) AS d GROUP BY 1"
    ).format(n=sql.Literal(BUCKET_DIGITS), q=digests(table)))
    table.buckets = {bucket: [rows, first, second] for bucket, rows, first, second in cursor.fetchall()}


def differences(cursor, table: SourceTable, buckets: Sequence[str], target_rows: Mapping[str, list],
                limit: int) -> dict:
    """Compare, in PostgreSQL, the source rows of ``buckets`` with the lakehouse's rows of them.

    :param target_rows: the Spark job's rows of those buckets, grouped by digest: lists ``kd``,
        ``rd``, ``n`` (how many rows have that digest) and ``row`` (one of them as JSON).
    :returns: counts of rows only in the source / only in the lakehouse, how many keys differ, and
        the first ``limit`` differing rows of each side (as dicts) and their keys.
    """
    target = sql.SQL("SELECT * FROM unnest({}::text[], {}::text[], {}::bigint[], {}::text[]) AS t(kd, rd, n, row)"
                     ).format(*(sql.Literal(list(target_rows[name])) for name in ("kd", "rd", "n", "row")))
    query = sql.SQL("""
        WITH t AS ({target}),
        s AS (SELECT d.kd, d.rd, count(*) AS n, min(d.row) AS row FROM ({rows}) AS d
               WHERE substr(d.kd, 1, {digits}) = ANY({buckets}::text[]) GROUP BY d.kd, d.rd),
        diff AS (SELECT coalesce(s.kd, t.kd) AS kd, coalesce(s.n, 0) AS sn, coalesce(t.n, 0) AS tn,
                        s.row AS srow, t.row AS trow
                   FROM s FULL JOIN t ON s.kd = t.kd AND s.rd = t.rd WHERE s.n IS DISTINCT FROM t.n)
        SELECT totals.*, first.* FROM
          (SELECT count(DISTINCT kd), coalesce(sum(greatest(sn - tn, 0)), 0), coalesce(sum(greatest(tn - sn, 0)), 0)
             FROM diff) AS totals
          LEFT JOIN LATERAL (SELECT * FROM diff ORDER BY kd, sn LIMIT {limit}) AS first ON true
    """).format(target=target, rows=digests(table, with_rows=True), digits=sql.Literal(BUCKET_DIGITS),
                buckets=sql.Literal(list(buckets)), limit=sql.Literal(2 * limit))
    cursor.execute(query)
    rows = cursor.fetchall()
    only_source, only_target, keys = [], [], []
    for _, _, _, kd, sn, tn, srow, trow in rows:
        if kd is None:
            continue
        row = json.loads(srow if sn > tn else trow)
        (only_source if sn > tn else only_target).append(row)
        key = [row.get(name) for name in table.key]
        if key not in keys:
            keys.append(key)
    differing_keys, missing, extra = rows[0][:3]
    return {"differing_keys": int(differing_keys), "missing_rows": int(missing), "extra_rows": int(extra),
            "only_in_source": only_source[:limit], "only_in_target": only_target[:limit],
            "first_differing_keys": keys[:limit]}


def describe_differences(result: dict) -> str:
    """A short human summary of a verify result (the first differing keys per table)."""
    lines = []
    for table in result["tables"]:
        if table["equal"]:
            lines.append(f"{table['table']}: equal ({table['source_rows']:,} rows)")
            continue
        detail = table.get("problem") or (
            f"{table.get('differing_buckets')} key range(s) differ; source {table.get('source_rows'):,} rows, "
            f"lakehouse {table.get('target_rows'):,} rows; {table.get('missing_rows')} row(s) only in the source, "
            f"{table.get('extra_rows')} only in the lakehouse; first differing keys {table.get('first_differing_keys')}"
        )
        lines.append(f"{table['table']}: DIFFERENT: {detail}")
    return "\n".join(lines)
