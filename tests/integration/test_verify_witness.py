"""Issue 33, class 5 / invariant 15: ``verify`` is an independent witness.

PostgreSQL digests the published projection itself, so a row the capture loses or alters is a
difference even when the capture's own reader would have lost it too. Here the capture is
"broken" on purpose by changing the Iceberg tables behind the pipeline's back (a lost row whose
only column is ``''``, a lost keyed row, an extra row, a changed float sign, a value off by one
microsecond) and verify must name each; before that, a table of every type verifies equal.

One initial sync, one in-process apply, four Iceberg commits and two in-process comparisons in one
Spark session.
"""

from __future__ import annotations

import json
import os

import pytest
from airflow.sdk import ObjectStoragePath
from pyspark.sql import functions as F

from airflow_provider_pglogical.capture import source_projection
from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.verification.witness import verify_tables
from airflow_provider_pglogical.spark.jobs import apply_changes
from airflow_provider_pglogical.spark.jobs import verify_tables as verify_job
from airflow_provider_pglogical.lakehouse.staging_roots import storage_path
from airflow_provider_pglogical.staging.seam.apply_options import ApplyOptions
from tests.support.spark_jobs import reading_session

pytestmark = pytest.mark.spark

SOURCE = r"""
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE kinds (
    id int PRIMARY KEY, b bool, i2 int2, i8 int8, o oid, n numeric(12,4), nz numeric(38,10), nu numeric,
    f4 real, f8 float8, t text, vc varchar(10), c char(4), by bytea, d date, ts timestamp, tz timestamptz,
    tm time, tmz timetz, iv interval, u uuid, j json, jb jsonb, e mood,
    ta text[], fa float8[], ba bool[], da date[], ia int8[], tza timestamptz[], ca char(2)[]
);
INSERT INTO kinds VALUES
 (1, true, -32768, 9223372036854775807, 4294967295, -12345678.0001, 0, '1e-300', 'NaN', '-0', E'h\u00e9 "q" \\ \t\n',
  '', 'ab', '\x00ff10', '0044-03-15 BC', '2024-02-29 12:00:00.000001', '1969-12-31 23:59:59.999999+00',
  '24:00:00', '12:00:00+02', '1 year 2 mons -3 days 04:05:06.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '{"b": 1,  "a": [1, 2]}', '{"b": 1, "a": [1, 2]}', 'happy',
  '{"",NULL,"x,y","N"}', '{1.5,NULL,-0,Infinity,NaN}', '{t,f,NULL}', '{2024-01-01,NULL}', '{}',
  '{"2024-01-01 00:00:00+00"}', '{"a",NULL}'),
 (2, false, 0, 0, 0, 0, 0.0000000001, '-Infinity', 3.4028235e38, 1e-320, '', NULL, NULL, '', '5874897-12-31',
  '294246-12-31 23:59:59.999999', '4714-11-24 00:00:00+00 BC', '00:00:00', '00:00:00-12', 'P-1D',
  '00000000-0000-0000-0000-000000000000', '[]', '{}', 'sad', '{}', '{}', '{}', '{}', '{-1}', '{}', '{}'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
-- a keyless table whose only column holds '' (an empty COPY line): a multiset
CREATE TABLE words (w text);
ALTER TABLE words REPLICA IDENTITY FULL;
INSERT INTO words VALUES (''), (''), ('a'), (NULL), ('N'), ('0:');
CREATE TABLE spare (id int PRIMARY KEY, v text);
INSERT INTO spare VALUES (1, 'x');
CREATE PUBLICATION pub FOR TABLE kinds, words, spare;
"""
NAMESPACE = "witness"
TABLE_MAP = {"public.kinds": "kinds", "public.words": "words", "public.spare": "spare"}


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    session = reading_session(tmp_path_factory.mktemp("warehouse"), "test-verify-witness")
    yield session
    session.stop()


def verify(publisher_hook, root: ObjectStoragePath, spark) -> dict:
    """verify as the operator runs it, with the comparison job run in this process's Spark session."""
    tables = source_projection.source_tables(publisher_hook.published_tables(["pub"]), "lake", NAMESPACE,
                                             table_map=TABLE_MAP)

    def compare(plan: str) -> dict:
        # the directory the job writes source-derived rows under is private (0700), as staging is
        assert os.stat(storage_path(plan).parent.path).st_mode & 0o777 == 0o700
        return verify_job.run(spark, json.loads(storage_path(plan).read_text()))

    return verify_tables(publisher_hook.connect_kwargs(), tables, root, "p", compare)


def by_table(result: dict) -> dict[str, dict]:
    return {table["table"]: table for table in result["tables"]}


def test_verify_sees_what_the_capture_lost(publisher, publisher_hook, spark, tmp_path):
    publisher.execute(SOURCE)
    root = ObjectStoragePath(f"file://{tmp_path}/staging")
    run_initial_sync(publisher_hook, slot="s1", publications=["pub"], root=root, pipeline="p")
    apply_changes.run(spark, ApplyOptions(str(root), "p", catalog="lake", namespace=NAMESPACE,
                      table_map=TABLE_MAP))
    # What the capture staged is not the witness: whatever it did with '', the lakehouse must
    # hold the source's rows, read here by PostgreSQL and Spark only.
    spark.sql("INSERT OVERWRITE lake.witness.words SELECT w, row_number() OVER (PARTITION BY w ORDER BY w), 'x' "
              "FROM VALUES (''), (''), ('a'), (NULL), ('N'), ('0:') AS v(w)")

    equal = verify(publisher_hook, root, spark)
    assert equal["equal"], equal["summary"]
    assert by_table(equal)["public.kinds"]["source_rows"] == 3
    assert by_table(equal)["public.words"]["target_rows"] == 6
    assert not list((root / "_verify" / "p").iterdir())  # verify leaves nothing behind

    # the capture "loses" one of the two rows whose only column is ''
    spark.sql("DELETE FROM lake.witness.words WHERE w = '' AND _pglogical_occurrence = 2")
    # ... loses a keyed row, invents one, flips the sign of a -0 and moves an instant by 1 µs (one commit)
    kinds = spark.table("lake.witness.kinds")
    (kinds.where("id <> 3")
          .withColumn("f8", F.when(F.col("id") == 1, F.lit(0.0)).otherwise(F.col("f8")))
          .withColumn("tz", F.when(F.col("id") == 2, F.expr("tz + INTERVAL 1 MICROSECOND")).otherwise(F.col("tz")))
          .unionByName(kinds.where("id = 3").withColumn("id", F.lit(4)))
          .localCheckpoint().writeTo("lake.witness.kinds").overwritePartitions())
    # ... and a lakehouse column that is not the source's is named, not compared
    spark.sql("ALTER TABLE lake.witness.spare RENAME COLUMN v TO w")

    result = verify(publisher_hook, root, spark)
    assert not result["equal"]
    words, kinds = by_table(result)["public.words"], by_table(result)["public.kinds"]
    assert (words["source_rows"], words["target_rows"], words["missing_rows"], words["extra_rows"]) == (6, 5, 1, 0)
    assert words["only_in_source"] == [{"w": ""}] and words["only_in_target"] == []
    assert (kinds["source_rows"], kinds["target_rows"]) == (3, 3)
    assert (kinds["differing_keys"], kinds["missing_rows"], kinds["extra_rows"]) == (4, 3, 3)
    assert sorted(kinds["first_differing_keys"]) == [[1], [2], [3], [4]]
    assert sorted(row["id"] for row in kinds["only_in_source"]) == [1, 2, 3]
    assert sorted(row["id"] for row in kinds["only_in_target"]) == [1, 2, 4]
    assert "public.words: DIFFERENT" in result["summary"] and "1 row(s) only in the source" in result["summary"]
    spare = by_table(result)["public.spare"]
    assert not spare["equal"] and spare["problem"] == "v is missing in Iceberg, expected string"
