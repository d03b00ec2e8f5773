"""Compare a staged source snapshot with Iceberg tables: counts, hashes per key range, first diffs.

A PySpark job with no Airflow import (it ships like ``apply_changes.py``, with the zip of ``spark/``). The
Python side stages the source's published projection as a snapshot batch; this job reads that
batch and each target table, casts the source columns to the target's types, and compares:

- row counts;
- per key range (``--buckets`` buckets of ``xxhash64(key)``), the count and an order-independent
  hash (the sum of ``xxhash64`` over each row);
- for the buckets that differ, the first ``--limit`` keys missing, extra or changed.

It writes its summary as JSON to the Spark property ``spark.pglogical.resultUri`` (and prints it after
``PGLOGICAL_VERIFY_RESULT`` for people reading the log) and exits 0; the caller decides.

    spark-submit verify_tables.py --snapshot-dir file:///staging/p/_verify/X --tables '[...]'
"""

from __future__ import annotations

import argparse
import json
import sys

from airflow_provider_pglogical.spark.hadoop_files import write_result
from airflow_provider_pglogical.spark.identifiers import col

RESULT_PREFIX = "PGLOGICAL_VERIFY_RESULT "


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot-dir", required=True, help="the staged snapshot batch directory (URI)")
    parser.add_argument(
        "--tables", required=True,
        help='JSON list of {"source": "schema.table", "target": "catalog.ns.table", "files": [...], '
             '"columns": [...], "key": [...]}',
    )
    parser.add_argument("--buckets", type=int, default=64)
    parser.add_argument("--limit", type=int, default=10)
    return parser.parse_args(argv)


def compare_table(spark, snapshot_dir: str, spec: dict, buckets: int, limit: int) -> dict:
    from pyspark.sql import functions as F

    target_name = spec["target"]
    columns = spec["columns"]
    key = spec["key"]
    result: dict = {"table": spec["source"], "target": target_name}
    if not spark.catalog.tableExists(target_name):
        source_rows = spark.read.parquet(*[f"{snapshot_dir}/{f}" for f in spec["files"]]).count() if spec["files"] else 0
        result.update(source_rows=source_rows, target_rows=0, equal=source_rows == 0,
                      problem=f"target table {target_name} does not exist")
        return result
    target = spark.table(target_name)
    missing = [c for c in columns if c not in target.columns]
    if missing:
        result.update(equal=False, problem=f"target lacks column(s) {', '.join(missing)}")
        return result
    types = dict(target.dtypes)
    if spec["files"]:
        source = spark.read.parquet(*[f"{snapshot_dir}/{f}" for f in spec["files"]])
        source = source.select([col(c).cast(types[c]).alias(c) for c in columns])
    else:
        source = spark.createDataFrame([], target.select([col(c) for c in columns]).schema)
    target = target.select([col(c) for c in columns])

    def summarise(frame):
        row_hash = F.xxhash64(*[col(c) for c in columns])
        bucket = F.pmod(F.xxhash64(*[col(c) for c in key]), F.lit(buckets))
        return frame.groupBy(bucket.alias("bucket")).agg(
            F.count(F.lit(1)).alias("rows"), F.sum(row_hash.cast("decimal(38,0)")).alias("hash")
        )

    src = {r["bucket"]: (r["rows"], r["hash"]) for r in summarise(source).collect()}
    dst = {r["bucket"]: (r["rows"], r["hash"]) for r in summarise(target).collect()}
    differing = sorted(b for b in set(src) | set(dst) if src.get(b) != dst.get(b))
    result["source_rows"] = sum(v[0] for v in src.values())
    result["target_rows"] = sum(v[0] for v in dst.values())
    result["differing_buckets"] = len(differing)
    result["equal"] = not differing
    if differing:
        bucket = F.pmod(F.xxhash64(*[col(c) for c in key]), F.lit(buckets))
        in_diff = bucket.isin(differing)
        only_source = source.where(in_diff).exceptAll(target.where(in_diff))
        only_target = target.where(in_diff).exceptAll(source.where(in_diff))
        result["only_in_source"] = [_jsonable(r.asDict()) for r in only_source.limit(limit).collect()]
        result["only_in_target"] = [_jsonable(r.asDict()) for r in only_target.limit(limit).collect()]
        keys = {tuple(_jsonable(r[k]) for k in key) for r in result["only_in_source"] + result["only_in_target"]}
        result["first_differing_keys"] = sorted((list(k) for k in keys), key=str)[:limit]
    return result


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def main(argv: list[str]) -> int:
    from pyspark.sql import SparkSession

    args = parse_args(argv)
    spark = SparkSession.builder.appName("pglogical-verify").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    tables = json.loads(args.tables)
    results = [compare_table(spark, args.snapshot_dir, spec, args.buckets, args.limit) for spec in tables]
    summary = {"equal": all(r["equal"] for r in results), "tables": results}
    print(RESULT_PREFIX + json.dumps(summary, sort_keys=True), flush=True)  # for people reading the log
    write_result(spark, summary)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
