"""The vectorised window decode against the message-by-message assembler, on real pgoutput.

Both read the same peek of a real slot; every table they stage must be identical, cell by cell,
for a workload with every row-change shape a proto_version 1 peek carries.
"""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.decoding import staged_tables
from airflow_provider_pglogical.decoding import columnar
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.capture.peek import peek_window


def _window(hook, vectorised: bool):
    upto = Lsn.parse(hook.get_first("SELECT pg_current_wal_flush_lsn()::text")[0])
    return peek_window(hook.connect_kwargs(), "s1", ["pub"], upto, 1_000_000, None, vectorised=vectorised)


def _staged(hook, window) -> dict[str, list[dict]]:
    with hook.autocommit_cursor() as cursor:
        types = staged_tables.lookup_types(cursor, staged_tables.relations_of(window.tables))
    out = {}
    for batch in window.tables.values():
        rows = batch.build(types).to_pylist()
        out[batch.qualified_name] = sorted(rows, key=lambda r: (r[contract.COMMIT_LSN], r[contract.SEQ]))
    return out


WORKLOAD = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE kinds(id int PRIMARY KEY, t text, n numeric(12,3), ts timestamptz, b bytea, a int[], j jsonb,
                   u uuid, f bool, m mood, big text);
ALTER TABLE kinds ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE full_rows(a int, b text);
ALTER TABLE full_rows REPLICA IDENTITY FULL;
CREATE TABLE keyed(id int NOT NULL, region text NOT NULL, v text, note text);
CREATE UNIQUE INDEX keyed_key ON keyed(id, region);
ALTER TABLE keyed REPLICA IDENTITY USING INDEX keyed_key;
ALTER TABLE keyed ALTER COLUMN note SET STORAGE EXTERNAL;
INSERT INTO keyed VALUES (1, 'US', 'outside', repeat('x', 5000));
CREATE PUBLICATION pub FOR TABLE kinds, full_rows, keyed WHERE (region = 'EU');
"""

CHANGES = [
    "INSERT INTO kinds SELECT g, 'é ' || g, g / 7.0, '2024-02-29 12:00:00.123456+05', '\\x00ff'::bytea, "
    "ARRAY[g, NULL], '{\"k\": [1, \"two\"]}', gen_random_uuid(), g % 2 = 0, 'ok', repeat(md5(g::text), 100) "
    "FROM generate_series(1, 300) g",
    "INSERT INTO kinds(id) VALUES (1000)",  # NULLs everywhere
    "UPDATE kinds SET t = 'changed' WHERE id % 3 = 0",  # big stays as unchanged TOAST
    "UPDATE kinds SET id = id + 10000 WHERE id % 10 = 1",  # key change, old key sent
    "DELETE FROM kinds WHERE id % 5 = 2",
    "BEGIN; INSERT INTO full_rows VALUES (1, 'a'), (2, NULL); UPDATE full_rows SET b = 'bb' WHERE a = 1; "
    "DELETE FROM full_rows WHERE a = 2; SELECT pg_logical_emit_message(true, 'wm', 'inside'); COMMIT",
    "SELECT pg_logical_emit_message(false, 'loose', '\\xc3'::bytea)",
    "UPDATE keyed SET region = 'EU' WHERE id = 1",  # enters the filter: INSERT with unchanged TOAST
    "UPDATE keyed SET id = 2 WHERE id = 1",  # key change inside the filter
    "INSERT INTO keyed VALUES (3, 'EU', 'in', NULL), (4, 'US', 'out', NULL)",
    "UPDATE keyed SET region = 'US' WHERE id = 3",  # leaves the filter: DELETE
    "BEGIN; INSERT INTO kinds(id, t) VALUES (5000, 'before'); TRUNCATE kinds; "
    "INSERT INTO kinds(id, t) VALUES (5001, 'after'); COMMIT",
    "ALTER TABLE kinds ADD COLUMN extra int",
    "INSERT INTO kinds(id, t, extra) VALUES (6000, 'new shape', 42)",
    "UPDATE kinds SET t = 'new' WHERE id = 5001",
]


def test_vectorised_decode_stages_exactly_what_the_assembler_stages(publisher, publisher_hook):
    publisher.execute(WORKLOAD)
    publisher_hook.create_slot("s1")
    for statement in CHANGES:
        publisher.execute(statement)

    fast = _window(publisher_hook, vectorised=True)
    slow = _window(publisher_hook, vectorised=False)
    assert all(isinstance(t, columnar.ColumnarTable) for t in fast.tables.values())
    assert not any(isinstance(t, columnar.ColumnarTable) for t in slow.tables.values())

    for field in ("transaction_count", "last_end_lsn", "messages", "schema_changes", "rows", "bytes", "limited"):
        assert getattr(fast, field) == getattr(slow, field), field
    assert [m["prefix"] for m in fast.messages] == ["loose", "wm"]
    assert [c["table"] for c in fast.schema_changes] == ["public.kinds"]
    assert {t.qualified_name: t.truncated for t in fast.tables.values()} == {
        t.qualified_name: t.truncated for t in slow.tables.values()}

    fast_rows, slow_rows = _staged(publisher_hook, fast), _staged(publisher_hook, slow)
    assert fast_rows.keys() == {"public.kinds", "public.full_rows", "public.keyed"}
    for table in fast_rows:
        assert fast_rows[table] == slow_rows[table], table
    kinds = fast_rows["public.kinds"]
    # What the comparison covered, so it cannot pass on two empty tables.
    assert {r[contract.OP] for r in kinds} == {"I", "U", "D", "T"}
    assert any("big" in (r[contract.UNCHANGED] or []) for r in kinds)
    assert any(r[contract.OLD_KEY_PREFIX + "id"] is not None for r in kinds)
    keyed = fast_rows["public.keyed"]
    assert [r[contract.OP] for r in keyed] == ["I", "U", "I", "D"]
    assert keyed[0][contract.UNCHANGED] == ["note"]


def test_a_window_with_two_phase_messages_falls_back_to_the_assembler(publisher, publisher_hook):
    """A two_phase slot sends Begin Prepare / Prepare: the assembler takes the window."""
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    publisher.execute("SELECT pg_create_logical_replication_slot('s1', 'pgoutput', false, true)")
    publisher.execute("BEGIN; INSERT INTO t VALUES (1); PREPARE TRANSACTION 'g1'")
    publisher.execute("COMMIT PREPARED 'g1'")
    publisher.execute("INSERT INTO t VALUES (2)")
    window = _window(publisher_hook, vectorised=True)
    assert not any(isinstance(t, columnar.ColumnarTable) for t in window.tables.values())
    assert window.transaction_count == 2


@pytest.mark.parametrize("rows", [0, 1])
def test_an_empty_or_tiny_window_decodes(publisher, publisher_hook, rows):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    publisher_hook.create_slot("s1")
    if rows:
        publisher.execute("INSERT INTO t VALUES (1)")
    window = _window(publisher_hook, vectorised=True)
    assert window.transaction_count == rows
    assert [t.build({}).num_rows for t in window.tables.values()] == ([1] if rows else [])
