"""Compact and expire the Iceberg tables the apply job writes (a PySpark job; no Airflow import).

    spark-submit maintenance.py --catalog lake --namespace sales [--table orders ...] \\
        [--min-input-files 5] [--older-than-hours 24] [--retain-last 5]

For each table (default: every table of the namespace, the ``_pglogical_state`` table included)
it calls Iceberg's procedures in the order that frees most: ``rewrite_data_files`` (compacts the
small files a MERGE leaves and applies merge-on-read deletes), ``rewrite_position_delete_files``
(compacts what deletes remain, drops dangling ones), then ``expire_snapshots`` (removes the
snapshots, and the files only they referenced, older than the cut-off, keeping ``retain_last``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from airflow_provider_pglogical.spark.identifiers import qualified, quote, sql_string

RESULT_PREFIX = "PGLOGICAL_MAINTENANCE_RESULT "


def procedure_calls(catalog: str, table: str, *, min_input_files: int, older_than: dt.datetime,
                    retain_last: int) -> list[str]:
    """The ``CALL`` statements for one table (``namespace.table``), in order."""
    system = f"{quote(catalog)}.system"
    target = sql_string(table)
    options = f"map('min-input-files', '{int(min_input_files)}')"
    cut_off = older_than.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return [
        f"CALL {system}.rewrite_data_files(table => {target}, options => {options})",
        f"CALL {system}.rewrite_position_delete_files(table => {target}, options => {options})",
        f"CALL {system}.expire_snapshots(table => {target}, older_than => TIMESTAMP '{cut_off}', "
        f"retain_last => {int(retain_last)})",
    ]


def run(spark, catalog: str, namespace: str, tables: list[str] | None, *, min_input_files: int = 5,
        older_than_hours: float = 24, retain_last: int = 5) -> dict:
    """Run the procedures on each table; returns what each reported (file counts) per table."""
    if not tables:
        rows = spark.sql(f"SHOW TABLES IN {qualified(catalog, namespace)}").collect()
        tables = sorted(row.tableName for row in rows)
    older_than = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=older_than_hours)
    summary: dict = {"namespace": namespace, "tables": {}}
    for table in tables:
        results = {}
        for call in procedure_calls(catalog, qualified(namespace, table), min_input_files=min_input_files, older_than=older_than,
                                    retain_last=retain_last):
            procedure = call.split(".system.", 1)[1].split("(", 1)[0]
            row = spark.sql(call).first()
            results[procedure] = row.asDict() if row is not None else {}
        summary["tables"][table] = results
    return summary


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalog", default="lake")
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--table", action="append", dest="tables", help="a table of the namespace (repeatable)")
    parser.add_argument("--min-input-files", type=int, default=5)
    parser.add_argument("--older-than-hours", type=float, default=24.0)
    parser.add_argument("--retain-last", type=int, default=5)
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName(f"pglogical-maintenance-{args.namespace}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    summary = run(spark, args.catalog, args.namespace, args.tables, min_input_files=args.min_input_files,
                  older_than_hours=args.older_than_hours, retain_last=args.retain_last)
    print(RESULT_PREFIX + json.dumps(summary, default=str), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
