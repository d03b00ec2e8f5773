"""Every table the apply writes reads right in engines that are not Spark, at every moment.

A change workload over every shape the apply handles (a keyed table, a composite key, key
changes, a keyless table with duplicates, unchanged TOAST values, deletes, a TRUNCATE, a column
added at the source) is pulled and applied round by round, one apply job run per round; after
each round, before any housekeeping, every table is read by DuckDB (its Iceberg extension from
the PyPI wheel, loaded offline) and by pyiceberg (the Hadoop-catalog table through its metadata
file) and must hold exactly the source's rows (read with psycopg2). No table holds an equality
delete (invariant 17): pyiceberg refuses them, and DuckDB 1.5.5 misread a keyless table's.

Parametrized by the tables' format version; the apply options of each version are in
``FORMATS``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.integration.sync_helpers import pull, synced
from tests.support.spark_jobs import reading_session

pytestmark = pytest.mark.spark

SOURCE = r"""
CREATE TABLE items (id int PRIMARY KEY, qty int, note text);
CREATE TABLE lines (order_id int, line text, qty int, PRIMARY KEY (order_id, line));
CREATE TABLE docs (id int PRIMARY KEY, qty int, doc text);
ALTER TABLE docs ALTER COLUMN doc SET STORAGE EXTERNAL;
CREATE TABLE bag (n int, s text);
ALTER TABLE bag REPLICA IDENTITY FULL;
CREATE TABLE events (id int PRIMARY KEY, kind text);
INSERT INTO items SELECT g, g, 'n' || g FROM generate_series(1, 30) g;
INSERT INTO lines SELECT g % 5, 'l' || g, g FROM generate_series(1, 20) g;
INSERT INTO docs SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1, 8) g;
INSERT INTO bag SELECT g % 3, CASE WHEN g % 4 > 0 THEN 's' || (g % 2) END FROM generate_series(1, 15) g;
INSERT INTO events SELECT g, 'e' || g FROM generate_series(1, 10) g;
"""
#: one round per entry: each changes every shape at least once over the rounds
ROUNDS = [
    # updates, a key change chain, a delete and a key inserted again; a composite key change;
    # TOAST left unchanged; a duplicate added and exactly one copy deleted
    """
    UPDATE items SET qty = -qty, note = NULL WHERE id <= 4;
    UPDATE items SET id = id + 100 WHERE id IN (5, 6);
    UPDATE items SET id = 206 WHERE id = 106;
    DELETE FROM items WHERE id IN (7, 8);
    INSERT INTO items VALUES (7, 70, 'again'), (31, 31, 'new');
    UPDATE lines SET line = line || 'x' WHERE order_id = 1;
    DELETE FROM lines WHERE order_id = 3;
    UPDATE docs SET qty = -qty WHERE id <= 3;
    UPDATE docs SET id = id + 100 WHERE id = 4;
    INSERT INTO bag SELECT * FROM bag WHERE n = 1;
    DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE n = 2 LIMIT 1);
    UPDATE bag SET s = 'changed' WHERE ctid = (SELECT ctid FROM bag WHERE s IS NULL LIMIT 1);
    UPDATE events SET kind = 'x' WHERE id = 1;
    """,
    # a TRUNCATE and rows after it; a column added at the source; kept TOAST under a moved key
    """
    TRUNCATE events;
    INSERT INTO events VALUES (1, 'after'), (2, 'after');
    ALTER TABLE items ADD COLUMN extra int;
    UPDATE items SET extra = id WHERE id BETWEEN 9 AND 12;
    INSERT INTO items VALUES (40, 40, 'with extra', 1);
    UPDATE docs SET qty = 0 WHERE id = 104;
    UPDATE lines SET qty = qty + 1;
    DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE n = 1 LIMIT 1);
    INSERT INTO bag VALUES (NULL, NULL), (NULL, NULL);
    """,
    # the same rows changed again (deletes of rows a row delta wrote), keyless rows emptied
    """
    UPDATE items SET qty = qty + 1 WHERE id IN (1, 7, 31, 40, 206);
    DELETE FROM items WHERE id = 105;
    UPDATE lines SET line = line || 'y' WHERE order_id = 1;
    UPDATE docs SET qty = qty + 1 WHERE id IN (1, 104);
    DELETE FROM bag WHERE n = 0;
    DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE n IS NULL LIMIT 1);
    DELETE FROM events WHERE id = 2;
    """,
]
#: per source table, the columns compared (docs' TOAST value by its digest)
COLUMNS = {"items": ["id", "qty", "note", "extra"], "lines": ["order_id", "line", "qty"],
           "docs": ["id", "qty", "doc"], "bag": ["n", "s"], "events": ["id", "kind"]}
#: per format version, the apply options that make it (v2: the default)
FORMATS = {2: {}, 3: {"format_version": 3}}


def source_rows(publisher, table: str) -> Counter:
    present = {row[0] for row in publisher.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))}
    columns = [name for name in COLUMNS[table] if name in present]
    rows = publisher.query(f"SELECT {', '.join(columns)} FROM {table}")
    return Counter(tuple(_digest(name, value) for name, value in zip(columns, row)) for row in rows)


def _digest(name: str, value):
    """A TOAST value compared by its MD5, so a mismatch prints short."""
    import hashlib

    return hashlib.md5(value.encode()).hexdigest() if name == "doc" and value is not None else value


def as_counter(columns: dict[str, list], names: list[str]) -> Counter:
    present = [name for name in names if name in columns]
    return Counter(tuple(_digest(name, value) for name, value in zip(present, row))
                   for row in zip(*(columns[name] for name in present)))


def duckdb_rows(connection, metadata: str, table: str) -> Counter:
    """The table as DuckDB's Iceberg extension reads it from its metadata file."""
    arrow = connection.execute("SELECT * FROM iceberg_scan(?)", [metadata]).to_arrow_table()
    return as_counter(arrow.to_pydict(), COLUMNS[table])


def pyiceberg_rows(metadata: str, table: str) -> Counter:
    """The table as pyiceberg reads it (the Hadoop catalog's table by its metadata file)."""
    from pyiceberg.table import StaticTable

    arrow = StaticTable.from_metadata(metadata).scan().to_arrow()
    return as_counter(arrow.to_pydict(), COLUMNS[table])


def duckdb_connection():
    """DuckDB with the Iceberg and Avro extensions of their PyPI wheels, loaded from the wheel
    (no download: the machines reach no extension repository)."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    connection = duckdb.connect(config={"autoinstall_known_extensions": "false",
                                        "autoload_known_extensions": "false"})
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        [path] = Path(module.__file__).parent.glob(f"extensions/v{duckdb.__version__}/{name}.duckdb_extension")
        connection.execute(f"LOAD '{path}'")
    return connection


def equality_deletes(spark, namespace: str, target: str) -> int:
    return spark.sql(f"SELECT count(*) AS n FROM lake.{namespace}.{target}.delete_files WHERE content = 2").first().n


@pytest.mark.parametrize("format_version", sorted(FORMATS))
def test_every_table_reads_as_the_source_in_duckdb_and_pyiceberg_after_every_round(
        format_version, publisher, publisher_hook, tmp_path):
    root = tmp_path / "staging"
    storage = synced(publisher, publisher_hook, root, SOURCE, list(COLUMNS))
    spark = reading_session(tmp_path / "warehouse", "test-open-tables")
    namespace = f"open_v{format_version}"
    connection = duckdb_connection()
    try:
        apply_changes.tune_session(spark)
        taken = set()
        for number, statements in enumerate(["", *ROUNDS]):
            if statements:
                publisher.execute(statements)
                pull(publisher_hook, storage)
            result = apply_changes.run(spark, ApplyOptions(root.as_uri(), "p", "lake", namespace,
                                                           **FORMATS[format_version]))
            paths = {step["table"]: step["path"] for step in result["steps"]}
            taken |= set(paths.values())
            for table in COLUMNS:
                source = f"public.{table}"
                metadata = result["targets"][f"public__{table}"]
                expected = source_rows(publisher, table)
                assert equality_deletes(spark, namespace, f"public__{table}") == 0, (number, table)
                assert duckdb_rows(connection, metadata, table) == expected, (number, table, paths.get(source))
                assert pyiceberg_rows(metadata, table) == expected, (number, table, paths.get(source))
        # the paths that delete rows ran: the driver's row deltas and the TRUNCATE's rewrite
        assert taken >= {"adopt", "rewrite", "row delta"}, taken
    finally:
        connection.close()
        spark.stop()
