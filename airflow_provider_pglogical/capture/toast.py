"""Fill unchanged-TOAST values that no lakehouse row can supply, from the publisher, by key.

PostgreSQL 15 turns an UPDATE that moves a row *into* a row filter into an INSERT, and an
out-of-line TOASTed column the UPDATE did not touch is sent as ``'u'`` (unchanged) with no value.
The native subscriber then stores NULL. Key-changing UPDATEs with unchanged columns are filled
too: when the row's key changed before the INSERT's fetch ran, only the later fetch by the new
key can find it. There is no earlier row to keep the value from, so before
the batch is committed we read those columns from the publisher, one query per table per batch,
and record in the manifest that (and at which LSN) we did. The value read is the row's current
one: a later change to the row arrives in a later change row and wins, as it should; a row
deleted meanwhile is simply not found (its DELETE follows in the stream).
"""

from __future__ import annotations

import logging

import psycopg2.errors
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging import layout
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.staging.typemap import map_column

log = logging.getLogger(__name__)


def rows_needing_values(table: pa.Table, key: list[str] | None = None) -> pa.Array:
    """Indices of rows with unchanged-TOAST columns that the lakehouse may not be able to supply.

    INSERTs (a row entering a row filter), and UPDATEs that change the key: the lakehouse row
    under the old key may itself lack the value (an earlier batch's fetch could not find the row
    because this very key change had already happened on the publisher).
    """
    op = table[contract.OP]
    wanted = pc.equal(op, "I")
    if key and all(contract.OLD_KEY_PREFIX + k in table.column_names for k in key):
        moved = pc.fill_null(pc.is_valid(table[contract.OLD_KEY_PREFIX + key[0]]), False)
        differs = None
        for k in key:
            unequal = pc.fill_null(pc.not_equal(table[contract.OLD_KEY_PREFIX + k], table[contract.staged_name(k)]),
                                   False)
            differs = unequal if differs is None else pc.or_(differs, unequal)
        wanted = pc.or_(wanted, pc.and_(pc.and_(pc.equal(op, "U"), moved), differs))
    mask = pc.and_(wanted, pc.is_valid(table[contract.UNCHANGED]))
    return pc.indices_nonzero(pc.fill_null(mask, False))


def fetch_query(schema: str, name: str, relkind_partitioned: bool, key: list[dict], wanted: list[dict]) -> sql.Composed:
    """``SELECT key::text…, col::text… FROM t WHERE (key…) IN (SELECT … FROM unnest(%s::text[]…))``."""
    columns = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(c["name"])) for c in key + wanted
    )
    key_tuple = sql.SQL(", ").join(sql.Identifier(c["name"]) for c in key)
    unnest_args = sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in key)
    casts = sql.SQL(", ").join(
        sql.SQL("v.{}::{}").format(sql.Identifier(f"k{i}"), sql.SQL(c["formatted"])) for i, c in enumerate(key)
    )
    aliases = sql.SQL(", ").join(sql.Identifier(f"k{i}") for i in range(len(key)))
    return sql.SQL("SELECT {} FROM {}{} WHERE ({}) IN (SELECT {} FROM unnest({}) AS v({}))").format(
        columns, sql.SQL("") if relkind_partitioned else sql.SQL("ONLY "), sql.Identifier(schema, name),
        key_tuple, casts, unnest_args, aliases,
    )


def _key_texts(table: pa.Table, columns: list[str]) -> list[tuple]:
    return list(zip(*(pc.cast(table[c], pa.string()).to_pylist() for c in columns))) if columns else []


def _current_keys(table: pa.Table, positions: list[int], key: list[str]) -> list[list]:
    """Per needed row, its key after the batch's later key changes, column by column (for the fetch).

    The row is read from the publisher by key *now*: when an UPDATE later in the batch changed
    the key (``_old_<key>`` set and different), the row lives under the new key.
    """
    keys = _key_texts(table.take(pa.array(positions, pa.int64())), [contract.staged_name(k) for k in key])
    is_key_change = pc.and_(pc.equal(table[contract.OP], "U"),
                            pc.is_valid(table[contract.OLD_KEY_PREFIX + key[0]])) if key else None
    if is_key_change is not None:
        change_rows = pc.indices_nonzero(pc.fill_null(is_key_change, False))
        changed = table.take(change_rows)
        moves = list(zip(change_rows.to_pylist(), _key_texts(changed, [contract.OLD_KEY_PREFIX + k for k in key]),
                         _key_texts(changed, [contract.staged_name(k) for k in key])))
        for i, position in enumerate(positions):
            current = keys[i]
            for row, old, new in moves:
                if row > position and old == current and new != old:
                    current = new
            keys[i] = current
    return [list(column) for column in zip(*keys)] if keys else [[] for _ in key]


def current_name(cursor, oid: int) -> tuple[str, str] | None:
    """The relation's schema and name now (it may have been renamed since the change); None once dropped."""
    cursor.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE c.oid = %s", (oid,))
    row = cursor.fetchone()
    return (row[0], row[1]) if row else None


def _not_fetchable(table: pa.Table, manifest: layout.TableManifest, count: int, why: str) -> tuple[pa.Table, dict]:
    """The relation (or a column) is gone from the publisher: the batch goes on without the values.

    Retrying could never succeed, and blocking would pin the slot's WAL forever; the rows keep
    their unchanged-TOAST marks, the lakehouse keeps what it has, and the manifest says so.
    """
    log.warning("%s: %d row(s) with unchanged TOAST value(s) cannot be filled from the publisher (%s); they keep "
                "the lakehouse's values, or NULL where it has none", manifest.qualified_name, count, why)
    return table, {"rows": count, "filled": 0, "missing": count, "unavailable": why}


def fill_unchanged_toast(cursor, table: pa.Table, manifest: layout.TableManifest,
                         relation_oid: int | None = None) -> tuple[pa.Table, dict | None]:
    """Return ``table`` with fetched values filled in, and the manifest detail describing the fetch.

    ``cursor`` must be a publisher session (autocommit) with :data:`values.SESSION_SETTINGS` applied.

    :param relation_oid: the relation's OID from the change stream: the fetch follows a rename,
        and a dropped relation (or column) never blocks the batch.
    """
    indices = rows_needing_values(table, manifest.key)
    if len(indices) == 0:
        return table, None
    schema, name = manifest.schema, manifest.name
    if relation_oid is not None:
        now = current_name(cursor, relation_oid)
        if now is None:
            return _not_fetchable(table, manifest, len(indices), "the table was dropped on the publisher")
        schema, name = now
    by_name = {c.name: c.to_dict() for c in manifest.columns}
    key = [by_name[k] for k in manifest.key]
    needed_rows = table.take(indices)
    unchanged_lists = needed_rows[contract.UNCHANGED].to_pylist()
    wanted_names = sorted({name for names in unchanged_lists for name in names})
    wanted = [by_name[n] for n in wanted_names]
    positions = indices.to_pylist()
    key_texts = _current_keys(table, positions, [c["name"] for c in key])
    cursor.execute("SELECT pg_current_wal_lsn()::text")
    at_lsn = cursor.fetchone()[0]
    partitioned = bool(manifest.details.get("partitioned"))
    try:
        cursor.execute(fetch_query(schema, name, partitioned, key, wanted), key_texts)
    except (psycopg2.errors.UndefinedTable, psycopg2.errors.UndefinedColumn) as err:
        return _not_fetchable(table, manifest, len(positions), str(err).strip().splitlines()[0])
    found = {tuple(row[: len(key)]): row[len(key):] for row in cursor.fetchall()}

    # Keys as PostgreSQL prints them, to match the fetched rows.
    row_keys = list(zip(*key_texts)) if key else [()] * len(positions)
    fetched_text = {}
    if found:
        # Normalise our key text through the same types PostgreSQL printed them with.
        cursor.execute(
            sql.SQL("SELECT {} FROM unnest({}) AS v({})").format(
                sql.SQL(", ").join(sql.SQL("v.{}::{}::text").format(sql.Identifier(f"k{i}"), sql.SQL(c["formatted"]))
                                   for i, c in enumerate(key)),
                sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in key),
                sql.SQL(", ").join(sql.Identifier(f"k{i}") for i in range(len(key))),
            ),
            key_texts,
        )
        row_keys = [tuple(r) for r in cursor.fetchall()]
        fetched_text = {i: found.get(k) for i, k in enumerate(row_keys)}

    n = table.num_rows
    new_unchanged = table[contract.UNCHANGED].to_pylist()
    filled_rows = 0
    for column_index, entry in enumerate(wanted):
        name = entry["name"]
        mask = [False] * n
        replacement: list[str | None] = []
        for i, position in enumerate(positions):
            row = fetched_text.get(i)
            if row is not None and name in unchanged_lists[i]:
                mask[position] = True
                replacement.append(row[column_index])
        if not replacement:
            continue
        mapped = map_column(entry)
        parsed = values.text_to_arrow(pa.array(replacement, pa.string()), mapped, name, manifest.qualified_name)
        staged = contract.staged_name(name)
        column = pc.replace_with_mask(table[staged].combine_chunks(), pa.array(mask), parsed)
        table = table.set_column(table.schema.get_field_index(staged), staged, column)
    for i, position in enumerate(positions):
        if fetched_text.get(i) is not None:
            filled_rows += 1
            new_unchanged[position] = None
    table = table.set_column(
        table.schema.get_field_index(contract.UNCHANGED), contract.UNCHANGED, pa.array(new_unchanged, pa.list_(pa.string()))
    )
    detail = {
        "rows": len(positions), "filled": filled_rows, "missing": len(positions) - filled_rows,
        "columns": wanted_names, "at_lsn": at_lsn,
    }
    log.info("%s: fetched unchanged TOAST column(s) %s for %d row(s) at LSN %s (%d no longer exist)",
             manifest.qualified_name, ", ".join(wanted_names), filled_rows, at_lsn, detail["missing"])
    return table, detail
