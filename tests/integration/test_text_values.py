"""Text arrives exactly: random values of every text-like type, in a UTF8 and a LATIN1 database,
go through the snapshot AND the pull, and every staged value equals what psycopg2 reads from the
source (issue 33, class 4).

A seeded generator draws the values (empty strings, byte order marks, control characters,
backslashes and things that look like COPY escapes, ``NULL`` and array punctuation, long values):
one snapshot and one pull of many rows per database. The first snapshot row's key starts with
U+FEFF (the start of a COPY chunk) and a one-column table holds ``''`` rows (empty COPY lines).
"""

from __future__ import annotations

import json
import random
import uuid

import pytest
from airflow.sdk import ObjectStoragePath
from psycopg2 import sql

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.staging import batches, layout
from tests.support.databases import Database, drop_database

SEED = 33
#: pieces the values are made of; those a LATIN1 database cannot hold are left out there
PIECES = ["", "\ufeff", "\\", "\\\\", "\\N", "\\.", "\\n", "\\t", "\\x41", "\\101", "\\u00e9", "\t", "\n", "\r",
          "\x0b", "\x0c", "\x08", "\x7f", "\x1c", "\x1f", "\x85", "\xa0", "\u2028", "NULL", "null", '"', "'",
          "{", "}", ",", " ", "é", "ï»¿", "€", "日本", "😀"]
LABELS = ["plain", "with space", "back\\slash", "tab\there", "é"]
COLUMNS = ["k", "t", "vc", "bc", "nm", "ch", "js", "jb", "arr", "en", "dm"]
# What psycopg2 reads: each column's own output, except json/jsonb (psycopg2 would parse them) and
# the array (read as JSON: a reader that shares nothing with PostgreSQL's array literal).
SOURCE = "SELECT k, t, vc, bc, nm, ch, js::text, jb::text, to_json(arr)::text, en::text, dm FROM t"


class Values:
    """Seeded random values a database of ``encoding`` can hold (never NUL, never a surrogate)."""

    def __init__(self, rng: random.Random, encoding: str) -> None:
        self.rng = rng
        self.top = 0xFF if encoding == "LATIN1" else 0x10FFFF
        self.pieces = [p for p in PIECES if max(map(ord, p), default=0) <= self.top]

    def char(self) -> str:
        while True:
            code = self.rng.choice([self.rng.randint(1, 0x7F), self.rng.randint(0x80, 0xFF),
                                    self.rng.randint(1, self.top)])
            if not 0xD800 <= code <= 0xDFFF:
                return chr(code)

    def text(self) -> str:
        r = self.rng
        parts = [r.choice(self.pieces) if r.random() < 0.5 else "".join(self.char() for _ in range(r.randint(0, 6)))
                 for _ in range(r.randint(0, 5))]
        value = "".join(parts)
        return (value or "x\\y") * r.randint(300, 3000) if r.random() < 0.05 else value

    def maybe(self, value):
        return None if self.rng.random() < 0.15 else value

    def row(self, key: str) -> tuple:
        r = self.rng
        return (key, self.maybe(self.text()), self.maybe(self.text()), self.maybe(self.text()),
                self.maybe(self.text()), self.maybe(self.text()[:1] or "x"),
                self.maybe(json.dumps({"v": self.text(), "n": [self.text()]}, ensure_ascii=False)),
                self.maybe(json.dumps([self.text(), {"k": self.text()}], ensure_ascii=False)),
                self.maybe([self.maybe(self.text()) for _ in range(r.randint(0, 4))]),
                self.maybe(r.choice(LABELS)), self.maybe(self.text()))

    def keys(self, n: int, first: str) -> list[str]:
        keys = [first]
        while len(keys) < n:
            key = self.text()
            if key not in keys:
                keys.append(key)
        return keys


@pytest.fixture(params=["UTF8", "LATIN1"])
def source(request, publisher_cluster, monkeypatch):
    """A fresh database in the given encoding (C collation), as connection ``pglogical_publisher``."""
    name = f"text_{request.param.lower()}_{uuid.uuid4().hex[:6]}"
    publisher_cluster.execute(sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
                              .format(sql.Identifier(name), sql.Literal(request.param)))
    monkeypatch.setenv("AIRFLOW_CONN_PGLOGICAL_PUBLISHER", publisher_cluster.connection_uri(name))
    db = Database(publisher_cluster, name, "pglogical_publisher")
    yield db
    drop_database(db)


SCHEMA = """
CREATE TYPE {label} AS ENUM ('plain', 'with space', 'back\\slash', 'tab\there', 'é');
CREATE DOMAIN {dom} AS text;
CREATE TABLE {t} (k text PRIMARY KEY, t text, vc varchar(12), bc char(6), nm name, ch "char", js json, jb jsonb,
                  arr text[], en {label}, dm {dom});
CREATE TABLE {one} (v text);
ALTER TABLE {one} REPLICA IDENTITY FULL;
CREATE PUBLICATION {pub} FOR TABLE {t}, {one};
"""
UPDATE = """UPDATE {t} SET (k, t, vc, bc, nm, ch, js, jb, arr, en, dm) = (%s, %s, %s::varchar(12), %s::char(6),
           %s::name, %s::"char", %s::json, %s::jsonb, %s::text[], %s::{label}, %s::{dom}) WHERE k = %s"""
INSERT = """INSERT INTO {t} VALUES (%s, %s, %s::varchar(12), %s::char(6), %s::name, %s::"char", %s::json,
                                  %s::jsonb, %s::text[], %s::{label}, %s::{dom})"""


SNAPSHOT_ROWS, MOVED, INSERTED, DELETED = 300, 100, 100, 20


def test_text_values_arrive_exactly_through_snapshot_and_pull(source, tmp_path):
    encoding = source.query("SELECT current_setting('server_encoding')")[0][0]
    gen = Values(random.Random(f"{SEED}-{encoding}"), encoding)
    ident = {key: sql.Identifier(key) for key in ("t", "one", "pub", "label", "dom")}
    root = ObjectStoragePath(f"file://{tmp_path}/staging")
    bom = "\ufeff" if encoding == "UTF8" else "ï»¿"  # LATIN1 cannot hold U+FEFF; these are its UTF-8 bytes
    # The first value of the first COPY chunk starts with a byte order mark.
    keys = gen.keys(SNAPSHOT_ROWS + MOVED + INSERTED, first=bom + "first")
    old, new = keys[:SNAPSHOT_ROWS], keys[SNAPSHOT_ROWS:]
    singles = ["", *(gen.maybe(gen.text()) for _ in range(20)), ""]
    hook = PgLogicalHook(postgres_conn_id=source.conn_id)
    conn = source.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql.SQL(SCHEMA).format(**ident))
            cur.executemany(sql.SQL(INSERT).format(**ident), [gen.row(k) for k in old])
            cur.executemany(sql.SQL("INSERT INTO one VALUES (%s)"), [(v,) for v in singles])
        snapshot = run_initial_sync(hook, slot="s1", publications=["pub"], root=root, pipeline="p")
        staged = staged_rows(root, "p", snapshot["batch"])
        assert bom + "first" in {row[0] for row in staged["t"]}
        assert staged["t"] == source_rows(conn), first_difference(staged["t"], source_rows(conn))
        assert staged["one"] == sorted(singles, key=repr)

        # The pull: new keys for some rows (every column changes), new rows, deletes; the
        # one-column table gets and loses '' rows.
        moved, deleted = old[1:MOVED + 1], old[-DELETED:]
        with conn.cursor() as cur:
            for was, key in zip(moved, new):
                cur.execute(sql.SQL(UPDATE).format(**ident), (*gen.row(key), was))
            cur.executemany(sql.SQL(INSERT).format(**ident), [gen.row(k) for k in new[MOVED:]])
            cur.execute("DELETE FROM t WHERE k = ANY(%s)", (deleted,))
            cur.execute("INSERT INTO one VALUES (''), (%s)", (bom,))
            cur.execute("DELETE FROM one WHERE ctid = (SELECT min(ctid) FROM one WHERE v = '')")
        pulled = run_pull(hook, slot="s1", publications=["pub"], root=root, pipeline="p")
        changes = staged_changes(root, "p", pulled["batch"])
        current = {row[0]: row for row in source_rows(conn)}
        words = changes["t"]
        assert [(r["_old_k"], r["k"]) for r in words if r["_op"] == "U"] == list(zip(moved, new))
        assert [r["k"] for r in words if r["_op"] == "I"] == new[MOVED:]
        assert sorted(r["k"] for r in words if r["_op"] == "D") == sorted(deleted)
        written = [r for r in words if r["_op"] in "IU"]
        assert [r["_unchanged_toast"] for r in written] == [None] * len(written)
        staged_values = [tuple(r[c] for c in COLUMNS) for r in written]
        expected = [current[r["k"]] for r in written]
        assert staged_values == expected, first_difference(staged_values, expected)
        assert [(r["_op"], r["v"]) for r in changes["one"]] == [("I", ""), ("I", bom), ("D", "")]
    finally:
        conn.close()


def first_difference(left: list[tuple], right: list[tuple]) -> str:
    """The first row that differs, column by column (the assertion's message)."""
    for a, b in zip(left, right):
        if a != b:
            return "; ".join(f"{c}: {x!r} != {y!r}" for c, x, y in zip(COLUMNS, a, b) if x != y)[:2000]
    return f"{len(left)} rows against {len(right)}"


def source_rows(conn) -> list[tuple]:
    """The rows as psycopg2 reads them from the source (arrays through JSON), ordered by key."""
    with conn.cursor() as cur:
        cur.execute(SOURCE)
        out = [(*row[:8], None if row[8] is None else json.loads(row[8]), *row[9:]) for row in cur.fetchall()]
    return sorted(out, key=lambda row: row[0])


def staged_rows(root, pipeline: str, batch: str) -> dict[str, list]:
    """Per table name, the staged rows: as tuples ordered by key, or the sorted values of ``one``."""
    out = {}
    for table, data in _read(root, pipeline, batch).items():
        if data.column_names == ["v"]:
            out[table] = sorted(data["v"].to_pylist(), key=repr)
        else:
            out[table] = sorted((tuple(r[c] for c in COLUMNS) for r in data.to_pylist()), key=lambda row: row[0])
    return out


def staged_changes(root, pipeline: str, batch: str) -> dict[str, list[dict]]:
    """Per table name, the staged change rows in commit order."""
    return {table: sorted(data.to_pylist(), key=lambda r: (r["_commit_lsn"], r["_seq"]))
            for table, data in _read(root, pipeline, batch).items()}


def _read(root, pipeline: str, batch: str) -> dict:
    name = batch.rsplit("/", 1)[1]
    manifest = layout.read_manifest(root, pipeline, name)
    return {t.name: batches.read_table(root, pipeline, name, t) for t in manifest.tables.values()}
