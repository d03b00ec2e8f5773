"""Issue 47's events for the reliability harness: changes to what the source publishes, at random.

Publication ``rel_published`` holds four small tables beside the workload's, changed by seeded
transactions; every round, before and between them, seeded events change what it publishes
without a row change in the stream (none, one or several per round):

- ``pe_rewrite``: ``ALTER COLUMN n TYPE int USING n + 1`` (same type: a rewrite), ``bigint`` and
  back ``USING``, or ``VACUUM FULL``;
- ``pe_filled``: a column added with ``DEFAULT random()`` then ``DROP DEFAULT``, or as an identity
  (the one added before is dropped first);
- ``pe_filtered``: the row filter widened or narrowed (``id % k <> 0`` for a seeded k), or changed
  and changed back between two pulls;
- ``pe_listed``: the column list gains or loses ``extra``.

The native subscriber does not follow them (it never copies a table again after ``ALTER
PUBLICATION`` or a rewrite), so it does not subscribe to this publication: the harness compares
these tables with the publisher's projection (``verify`` with the publisher as source).
"""

from __future__ import annotations

import random

from psycopg2 import sql

PUBLICATION = "rel_published"
TABLES = ("pe_rewrite", "pe_filled", "pe_filtered", "pe_listed")
SCHEMA = """
CREATE TABLE pe_rewrite(id int PRIMARY KEY, n int, s text);
CREATE TABLE pe_filled(id int PRIMARY KEY, v int);
CREATE TABLE pe_filtered(id int PRIMARY KEY, v int);
CREATE TABLE pe_listed(id int PRIMARY KEY, v int, extra text);
"""


class PublicationEvents:
    """Row changes on the event tables and the seeded events that change what they publish."""

    def __init__(self, publisher, rng: random.Random) -> None:
        self.publisher, self.rng = publisher, rng
        self.next_id = 0
        self.modulus = 3
        self.listed = False  # whether pe_listed's column list holds ``extra``
        self.filled = 0  # columns added to pe_filled so far
        self.done: list[str] = []  # this round's events
        self.history: list[str] = []  # every round's

    def create(self) -> None:
        self.publisher.execute(SCHEMA)
        self.publisher.execute(sql.SQL(
            "CREATE PUBLICATION {} FOR TABLE pe_rewrite, pe_filled, pe_filtered WHERE (id % 3 <> 0), "
            "pe_listed (id, v)").format(sql.Identifier(PUBLICATION)))

    def changes(self, transactions: int, counts) -> None:
        """Seeded inserts, updates and deletes over the four tables."""
        conn = self.publisher.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                for _ in range(transactions):
                    for _ in range(self.rng.randint(1, 5)):
                        self._one(cur, counts)
                    conn.commit()
                    counts.transactions += 1
        finally:
            conn.close()

    def _one(self, cur, counts) -> None:
        table = sql.Identifier(self.rng.choice(TABLES))
        roll = self.rng.random()
        if roll < 0.5 or self.next_id == 0:
            self.next_id += 1
            cur.execute(sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, %s)").format(
                table, sql.Identifier("n" if table.strings[0] == "pe_rewrite" else "v")),
                [self.next_id, self.rng.randint(0, 999)])
            counts.inserts += cur.rowcount
        elif roll < 0.85:
            column = sql.Identifier("n" if table.strings[0] == "pe_rewrite" else "v")
            cur.execute(sql.SQL("UPDATE {} SET {} = %s WHERE id = %s").format(table, column),
                        [self.rng.randint(0, 999), self.rng.randint(1, self.next_id)])
            counts.updates += cur.rowcount
        else:
            cur.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), [self.rng.randint(1, self.next_id)])
            counts.deletes += cur.rowcount

    def events(self) -> list[str]:
        """This round's events (seeded: none, one or several); returns what was done."""
        done = []
        for event in (self.rewrite, self.fill, self.filter, self.column_list):
            if self.rng.random() < 0.5:
                done.append(event())
        self.history += done
        return done

    def rewrite(self) -> str:
        kind = self.rng.choice(["using", "bigint", "vacuum"])
        if kind == "using":
            self.publisher.execute("ALTER TABLE pe_rewrite ALTER COLUMN n TYPE int USING n + 1")
            return "pe_rewrite.n USING n + 1"
        if kind == "bigint":
            self.publisher.execute("ALTER TABLE pe_rewrite ALTER COLUMN n TYPE bigint USING n * 2;"
                                   "ALTER TABLE pe_rewrite ALTER COLUMN n TYPE int USING n / 2 + 1")
            return "pe_rewrite.n bigint USING n * 2, back to int USING n / 2 + 1"
        self.publisher.execute("VACUUM FULL pe_rewrite")
        return "VACUUM FULL pe_rewrite"

    def fill(self) -> str:
        if self.filled:
            self.publisher.execute(f"ALTER TABLE pe_filled DROP COLUMN f{self.filled}")
        self.filled += 1
        if self.rng.random() < 0.5:
            self.publisher.execute(f"ALTER TABLE pe_filled ADD COLUMN f{self.filled} float8 DEFAULT random();"
                                   f"ALTER TABLE pe_filled ALTER COLUMN f{self.filled} DROP DEFAULT")
            return f"pe_filled.f{self.filled} filled by random()"
        self.publisher.execute(f"ALTER TABLE pe_filled ADD COLUMN f{self.filled} int GENERATED ALWAYS AS IDENTITY")
        return f"pe_filled.f{self.filled} an identity"

    def filter(self) -> str:
        old, self.modulus = self.modulus, self.rng.choice([k for k in (2, 3, 4, 5) if k != self.modulus])
        statement = "ALTER PUBLICATION {} SET TABLE pe_rewrite, pe_filled, pe_filtered WHERE (id % {} <> 0), {}"
        listed = "pe_listed (id, v, extra)" if self.listed else "pe_listed (id, v)"
        if self.rng.random() < 0.3:  # changed and changed back between two pulls, a row changed meanwhile
            self.publisher.execute(statement.format(PUBLICATION, self.modulus, listed))
            self.publisher.execute(f"UPDATE pe_filtered SET v = v + 1 WHERE id % {self.modulus} <> 0 "
                                   f"AND id % {old} = 0")
            self.publisher.execute(statement.format(PUBLICATION, old, listed))
            self.modulus = old
            return f"pe_filtered filter id % {old} widened or narrowed and back"
        self.publisher.execute(statement.format(PUBLICATION, self.modulus, listed))
        return f"pe_filtered filter id % {old} -> id % {self.modulus}"

    def column_list(self) -> str:
        self.listed = not self.listed
        listed = "pe_listed (id, v, extra)" if self.listed else "pe_listed (id, v)"
        self.publisher.execute(f"ALTER PUBLICATION {PUBLICATION} SET TABLE pe_rewrite, pe_filled, pe_filtered "
                               f"WHERE (id % {self.modulus} <> 0), {listed}")
        self.publisher.execute("UPDATE pe_listed SET extra = md5(id::text) WHERE extra IS NULL")
        return f"pe_listed column list {'gains' if self.listed else 'loses'} extra"
