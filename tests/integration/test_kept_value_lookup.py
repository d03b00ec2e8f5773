"""A value an UPDATE left unchanged (TOAST, not sent) is filled from the row the lakehouse holds,
read through Iceberg's own reader (``spark/lookups/table_rows.py``), whatever shape the table's
files have: a key widened from int to bigint, a data file without field ids (name mapping), a row
replaced under an equality delete (as earlier versions wrote them; housekeeping then converts the
table) and under a position delete.

Each test stages a real change batch (every row's ``qty`` updated, ``doc`` left unchanged and
out of line), prepares an Iceberg table holding the source's rows in that shape with Spark and
Iceberg's own writers, asserts the exact values the lookup finds, applies the batch as a row
delta, and compares the table (read by Spark) with the source (read by psycopg2).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.spark.common.hadoop_files import Staging
from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping
from airflow_provider_pglogical.spark.jobs import maintenance
from airflow_provider_pglogical.spark.apply.lakehouse_tables import Lakehouse
from airflow_provider_pglogical.spark.lookups.table_rows import lookup_rows
from airflow_provider_pglogical.spark.apply.plan import Batch, Step
from airflow_provider_pglogical.spark.paths.choice import ApplyPath, choose_path, table_facts
from airflow_provider_pglogical.spark.row_delta.row_deltas import RowDeltas, ineligible
from tests.integration.sync_helpers import pull, synced
from tests.support.spark_jobs import reading_session

BIG = 5_000_000_000  # a key beyond int: only a bigint holds it
SOURCE = f"""
CREATE TABLE docs (id bigint PRIMARY KEY, qty int, doc text);
ALTER TABLE docs ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO docs SELECT g, g, repeat(md5(g::text), 300) FROM generate_series(1, 4) g;
INSERT INTO docs VALUES ({BIG}, 5, repeat(md5('big'), 300));
"""
MERGE_ON_READ = ("TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
                 "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')")


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = reading_session(tmp_path_factory.mktemp("warehouse"), "test-kept-value-lookup")
    yield session
    session.stop()


def source_rows(publisher) -> list[tuple]:
    return sorted(publisher.query("SELECT id, qty, md5(doc) FROM docs"))


def lakehouse_rows(spark, name: str) -> list[tuple]:
    return sorted(tuple(row) for row in spark.sql(f"SELECT id, qty, md5(doc) FROM {name}").collect())


class Case:
    """One namespace's ``public__docs`` and the staged batch that updates every row's qty."""

    def __init__(self, spark, publisher, publisher_hook, tmp_path, namespace: str) -> None:
        self.spark, self.publisher, self.namespace = spark, publisher, namespace
        storage = synced(publisher, publisher_hook, tmp_path / "staging", SOURCE, ["docs"])
        self.docs = dict(publisher.query("SELECT id, doc FROM docs"))
        self.before = sorted(publisher.query("SELECT id, qty, doc FROM docs"))
        publisher.execute("UPDATE docs SET qty = qty + 10")
        self.staging = Staging(spark, (tmp_path / "staging").as_uri(), "p")
        self.batch = Batch.parse(pull(publisher_hook, storage))
        self.batch.manifest = self.staging.read_manifest(self.batch)
        self.lakehouse = Lakehouse(spark, "lake", namespace, "merge-on-read", None)
        self.name = self.lakehouse.name("public__docs")
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS lake.{namespace}")

    def rows(self, ids=None, doc=None):
        """The source's rows before the update (``doc`` instead of the source's, when given)."""
        return [(i, qty, doc if doc is not None else value) for i, qty, value in self.before if ids is None or i in ids]

    def append(self, rows, schema: str = "id bigint, qty int, doc string") -> None:
        self.spark.createDataFrame(rows, schema).writeTo(self.name).append()

    def looked_up(self) -> dict:
        table = self.lakehouse.iceberg_table("public__docs")
        return lookup_rows(self.spark, table, table.currentSnapshot().snapshotId(), "id", ["doc"],
                           [*self.docs, 999], self.name)

    def apply(self) -> None:
        """The batch as a row delta (it keeps ``doc`` unchanged, so ``doc`` is looked up by key)."""
        manifest = self.batch.manifest.tables["public.docs"]
        types = {f.name: f.dataType.simpleString() for f in self.spark.table(self.name).schema.fields}
        assert manifest.change_facts.unchanged and ineligible(manifest, types, 0) is None
        deltas = RowDeltas(self.spark, self.staging, self.lakehouse)
        table = deltas.load("public__docs")
        assert choose_path(Step("changes", self.batch, 0), table_facts("public.docs", table, types, True)).path \
            is ApplyPath.ROW_DELTA
        deltas.apply(table, "public__docs", self.staging.files(self.batch, "public.docs"), manifest, types,
                     self.batch.name)
        assert lakehouse_rows(self.spark, self.name) == source_rows(self.publisher)


@pytest.mark.spark
def test_kept_value_found_under_a_key_widened_from_int_to_bigint(spark, publisher, publisher_hook, tmp_path):
    case = Case(spark, publisher, publisher_hook, tmp_path, "widened")
    spark.sql(f"CREATE TABLE {case.name} (id int, qty int, doc string) USING iceberg {MERGE_ON_READ}")
    case.append([row for row in case.rows() if row[0] != BIG], "id int, qty int, doc string")  # int32 keys
    spark.sql(f"ALTER TABLE {case.name} ALTER COLUMN id TYPE bigint")  # Iceberg's type promotion
    case.append(case.rows({BIG}))  # a key only a bigint holds, in a file written after
    assert case.looked_up() == {key: (doc,) for key, doc in case.docs.items()}
    case.apply()


@pytest.mark.spark
def test_kept_value_found_in_a_data_file_without_field_ids(spark, publisher, publisher_hook, tmp_path):
    case = Case(spark, publisher, publisher_hook, tmp_path, "mapped")
    spark.sql(f"CREATE TABLE {case.name} (id bigint, qty int, doc string) USING iceberg {MERGE_ON_READ}")
    files = tmp_path / "plain"
    files.mkdir()
    rows = case.rows()
    pq.write_table(pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "qty": pa.array([r[1] for r in rows],
                             pa.int32()), "doc": [r[2] for r in rows]}), files / "docs.parquet")  # no field ids
    assert pq.read_schema(files / "docs.parquet").field("id").metadata is None
    spark.sql(f"CALL lake.system.add_files(table => '{case.namespace}.public__docs', "
              f"source_table => '`parquet`.`{files.as_uri()}`')")  # sets the table's name mapping
    properties = spark.sql(f"SHOW TBLPROPERTIES {case.name}").collect()
    assert any(row.key == "schema.name-mapping.default" for row in properties)
    assert case.looked_up() == {key: (doc,) for key, doc in case.docs.items()}
    case.apply()


@pytest.mark.spark
def test_kept_value_found_under_an_equality_delete(spark, publisher, publisher_hook, tmp_path):
    case = Case(spark, publisher, publisher_hook, tmp_path, "equality")
    spark.sql(f"CREATE TABLE {case.name} (id bigint, qty int, doc string) USING iceberg {MERGE_ON_READ}")
    case.append(case.rows(set(case.docs) - {BIG}) + case.rows({BIG}, doc="stale"))
    # an equality delete of key BIG written by Iceberg's generic writer, then the row again
    jvm, table = spark._jvm, case.lakehouse.iceberg_table("public__docs")
    schema = table.schema()
    ids = spark.sparkContext._gateway.new_array(jvm.int, 1)
    ids[0] = schema.findField("id").fieldId()
    key_schema = schema.select(["id"])
    factory = jvm.org.apache.iceberg.data.GenericAppenderFactory(schema, table.spec(), ids, key_schema, None)
    output = jvm.org.apache.iceberg.encryption.EncryptedFiles.plainAsEncryptedOutput(
        table.io().newOutputFile(table.locationProvider().newDataLocation("equality-delete.parquet")))
    writer = factory.newEqDeleteWriter(output, jvm.org.apache.iceberg.FileFormat.PARQUET, None)
    key = jvm.org.apache.iceberg.data.GenericRecord.create(key_schema)
    key.setField("id", BIG)  # py4j passes a Java long: BIG is beyond int
    writer.write(key)
    writer.close()
    table.newRowDelta().addDeletes(writer.toDeleteFile()).commit()
    case.append(case.rows({BIG}))
    deletes = spark.sql(f"SELECT content FROM {case.name}.delete_files").collect()
    assert [row.content for row in deletes] == [2]  # equality deletes
    assert case.looked_up() == {key: (doc,) for key, doc in case.docs.items()}
    case.apply()
    # housekeeping converts a table holding equality deletes (as earlier versions wrote them): its
    # compaction applies them, then the equality delete files left applying to nothing are removed,
    # and a reader that refuses equality deletes (pyiceberg) reads the table
    done = maintenance.run(spark, "lake", "equality", ["public__docs"],
                           Housekeeping(expire_snapshots=False, remove_orphan_files=False))
    # which step drops the applied equality delete depends on Iceberg: 1.10's rewrite_data_files
    # (remove-dangling-deletes) does; 1.9 keeps it in an unpartitioned table, and ours removes it
    assert done["tables"]["public__docs"]["remove_dead_deletes"]["removed_equality_delete_files_count"] in (0, 1)
    assert spark.sql(f"SELECT count(*) AS n FROM {case.name}.delete_files WHERE content = 2").first().n == 0
    assert lakehouse_rows(spark, case.name) == source_rows(publisher)
    from pyiceberg.table import StaticTable

    metadata = case.lakehouse.iceberg_table("public__docs").operations().current().metadataFileLocation()
    read = StaticTable.from_metadata(metadata).scan(selected_fields=("id", "qty")).to_arrow()
    assert sorted(zip(*read.to_pydict().values())) == [(i, qty) for i, qty, _ in source_rows(publisher)]


@pytest.mark.spark
def test_kept_value_found_under_a_position_delete(spark, publisher, publisher_hook, tmp_path):
    case = Case(spark, publisher, publisher_hook, tmp_path, "position")
    spark.sql(f"CREATE TABLE {case.name} (id bigint, qty int, doc string) USING iceberg {MERGE_ON_READ}")
    case.append(case.rows(set(case.docs) - {3}) + case.rows({3}, doc="stale"))
    spark.sql(f"DELETE FROM {case.name} WHERE id = 3")  # merge-on-read: a position delete
    case.append(case.rows({3}))
    deletes = spark.sql(f"SELECT content FROM {case.name}.delete_files").collect()
    assert [row.content for row in deletes] == [1]  # position deletes
    assert case.looked_up() == {key: (doc,) for key, doc in case.docs.items()}
    # keys the table does not hold (new keys, a pipeline's first state read): no row, no error
    table = case.lakehouse.iceberg_table("public__docs")
    assert lookup_rows(spark, table, table.currentSnapshot().snapshotId(), "id", ["doc"], [997, 998], case.name,
                       positions=True) == {}
    case.apply()


PAIRS = """
CREATE TABLE pairs (id bigint NOT NULL, region text NOT NULL, qty int, doc text, PRIMARY KEY (id, region));
ALTER TABLE pairs ALTER COLUMN doc SET STORAGE EXTERNAL;
INSERT INTO pairs SELECT g, r, g, repeat(md5(g::text || r), 300)
    FROM generate_series(1, 4) g, unnest(ARRAY['EU', 'US']) r;
"""


@pytest.mark.spark
def test_kept_values_found_under_a_composite_key_and_its_key_changes(spark, publisher, publisher_hook, tmp_path):
    """A composite key is narrowed column by column (``in`` on id, ``in`` on region): the read
    finds every combination of the wanted values, (1, 'US') beside the wanted (1, 'EU'); only the
    wanted pairs may lend their values. One row also changes its key, keeping its TOAST value."""
    storage = synced(publisher, publisher_hook, tmp_path / "staging", PAIRS, ["pairs"])
    before = publisher.query("SELECT id, region, qty, doc FROM pairs")
    publisher.execute("UPDATE pairs SET qty = qty + 10 WHERE (id, region) IN ((1, 'EU'), (2, 'US'), (3, 'EU'))")
    publisher.execute("UPDATE pairs SET region = 'APAC' WHERE (id, region) = (4, 'US')")  # a key change
    staging = Staging(spark, (tmp_path / "staging").as_uri(), "p")
    batch = Batch.parse(pull(publisher_hook, storage))
    batch.manifest = staging.read_manifest(batch)
    manifest = batch.manifest.tables["public.pairs"]
    lakehouse = Lakehouse(spark, "lake", "pairs", "merge-on-read", None)
    name = lakehouse.name("public__pairs")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.pairs")
    spark.sql(f"CREATE TABLE {name} (id bigint, region string, qty int, doc string) USING iceberg {MERGE_ON_READ}")
    spark.createDataFrame(before, "id bigint, region string, qty int, doc string").writeTo(name).append()
    table = lakehouse.iceberg_table("public__pairs")

    wanted = [(1, "EU"), (2, "US"), (4, "US"), (9, "EU")]  # (9, 'EU') is in no snapshot
    found = lookup_rows(spark, table, table.currentSnapshot().snapshotId(), ["id", "region"], ["doc"], wanted, name)
    docs = {(i, r): doc for i, r, _q, doc in before}
    assert found == {pair: (docs[pair],) for pair in wanted[:3]}

    types = {f.name: f.dataType.simpleString() for f in spark.table(name).schema.fields}
    assert manifest.key == ["id", "region"] and manifest.change_facts.unchanged
    assert ineligible(manifest, types, 0) is None  # a composite key takes the row delta
    deltas = RowDeltas(spark, staging, lakehouse)
    deltas.apply(deltas.load("public__pairs"), "public__pairs", staging.files(batch, "public.pairs"), manifest, types,
                 batch.name)
    columns = "id, region, qty, md5(doc)"
    assert sorted(tuple(row) for row in spark.sql(f"SELECT {columns} FROM {name}").collect()) == \
        sorted(publisher.query(f"SELECT {columns} FROM pairs"))
