"""The source shapes of issue 33 for the reliability harness: DDL, tricky names, tricky text.

Publication ``rel_shapes`` holds small tables beside the workload's, touched by a few seeded
transactions before and after one DDL point per round. At that point the native subscriber has
replayed everything, and the same DDL runs on it (native logical replication does not replicate
DDL, and maps columns and tables by name: a renamed column or table missing on the subscriber, or
a column it dropped while changes still carrying it are in flight, stops its apply worker).
Every round:

- ``renamed_cols``: ``RENAME COLUMN`` (followed by attnum: the Iceberg column is renamed);
- ``readded``: ``DROP COLUMN b`` then ``ADD COLUMN b`` (re-snapshotted);
- ``wanderer``: ``RENAME TO`` a name with upper case and a hyphen, then ``SET SCHEMA`` (followed by OID);
- ``phoenix``: dropped and created again with other columns (new OID: re-snapshotted), added back
  to the publication (the subscriber refreshes its subscription and copies it again);
- ``"Foo"`` (beside ``foo``): an enum label renamed (re-snapshotted);
- names that once shared a key or a target: schema ``"x.y"`` table ``z`` beside schema ``x`` table
  ``"y.z"``, ``"Foo"`` beside ``foo``; ``foo`` is keyless with one published text column holding
  empty strings, a leading U+FEFF, backslashes and control characters.
"""

from __future__ import annotations

import random

from psycopg2 import sql

from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.staging.contract import parse_table_key, table_key

PUBLICATION = "rel_shapes"
SCHEMA = """
CREATE TYPE shade AS ENUM ('light', 'dark0');
CREATE SCHEMA "x.y"; CREATE SCHEMA x;
CREATE TABLE "x.y".z(id int PRIMARY KEY, v text);
CREATE TABLE x."y.z"(id int PRIMARY KEY, v text);
CREATE TABLE "Foo"(id int PRIMARY KEY, v text, s shade);
CREATE TABLE foo(v text);
ALTER TABLE foo REPLICA IDENTITY FULL;
CREATE TABLE renamed_cols(id int PRIMARY KEY, a0 text, n int);
CREATE TABLE readded(id int PRIMARY KEY, b int, c text);
CREATE TABLE wanderer(id int PRIMARY KEY, v text);
CREATE TABLE phoenix(id int PRIMARY KEY, old text);
"""
#: text that COPY's escapes, the CSV reader's empty-line and BOM rules, and str.strip() touch
TRICKY_TEXT = ["", "", "\ufeff", "\ufeffbom", "back\\slash\\", "\\N", "\\.", "\\x41\\101", "ctl\x01\x02\x1b\x7f",
               "tab\tnew\nline\rret", "'q\"", " spaced ", "\x1cfs\x1f", "日本\ufeff"]
#: phoenix's columns, one layout per re-creation
PHOENIX_LAYOUTS = ["old text", "fresh int, note text", "old text, n numeric(8,2)"]


class Shapes:
    """Row changes on the shapes' tables and, once per round, their DDL on both sides."""

    def __init__(self, publisher, subscriber, rng: random.Random, subscription: str) -> None:
        self.publisher, self.subscriber, self.rng = publisher, subscriber, rng
        self.subscription = subscription
        self.rounds = 0
        self.next_id = 0
        #: role -> current (schema, table)
        self.names = {"xy_z": ("x.y", "z"), "x_yz": ("x", "y.z"), "Foo": ("public", "Foo"), "foo": ("public", "foo"),
                      "renamed_cols": ("public", "renamed_cols"), "readded": ("public", "readded"),
                      "wanderer": ("public", "wanderer"), "phoenix": ("public", "phoenix")}
        self.text_column = {"renamed_cols": "a0", "phoenix": "old"}
        self.shade = "dark0"
        self.phoenix_layout = 0

    def create_schema(self) -> None:
        for db in (self.publisher, self.subscriber):
            db.execute(SCHEMA)

    def published(self) -> list[PublishedTable]:
        """The publication's tables, by their keys (never split at the first dot)."""
        return [PublishedTable.of(*parse_table_key(table_key(*name))) for name in self.names.values()]

    def keys(self) -> list[str]:
        return [table_key(*name) for name in self.names.values()]

    # --- rows ------------------------------------------------------------------------------
    def _table(self, role: str) -> sql.Identifier:
        return sql.Identifier(*self.names[role])

    def text(self) -> str:
        return self.rng.choice(TRICKY_TEXT) + (self.rng.choice(TRICKY_TEXT) if self.rng.random() < 0.3 else "")

    def changes(self, transactions: int, counts) -> None:
        """``transactions`` small seeded transactions over every shape's table."""
        conn = self.publisher.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                for _ in range(transactions):
                    for _ in range(self.rng.randint(1, 4)):
                        self.one(cur, counts)
                    conn.commit()
                    counts.transactions += 1
        finally:
            conn.close()

    def one(self, cur, counts) -> None:
        r = self.rng
        role = r.choice(list(self.names))
        table = self._table(role)
        if role == "foo":  # keyless, its only column text: one copy changes, or goes
            roll = r.random()
            if roll < 0.5:
                cur.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(table), [self.text()])
                counts.inserts += cur.rowcount
            else:
                one = sql.SQL("ctid = (SELECT ctid FROM {} WHERE v IS NOT DISTINCT FROM %s LIMIT 1)").format(table)
                if roll < 0.8:
                    cur.execute(sql.SQL("UPDATE {} SET v = %s WHERE ").format(table) + one, [self.text(), self.text()])
                    counts.updates += cur.rowcount
                else:
                    cur.execute(sql.SQL("DELETE FROM {} WHERE ").format(table) + one, [self.text()])
                    counts.deletes += cur.rowcount
            return
        column = sql.Identifier(self.text_column.get(role, "v" if role != "readded" else "c"))
        roll = r.random()
        if roll < 0.5:
            self.insert(cur, role, counts)
            return
        pick = sql.SQL("id = (SELECT id FROM {} WHERE id >= %s ORDER BY id LIMIT 1)").format(table)
        if roll < 0.85:
            cur.execute(sql.SQL("UPDATE {} SET {} = %s WHERE ").format(table, column) + pick,
                        [self.text(), r.randint(0, self.next_id)])
            counts.updates += cur.rowcount
        else:
            cur.execute(sql.SQL("DELETE FROM {} WHERE ").format(table) + pick, [r.randint(0, self.next_id)])
            counts.deletes += cur.rowcount

    def insert(self, cur, role: str, counts) -> None:
        self.next_id += 1
        table, column = self._table(role), sql.Identifier(self.text_column.get(role, "v" if role != "readded" else "c"))
        cur.execute(sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, %s)").format(table, column), [self.next_id, self.text()])
        counts.inserts += cur.rowcount
        if role in ("Foo", "readded"):  # the enum and the column that is dropped and added again, filled
            other = "s" if role == "Foo" else "b"
            value = self.rng.choice(["light", self.shade]) if role == "Foo" else self.rng.randint(0, 99)
            cur.execute(sql.SQL("UPDATE {} SET {} = %s WHERE id = %s").format(table, sql.Identifier(other)),
                        [value, self.next_id])

    # --- DDL -------------------------------------------------------------------------------
    def ddl(self, hook, counts) -> list[str]:
        """This round's DDL on the subscriber and the publisher, which must both be idle (the
        subscriber has replayed everything); returns what was done, for the round's report."""
        self.rounds += 1
        k = self.rounds
        done = []
        # column rename: followed by attnum
        old, new = self.text_column["renamed_cols"], f"a{k}"
        self._both(sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
            self._table("renamed_cols"), sql.Identifier(old), sql.Identifier(new)))
        self.text_column["renamed_cols"] = new
        done.append(f"renamed_cols.{old} -> {new}")
        # a dropped column added again: re-snapshotted
        self._both(sql.SQL("ALTER TABLE {t} DROP COLUMN b; ALTER TABLE {t} ADD COLUMN b int").format(
            t=self._table("readded")))
        done.append("readded.b dropped and added")
        # table renamed (upper case, a hyphen), then moved to the other schema: followed by OID
        schema, name = self.names["wanderer"]
        renamed, moved = f"Wander-{k}", "x.y" if schema == "public" else "public"
        self._both(sql.SQL("ALTER TABLE {} RENAME TO {}; ALTER TABLE {} SET SCHEMA {}").format(
            sql.Identifier(schema, name), sql.Identifier(renamed), sql.Identifier(schema, renamed),
            sql.Identifier(moved)))
        self.names["wanderer"] = (moved, renamed)
        done.append(f"{table_key(schema, name)} -> {table_key(moved, renamed)}")
        # an enum label renamed: re-snapshotted
        label = f"dark{k}"
        self._both(sql.SQL("ALTER TYPE shade RENAME VALUE {} TO {}").format(sql.Literal(self.shade), sql.Literal(label)))
        done.append(f"shade {self.shade} -> {label}")
        self.shade = label
        # a table dropped and created again with other columns: a new OID, re-snapshotted
        self.phoenix_layout = k % len(PHOENIX_LAYOUTS)
        columns = PHOENIX_LAYOUTS[self.phoenix_layout]
        self.text_column["phoenix"] = "note" if self.phoenix_layout == 1 else "old"
        recreate = sql.SQL("DROP TABLE phoenix; CREATE TABLE phoenix(id int PRIMARY KEY, " + columns + ")")
        self.subscriber.execute(recreate)
        self.publisher.execute(recreate)
        self._insert_into(["phoenix"] * 3, counts)  # rows the new table has before it is published again
        hook.add_publication_tables(PUBLICATION, [PublishedTable.of("public", "phoenix")])
        self._refresh_subscription()
        done.append(f"phoenix re-created ({columns})")
        # a change of each table after its DDL: a pull follows a column rename or drop with the
        # table's next change (an idle table's Iceberg columns keep their old names until then)
        self._insert_into(["renamed_cols", "readded", "wanderer", "Foo"], counts)
        return done

    def _insert_into(self, roles: list[str], counts) -> None:
        conn = self.publisher.connect(autocommit=True)
        try:
            with conn.cursor() as cur:
                for role in roles:
                    self.insert(cur, role, counts)
        finally:
            conn.close()

    def _both(self, statement: sql.Composable) -> None:
        for db in (self.subscriber, self.publisher):
            db.execute(statement)

    def _refresh_subscription(self) -> None:
        conn = self.subscriber.connect(autocommit=True)  # not inside a transaction block
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION").format(
                    sql.Identifier(self.subscription)))
        finally:
            conn.close()

