"""A seeded source workload for the reliability harness.

Everything random comes from one ``random.Random(seed)``: the same seed issues the same SQL.
Tables (identical DDL on the publisher and on the native subscriber):

- ``accounts``: composite primary key ``(tenant, id)``, every mapped type, a TOAST-able ``body``
  (columns are added to it mid-run);
- ``audit``: no key, ``REPLICA IDENTITY FULL`` (its rows never duplicate);
- ``bag``: no key, ``REPLICA IDENTITY FULL``, values from a small domain with NULLs, so identical
  rows abound: inserted (also several copies at once), one copy updated or deleted by ``ctid``,
  every copy of a value deleted, truncated; the native subscriber keeps it as a multiset;
- ``events``: partitioned by range of ``day`` (published with ``publish_via_partition_root``);
- ``specials``: values the lakehouse types cannot hold (``±infinity``, BC dates, year 294276, an
  array with lower bound 0, ``numeric`` NaN and ±Infinity), staged as PostgreSQL's exact text
  through :data:`TYPE_OVERRIDES`, and values of several MB in a ``SET STORAGE EXTERNAL`` column;
- ``orders``: a row filter ``region = 'EU'`` (``region`` is in the replica identity: a unique index
  on ``(id, region)`` used as ``REPLICA IDENTITY USING INDEX``), a column list that leaves out
  ``secret``, a compressed TOAST column ``body`` and a ``SET STORAGE EXTERNAL`` column ``note``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import uuid
from dataclasses import dataclass, field
from decimal import Decimal

from psycopg2 import sql

SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'ünïcødé');
CREATE TABLE accounts(
    tenant int NOT NULL, id bigint NOT NULL,
    flag bool, small int2, num int4, big int8, amount numeric(12,3), ratio float4, score float8,
    name text, code varchar(16), raw bytea, day date, seen timestamp, at timestamptz, uid uuid,
    doc jsonb, ints int[], tags text[], feeling mood, body text,
    PRIMARY KEY (tenant, id));
CREATE TABLE audit(who text, what text, n int, amount numeric(10,2), note text);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE INDEX audit_n ON audit(n);
CREATE TABLE bag(a int, b text, c numeric(6,2));
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE events(
    id bigint NOT NULL, day date NOT NULL, kind text, payload jsonb, body text, PRIMARY KEY (id, day)
) PARTITION BY RANGE (day);
CREATE TABLE events_h1 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-07-01');
CREATE TABLE events_h2 PARTITION OF events FOR VALUES FROM ('2026-07-01') TO ('2027-01-01');
CREATE TABLE orders(
    id bigint NOT NULL, region text NOT NULL, status text, total numeric(12,2), note text, body text, secret text);
CREATE UNIQUE INDEX orders_id_region ON orders(id, region);
ALTER TABLE orders REPLICA IDENTITY USING INDEX orders_id_region;
ALTER TABLE orders ALTER COLUMN note SET STORAGE EXTERNAL;
CREATE TABLE specials(id bigint PRIMARY KEY, ts timestamp, tstz timestamptz, d date, n numeric, arr int[], big text);
ALTER TABLE specials ALTER COLUMN big SET STORAGE EXTERNAL;
"""

#: publication -> (tables with column lists / filters, publish_via_partition_root)
PUBLICATIONS = {
    "rel_main": ([("accounts", None, None), ("audit", None, None), ("bag", None, None), ("specials", None, None)],
                 False),
    "rel_events": ([("events", None, None)], True),
    "rel_orders": ([("orders", ["id", "region", "status", "total", "note", "body"], "region = 'EU'")], False),
}
#: the publication whose rows the native subscriber may store with NULL TOAST cells (docs/toast.md)
FILTERED_PUBLICATION = "rel_orders"
FILTERED_TABLE = "orders"
FILTERED_KEY = ("id", "region")
FILTERED_COLUMNS = ("id", "region", "status", "total", "note", "body")
TOAST_COLUMNS = ("note", "body")

#: the columns whose values Spark cannot hold, staged as PostgreSQL's text (docs/types.md)
TYPE_OVERRIDES = {f"public.specials.{column}": "string" for column in ("ts", "tstz", "d", "arr")}
SPECIAL_VALUES = {
    "ts": ["infinity", "-infinity", "0044-03-15 12:00:00 BC", "294276-12-31 23:59:59", "1999-12-31 23:59:59.999999"],
    "tstz": ["infinity", "-infinity", "0044-03-15 12:00:00+00 BC", "294276-12-31 23:59:59+00", "2026-03-29 01:30:00+00"],
    "d": ["infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "2000-02-29"],
    "n": ["NaN", "Infinity", "-Infinity", "0.000000000000000000000000000001", "-123456789012345678901234567890.5"],
    "arr": ["[0:1]={7,8}", "[-2:-1]={1,NULL}", "{}", "{1,NULL,3}"],
}

REGIONS = ["EU", "US", "APAC"]
WORDS = ["alpha", "Ünïcødé", "日本語", "emoji 🚀", "quote ' and \" and \\", "tab\tnew\nline", "", "comma, {brace}",
         # text that COPY's and the CSV reader's rules touch: a leading byte order mark, COPY-escape
         # look-alikes, control characters, white space str.strip() knows and PostgreSQL does not
         "\ufeffbom", "\\N \\. \\x41 \\101", "ctl\x01\x08\x1b\x7f", "\x1cfs\x1f", "nbsp\xa0\u2028"]
MOODS = ["sad", "ok", "happy", "ünïcødé"]
ADDED_TYPES = ["int4", "text", "numeric(8,2)", "jsonb", "timestamptz", "bool"]


def toast_text(rng: random.Random, chunks: int = 200) -> str:
    """md5-based text (~32 chars × chunks): over 2 kB even after pglz compression."""
    salt = rng.getrandbits(64)
    return "".join(hashlib.md5(f"{salt}-{i}".encode()).hexdigest() for i in range(chunks))


@dataclass
class Counts:
    """What a workload issued (row changes of committed transactions, by kind)."""

    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    truncates: int = 0
    transactions: int = 0
    rollbacks: int = 0
    prepared_committed: int = 0
    prepared_rolled_back: int = 0
    big_transactions: int = 0
    key_changes: int = 0
    filter_crossings: int = 0
    added_columns: list = field(default_factory=list)

    @property
    def changes(self) -> int:
        return self.inserts + self.updates + self.deletes + self.truncates

    def add(self, other: "Counts") -> None:
        for name, value in vars(other).items():
            if isinstance(value, list):
                getattr(self, name).extend(value)
            else:
                setattr(self, name, getattr(self, name) + value)


class Workload:
    """Issues seeded transactions against the publisher (and DDL against both sides)."""

    def __init__(self, publisher, subscriber, seed: int) -> None:
        self.publisher = publisher
        self.subscriber = subscriber
        self.rng = random.Random(seed)
        self.next_id = 1
        self.added: dict[str, list[tuple[str, str]]] = {"accounts": [], "events": []}
        self.gid = 0

    # --- schema ----------------------------------------------------------------------------
    def create_schema(self) -> None:
        self.publisher.execute(SCHEMA)
        self.subscriber.execute(SCHEMA)

    def add_column(self, counts: Counts) -> str:
        """ALTER TABLE … ADD COLUMN on the subscriber first, then on the publisher."""
        table = self.rng.choice(["accounts", "events"])
        type_ = self.rng.choice(ADDED_TYPES)
        name = f"x{len(self.added['accounts']) + len(self.added['events'])}_{type_.split('(')[0]}"
        statement = sql.SQL("ALTER TABLE {} ADD COLUMN {} " + type_).format(sql.Identifier(table), sql.Identifier(name))
        for db in (self.subscriber, self.publisher):
            conn = db.connect()
            with conn.cursor() as cur:
                cur.execute(statement)
            conn.close()
        self.added[table].append((name, type_))
        counts.added_columns.append(f"{table}.{name} {type_}")
        return name

    # --- values ----------------------------------------------------------------------------
    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def maybe(self, value, null: float = 0.1):
        return None if self.rng.random() < null else value

    def text(self) -> str:
        r = self.rng
        return " ".join(r.choice(WORDS) for _ in range(r.randint(1, 4)))

    def body(self):
        roll = self.rng.random()
        if roll < 0.15:
            return toast_text(self.rng)
        if roll < 0.3:
            return None
        return self.text()

    def added_value(self, type_: str):
        r = self.rng
        if r.random() < 0.2:
            return None
        return {
            "int4": lambda: r.randint(-1000, 1000),
            "text": self.text,
            "numeric(8,2)": lambda: Decimal(r.randint(-99999, 99999)) / 100,
            "jsonb": lambda: json.dumps({"k": r.randint(0, 9), "s": self.text()}),
            "timestamptz": lambda: dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=r.randint(0, 10**7)),
            "bool": lambda: r.random() < 0.5,
        }[type_]()

    def account_row(self, tenant: int, id_: int) -> dict:
        r = self.rng
        row = {
            "tenant": tenant, "id": id_,
            "flag": self.maybe(r.random() < 0.5),
            "small": self.maybe(r.randint(-32768, 32767)),
            "num": self.maybe(r.randint(-2**31, 2**31 - 1)),
            "big": self.maybe(r.randint(-2**63, 2**63 - 1)),
            "amount": self.maybe(Decimal(r.randint(-10**12 + 1, 10**12 - 1)) / 1000),
            "ratio": self.maybe(r.randint(-1 << 20, 1 << 20) / 64.0),
            "score": self.maybe(r.uniform(-1e12, 1e12)),
            "name": self.maybe(self.text()),
            "code": self.maybe(self.text()[:16]),
            "raw": self.maybe(bytes(r.getrandbits(8) for _ in range(r.randint(0, 40)))),
            "day": self.maybe(dt.date(2000, 1, 1) + dt.timedelta(days=r.randint(0, 20000))),
            "seen": self.maybe(dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=r.randint(0, 10**15))),
            "at": self.maybe(dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=r.randint(0, 10**15))),
            "uid": self.maybe(str(uuid.UUID(int=r.getrandbits(128)))),
            "doc": self.maybe(json.dumps({"n": r.randint(0, 100), "t": self.text(), "a": [1, None, "x"]})),
            "ints": self.maybe([self.maybe(r.randint(-1000, 1000)) for _ in range(r.randint(0, 4))]),
            "tags": self.maybe([self.maybe(self.text()) for _ in range(r.randint(0, 3))]),
            "feeling": self.maybe(r.choice(MOODS)),
            "body": self.body(),
        }
        for name, type_ in self.added["accounts"]:
            row[name] = self.added_value(type_)
        return row

    def event_row(self, id_: int) -> dict:
        r = self.rng
        row = {"id": id_, "day": dt.date(2026, 1, 1) + dt.timedelta(days=r.randint(0, 364)),
               "kind": r.choice(["view", "buy", "ünï"]), "payload": self.maybe(json.dumps({"i": id_})),
               "body": self.body()}
        for name, type_ in self.added["events"]:
            row[name] = self.added_value(type_)
        return row

    # --- statements ------------------------------------------------------------------------
    @staticmethod
    def insert(cur, table: str, row: dict) -> int:
        statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, row)),
            sql.SQL(", ").join(sql.Placeholder() * len(row)))
        cur.execute(statement, list(row.values()))
        return cur.rowcount

    def target(self, table: str) -> tuple[str, list]:
        """A deterministic ``<key> = (SELECT <key> … LIMIT 1)`` condition picking an existing row."""
        r = self.rng
        start = r.randint(0, self.next_id)
        if table == "accounts":
            return ("(tenant, id) = (SELECT tenant, id FROM accounts WHERE tenant = %s AND id >= %s ORDER BY id LIMIT 1)",
                    [r.randint(1, 5), start])
        key = "n" if table == "audit" else "id"
        return f"{key} = (SELECT {key} FROM {table} WHERE {key} >= %s ORDER BY {key} LIMIT 1)", [start]

    def special_row(self, id_: int) -> dict:
        """A ``specials`` row: each column special, ordinary or NULL; now and then a value of MBs."""
        r = self.rng
        row = {"id": id_}
        for column, values in SPECIAL_VALUES.items():
            row[column] = self.maybe(r.choice(values), 0.2)
        row["big"] = self.big_value()
        return row

    def big_value(self):
        """Mostly short, sometimes 2-4 MB (uncompressible md5 text), sometimes NULL."""
        r = self.rng
        roll = r.random()
        if roll < 0.15:
            return toast_text(r, r.randint(65_000, 130_000))
        return None if roll < 0.3 else self.text()

    def special_op(self, cur, counts: Counts, *, fresh_only: bool = False) -> None:
        """Insert, update (one column, the MB value left unchanged unless it is the one) or delete."""
        r = self.rng
        roll = 0.0 if fresh_only else r.random()
        if roll < 0.45:
            counts.inserts += self.insert(cur, "specials", self.special_row(self._id()))
            return
        where = "id = (SELECT id FROM specials WHERE id >= %s ORDER BY id LIMIT 1)"
        start = r.randint(0, self.next_id)
        if roll < 0.9:
            column = r.choice([*SPECIAL_VALUES, "big"])
            value = self.big_value() if column == "big" else self.maybe(r.choice(SPECIAL_VALUES[column]), 0.2)
            cur.execute(sql.SQL("UPDATE specials SET {} = %s WHERE " + where).format(sql.Identifier(column)),
                        [value, start])
            counts.updates += cur.rowcount
        else:
            cur.execute("DELETE FROM specials WHERE " + where, [start])
            counts.deletes += cur.rowcount

    def bag_value(self) -> list:
        """A value of ``bag``'s small domain (24 distinct rows, NULLs included)."""
        r = self.rng
        return [r.choice([1, 2, 3, None]), r.choice(["x", "y", None]), r.choice([Decimal("1.50"), None])]

    def bag_op(self, cur, counts: Counts, *, fresh_only: bool = False) -> None:
        """Multiset changes of the keyless ``bag``: identical rows inserted, one copy changed."""
        r = self.rng
        roll = 0.0 if fresh_only else r.random()
        one_copy = ("ctid = (SELECT ctid FROM bag WHERE a IS NOT DISTINCT FROM %s AND b IS NOT DISTINCT FROM %s "
                    "AND c IS NOT DISTINCT FROM %s LIMIT 1)")
        if roll < 0.45:  # one or several identical copies at once
            cur.execute("INSERT INTO bag SELECT %s, %s, %s FROM generate_series(1, %s)",
                        [*self.bag_value(), r.choice([1, 1, 1, 2, 3])])
            counts.inserts += cur.rowcount
        elif roll < 0.7:  # one copy of a value changes into another value
            cur.execute("UPDATE bag SET a = %s, c = %s WHERE " + one_copy,
                        [r.choice([1, 2, 3, None]), r.choice([Decimal("1.50"), None]), *self.bag_value()])
            counts.updates += cur.rowcount
        elif roll < 0.93:  # one copy goes
            cur.execute("DELETE FROM bag WHERE " + one_copy, self.bag_value())
            counts.deletes += cur.rowcount
        else:  # every copy of a value goes
            cur.execute("DELETE FROM bag WHERE a IS NOT DISTINCT FROM %s AND b IS NOT DISTINCT FROM %s "
                        "AND c IS NOT DISTINCT FROM %s", self.bag_value())
            counts.deletes += cur.rowcount

    def one_op(self, cur, counts: Counts, *, fresh_only: bool = False) -> None:
        """One random row-level statement."""
        r = self.rng
        roll = r.random()
        if r.random() < 0.12:
            self.bag_op(cur, counts, fresh_only=fresh_only)
            return
        if r.random() < 0.04:
            self.special_op(cur, counts, fresh_only=fresh_only)
            return
        if fresh_only or roll < 0.35:
            table = r.choice(["accounts", "accounts", "audit", "events", "orders", "orders"])
            if table == "accounts":
                counts.inserts += self.insert(cur, "accounts", self.account_row(r.randint(1, 5), self._id()))
            elif table == "audit":
                counts.inserts += self.insert(cur, "audit", {
                    "who": self.maybe(self.text()), "what": r.choice(["a", "b", None]), "n": self._id(),
                    "amount": self.maybe(Decimal(r.randint(-10**5, 10**5)) / 100), "note": self.body()})
            elif table == "events":
                counts.inserts += self.insert(cur, "events", self.event_row(self._id()))
            else:
                counts.inserts += self.insert(cur, "orders", {
                    "id": self._id(), "region": r.choice(REGIONS), "status": r.choice(["new", "paid", None]),
                    "total": self.maybe(Decimal(r.randint(0, 10**7)) / 100),
                    "note": toast_text(r, 100) if r.random() < 0.3 else self.maybe(self.text()),
                    "body": toast_text(r) if r.random() < 0.3 else self.maybe(self.text()),
                    "secret": "s3cr3t"})
            return
        if roll < 0.55:  # plain updates leaving TOAST untouched
            table = r.choice(["accounts", "audit", "events", "orders"])
            if table == "accounts":
                where, args = self.target("accounts")
                cur.execute("UPDATE accounts SET num = %s, flag = NOT coalesce(flag, false), tags = tags || %s::text "
                            "WHERE " + where, [r.randint(0, 10**6), self.text(), *args])
            elif table == "audit":
                where, args = self.target("audit")
                cur.execute("UPDATE audit SET what = %s, amount = amount + 1 WHERE " + where,
                            [self.maybe(self.text()), *args])
            elif table == "events":
                where, args = self.target("events")
                cur.execute("UPDATE events SET kind = %s WHERE " + where, [self.text(), *args])
            else:
                where, args = self.target("orders")
                cur.execute("UPDATE orders SET status = %s, total = total + 1 WHERE " + where,
                            [r.choice(["paid", "sent", None]), *args])
            counts.updates += cur.rowcount
        elif roll < 0.65:  # filter-crossing updates: only region changes, TOAST untouched
            where, args = self.target("orders")
            cur.execute("UPDATE orders SET region = %s WHERE " + where, [r.choice(REGIONS), *args])
            counts.updates += cur.rowcount
            counts.filter_crossings += cur.rowcount
        elif roll < 0.72:  # key changes
            table = r.choice(["accounts", "events", "orders"])
            if table == "accounts":
                where, args = self.target("accounts")
                cur.execute("UPDATE accounts SET id = %s, tenant = %s WHERE " + where, [self._id(), r.randint(1, 5), *args])
            elif table == "events":  # may move the row to the other partition
                where, args = self.target("events")
                cur.execute("UPDATE events SET day = %s WHERE " + where,
                            [dt.date(2026, 1, 1) + dt.timedelta(days=r.randint(0, 364)), *args])
            else:
                where, args = self.target("orders")
                cur.execute("UPDATE orders SET id = %s WHERE " + where, [self._id(), *args])
            counts.updates += cur.rowcount
            counts.key_changes += cur.rowcount
        elif roll < 0.82:  # TOAST and NULL changes
            table = r.choice(["accounts", "orders", "events"])
            column = r.choice(["note", "body"]) if table == "orders" else "body"
            value = toast_text(r, r.choice([100, 200])) if r.random() < 0.5 else self.maybe(self.text(), 0.5)
            where, args = self.target(table)
            cur.execute(sql.SQL("UPDATE {t} SET {c} = %s WHERE ").format(t=sql.Identifier(table), c=sql.Identifier(column))
                        + sql.SQL(where), [value, *args])
            counts.updates += cur.rowcount
        else:  # deletes
            table = r.choice(["accounts", "audit", "events", "orders"])
            where, args = self.target(table)
            cur.execute(sql.SQL("DELETE FROM {} WHERE ").format(sql.Identifier(table)) + sql.SQL(where), args)
            counts.deletes += cur.rowcount

    def big_transaction(self, cur, counts: Counts, size: int) -> None:
        """Set-based statements: spills past logical_decoding_work_mem (64kB in tests)."""
        r = self.rng
        start = self.next_id + 1
        self.next_id += size
        kind = r.choice(["accounts", "events", "orders", "update"])
        if kind == "accounts":
            cur.execute(
                "INSERT INTO accounts(tenant, id, flag, num, amount, name, doc, ints, tags, feeling, body) "
                "SELECT g %% 5 + 1, g, g %% 2 = 0, g, g / 7.0, 'bulk ✓ ' || g, jsonb_build_object('g', g), "
                "ARRAY[g, NULL, -g], ARRAY['x' || g, NULL], (ARRAY['sad','ok','happy'])[g %% 3 + 1]::mood, "
                "CASE WHEN g %% 50 = 0 THEN repeat(md5(g::text), 150) END "
                "FROM generate_series(%s, %s) g", (start, start + size - 1))
            counts.inserts += cur.rowcount
        elif kind == "events":
            cur.execute("INSERT INTO events(id, day, kind, payload) SELECT g, DATE '2026-01-01' + (g %% 365), "
                        "'bulk', jsonb_build_object('g', g) FROM generate_series(%s, %s) g", (start, start + size - 1))
            counts.inserts += cur.rowcount
        elif kind == "orders":
            cur.execute("INSERT INTO orders(id, region, status, total, note, secret) SELECT g, "
                        "(ARRAY['EU','US','APAC'])[g %% 3 + 1], 'bulk', g / 100.0, "
                        "CASE WHEN g %% 40 = 0 THEN repeat(md5(g::text), 120) END, 'x' "
                        "FROM generate_series(%s, %s) g", (start, start + size - 1))
            counts.inserts += cur.rowcount
        else:
            cur.execute("UPDATE accounts SET big = coalesce(big, 0) / 2 + %s, small = NULL WHERE id %% 7 = %s",
                        (r.randint(0, 1000), r.randint(0, 6)))
            counts.updates += cur.rowcount
            cur.execute("UPDATE orders SET region = CASE region WHEN 'EU' THEN 'US' ELSE 'EU' END "
                        "WHERE id %% 13 = %s", (r.randint(0, 12),))
            counts.updates += cur.rowcount
            counts.filter_crossings += cur.rowcount
        counts.big_transactions += 1

    # --- a round ---------------------------------------------------------------------------
    def run(self, changes: int, *, add_column: bool = False, truncate: bool = False) -> Counts:
        """Issue at least ``changes`` committed row changes; returns what was done."""
        counts = Counts()
        r = self.rng
        conn = self.publisher.connect(autocommit=True)
        prepared: list[tuple[str, Counts]] = []
        ddl_at = r.randint(0, max(1, changes // 3)) if add_column else None
        truncate_at = r.randint(changes // 3, max(changes // 3 + 1, changes // 2)) if truncate else None
        try:
            with conn.cursor() as cur:
                while counts.changes < changes:
                    if ddl_at is not None and counts.changes >= ddl_at:
                        self._resolve(cur, prepared, counts)
                        self.add_column(counts)
                        ddl_at = None
                        for _ in range(20):  # use the new column right away
                            cur.execute("BEGIN")
                            self.one_op(cur, counts, fresh_only=True)
                            cur.execute("COMMIT")
                            counts.transactions += 1
                        continue
                    if truncate_at is not None and counts.changes >= truncate_at:
                        self._resolve(cur, prepared, counts)
                        table = r.choice(["audit", "bag", "events", "accounts"])
                        cur.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))
                        counts.truncates += 1
                        counts.transactions += 1
                        truncate_at = None
                        continue
                    roll = r.random()
                    if roll < 0.03:
                        cur.execute("BEGIN")
                        self.big_transaction(cur, counts, r.randint(300, min(3000, max(300, changes // 4))))
                        cur.execute("COMMIT")
                        counts.transactions += 1
                    elif roll < 0.08:  # a rolled-back transaction: must leave no trace
                        cur.execute("BEGIN")
                        scratch = Counts()
                        for _ in range(r.randint(1, 10)):
                            self.one_op(cur, scratch)
                        cur.execute("ROLLBACK")
                        counts.rollbacks += 1
                    elif roll < 0.12:  # two-phase: fresh inserts only (no lock on others' rows)
                        self.gid += 1
                        gid = f"rel_{id(self)}_{self.gid}"
                        pending = Counts()
                        cur.execute("BEGIN")
                        for _ in range(r.randint(1, 8)):
                            self.one_op(cur, pending, fresh_only=True)
                        cur.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
                        prepared.append((gid, pending))
                    else:
                        size = 1 if r.random() < 0.6 else r.randint(2, 30)
                        cur.execute("BEGIN")
                        for _ in range(size):
                            self.one_op(cur, counts)
                        cur.execute("COMMIT")
                        counts.transactions += 1
                    if prepared and r.random() < 0.3:
                        self._resolve(cur, prepared[:1], counts)
                        del prepared[:1]
                self._resolve(cur, prepared, counts)
        finally:
            conn.close()
        return counts

    def _resolve(self, cur, prepared: list, counts: Counts) -> None:
        for gid, pending in prepared:
            if self.rng.random() < 0.7:
                cur.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
                counts.add(pending)
                counts.transactions += 1
                counts.prepared_committed += 1
            else:
                cur.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                counts.prepared_rolled_back += 1
        prepared.clear()

    def load(self, rows: int) -> Counts:
        """Initial rows, before the slot and the subscription exist."""
        counts = Counts()
        conn = self.publisher.connect(autocommit=False)
        with conn.cursor() as cur:
            for _ in range(rows):
                self.one_op(cur, counts, fresh_only=True)
            self.big_transaction(cur, counts, max(100, rows))
        conn.commit()
        conn.close()
        return counts
