"""Compare Iceberg tables with PostgreSQL's own digests of the source: counts and digest sums per bucket.

A PySpark job with no Airflow import (it ships like ``apply_changes.py``, with the zip of ``spark/``).
The Python side (``capture/source_projection.py``) has PostgreSQL digest every published row over a
canonical text form of its values and sum the digests per bucket of key digests; this job digests
each Iceberg table's rows the same way from the Iceberg values alone (:func:`canonical`, in step with
``source_projection.canonical``), and compares per bucket the row count and the digest sums. For the
buckets that differ it writes the lakehouse's rows (digests and the row as JSON) to Parquet under
the plan's ``output`` directory, and PostgreSQL compares them with its own rows there.

It writes its summary as JSON to the Spark property ``spark.pglogical.resultUri`` (and prints it after
``PGLOGICAL_VERIFY_RESULT`` for people reading the log) and exits 0; the caller decides.

    spark-submit verify_tables.py --plan file:///staging/_verify/p/<id>/plan.json
"""

from __future__ import annotations

import argparse
import json
import sys

from airflow_provider_pglogical.spark.common.errors import job_error
from airflow_provider_pglogical.spark.common.hadoop_files import write_result
from airflow_provider_pglogical.spark.common.identifiers import col, qualified
from airflow_provider_pglogical.staging.seam.pg_types import SparkType

RESULT_PREFIX = "PGLOGICAL_VERIFY_RESULT "
#: hex digits of the key digest that name a bucket (``source_projection.BUCKET_DIGITS``)
BUCKET_DIGITS = 2


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True,
                        help='URI of a JSON file {"output": URI, "tables": [{"source", "target": [catalog, '
                             'namespace, table], "columns": [{"name", "type"}], "key", "keyed", "buckets"}]}')
    return parser.parse_args(argv)


# --- canonical forms: keep in step with capture/source_projection.py -----------------------------

def canonical(value, kind: "str | SparkType"):
    """The canonical text of a non-NULL Iceberg value of Spark type ``kind`` (see source_projection)."""
    from pyspark.sql import functions as F

    spark_type = kind if isinstance(kind, SparkType) else SparkType.parse(kind)
    kind = spark_type.kind
    if spark_type.is_array:
        element = spark_type.element
        return F.concat(F.lit("A"), F.array_join(F.transform(value, lambda e: element_text(e, element)), ""))
    if kind == "boolean":
        return F.when(value, F.lit("t")).otherwise(F.lit("f"))
    if kind == "decimal":  # plain digits with the scale's decimals, as PostgreSQL prints them (a cast may say 0E-10)
        return F.regexp_replace(F.format_number(value, spark_type.scale), ",", "")
    if kind in ("int", "bigint"):
        return value.cast("string")
    if kind in ("float", "double"):
        owner, method = ("java.lang.Float", "floatToRawIntBits") if kind == "float" else (
            "java.lang.Double", "doubleToRawLongBits")
        return F.when(F.isnan(value), F.lit("NaN")).otherwise(F.reflect(F.lit(owner), F.lit(method), value))
    if kind == "date":
        return F.unix_date(value).cast("string")
    if kind == "timestamp_ntz":  # microseconds of the wall-clock time read as UTC (the session is UTC)
        return F.unix_micros(value.cast("timestamp")).cast("string")
    if kind == "timestamp":
        return F.unix_micros(value).cast("string")
    if kind == "binary":
        return F.lower(F.hex(value))
    return value.cast("string")


def element_text(value, kind: "str | SparkType"):
    """``N`` for NULL, else ``<length>:<canonical text>``."""
    from pyspark.sql import functions as F

    text = canonical(value, kind)
    return F.when(value.isNull(), F.lit("N")).otherwise(F.concat(F.length(text).cast("string"), F.lit(":"), text))


def digests(frame, columns: dict[str, str], key: list[str], keyed: bool):
    """``kd``, ``rd`` and ``row`` (JSON) of each row of ``frame``; a keyless table's ``kd`` is its ``rd``."""
    from pyspark.sql import functions as F

    def digest(names):
        return F.md5(F.concat(F.lit(""), *[element_text(col(n), columns[n]) for n in names]).cast("binary"))

    row_digest = digest(list(columns))
    return frame.select(
        (digest(key) if keyed else row_digest).alias("kd"), row_digest.alias("rd"),
        F.to_json(F.struct(*[col(n) for n in columns])).alias("row"),
    )


def bucket_sums(frame) -> dict[str, list]:
    """Per bucket: rows, and the sums of two 60-bit slices of the row digests (as decimal text)."""
    from pyspark.sql import functions as F

    def part(start):
        return F.conv(F.substring("rd", start, 15), 16, 10).cast("decimal(20,0)")

    sums = frame.groupBy(F.substring("kd", 1, BUCKET_DIGITS).alias("bucket")).agg(
        F.count(F.lit(1)).alias("rows"), F.sum(part(1)).cast("string").alias("h1"),
        F.sum(part(16)).cast("string").alias("h2"))
    return {r["bucket"]: [r["rows"], r["h1"], r["h2"]] for r in sums.collect()}


def compare_table(spark, spec: dict, output: str) -> dict:
    """One table's verdict; the rows of the buckets that differ go to ``output`` (Parquet)."""
    from pyspark.sql import functions as F

    target_name = ".".join(spec["target"])
    columns = {c["name"]: c["type"] for c in spec["columns"]}
    source = {bucket: [int(rows), int(first), int(second)] for bucket, (rows, first, second) in spec["buckets"].items()}
    source_rows = sum(v[0] for v in source.values())
    result: dict = {"table": spec["source"], "target": target_name, "source_rows": source_rows}
    if not spark.catalog.tableExists(target_name):
        result.update(target_rows=0, equal=source_rows == 0, problem=f"target table {target_name} does not exist")
        return result
    table = spark.table(qualified(*spec["target"]))
    types = {name.lower(): kind for name, kind in table.dtypes}
    wrong = [f"{name} is {types.get(name.lower(), 'missing')} in Iceberg, expected {kind}"
             for name, kind in columns.items() if types.get(name.lower()) != kind]
    if wrong:
        result.update(target_rows=table.count(), equal=False, problem="; ".join(wrong))
        return result
    rows = digests(table, columns, spec["key"], spec["keyed"])
    target = {bucket: [n, int(first or 0), int(second or 0)]
              for bucket, (n, first, second) in bucket_sums(rows).items()}
    differing = sorted(b for b in set(source) | set(target) if source.get(b) != target.get(b))
    result.update(target_rows=sum(v[0] for v in target.values()), differing_buckets=len(differing),
                  equal=not differing)
    if differing:
        result["buckets"] = differing
        result["rows_at"] = output
        (rows.where(F.substring("kd", 1, BUCKET_DIGITS).isin(differing))
             .groupBy("kd", "rd").agg(F.count(F.lit(1)).alias("n"), F.min("row").alias("row"))
             .coalesce(1).write.mode("overwrite").parquet(output))
    return result


def run(spark, plan: dict) -> dict:
    """Compare every table of ``plan``; returns the summary (also usable in-process, by tests)."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    output = plan["output"].rstrip("/")
    results = [compare_table(spark, spec, f"{output}/table-{index}") for index, spec in enumerate(plan["tables"])]
    return {"equal": all(r["equal"] for r in results), "tables": results}


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    args = parse_args(argv)
    spark = SparkSession.builder.appName("pglogical-verify").getOrCreate()
    code = 0
    try:
        plan = json.loads(spark.read.text(args.plan, wholetext=True).first()[0])
        summary = run(spark, plan)
    except Exception as failure:  # the task raises the job's own error (errors.job_error)
        summary, code = {"equal": False, "tables": [], "error": job_error(failure).to_json()}, 1
    print(RESULT_PREFIX + json.dumps(summary, sort_keys=True), flush=True)  # for people reading the log
    write_result(spark, summary)
    spark.stop()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
