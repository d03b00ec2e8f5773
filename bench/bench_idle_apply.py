"""Benchmark of an idle apply tick: the apply task with nothing new staged, which starts no Spark.

    python bench/bench_idle_apply.py [--batches 100,1000,5000] [--repeat 5]

For each history size, commit that many small change batches under a fresh staging root (one
Parquet file and a manifest each, as pulls write them), record them in the apply marker as a
successful apply would, and time ``IcebergApplyOperator.execute`` until it ends as skipped. The
baseline, measured in the same run, is a bare ``spark-submit`` of an empty PySpark job: what the
idle tick cost before (the JVM start alone). Prints the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.support.environment import prepare  # noqa: E402

prepare()  # spark-submit beside this interpreter, Spark on loopback
os.environ.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))

from airflow.sdk import ObjectStoragePath  # noqa: E402
from airflow.sdk.exceptions import AirflowSkipException  # noqa: E402

from airflow_provider_pglogical.operators.iceberg_apply import IcebergApplyOperator  # noqa: E402
from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig  # noqa: E402
from airflow_provider_pglogical.staging.apply_marker import write_marker  # noqa: E402
from airflow_provider_pglogical.lsn import Lsn  # noqa: E402
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest  # noqa: E402
from airflow_provider_pglogical.staging.batches import BatchWriter
from tests.support.spark_jobs import bare_spark_submit_seconds  # noqa: E402


def stage(root, count: int) -> list[str]:
    names = []
    for i in range(count):
        start, end = Lsn(0x1000 + i * 0x100), Lsn(0x1000 + (i + 1) * 0x100)
        writer = BatchWriter(root, BatchManifest(pipeline="p", kind="changes", start_lsn=str(start), end_lsn=str(end)))
        writer.add_table(TableManifest(schema="public", name="t", columns=[], key=["id"]))
        writer.write_part("public.t", pa.table({"id": [i]}))
        writer.commit()
        names.append(writer.manifest.name)
    return names


def idle_tick(staging: str, warehouse: str) -> float:
    operator = IcebergApplyOperator(task_id="apply", staging_root=staging, pipeline="p",
                                    iceberg=IcebergConfig(warehouse=warehouse, namespace="bench"))
    started = time.perf_counter()
    try:
        operator.execute({})
    except AirflowSkipException:
        return time.perf_counter() - started
    raise RuntimeError("the idle tick did not skip")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="100,1000,5000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="a seconds-long run for CI; figures mean nothing")
    args = parser.parse_args()
    if args.tiny:
        args.batches, args.repeat = "20", 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        baseline = statistics.median(bare_spark_submit_seconds(tmp_path) for _ in range(args.repeat))
        print(f"bare spark-submit of an empty PySpark job: median {baseline:.2f} s")
        for count in [int(c) for c in args.batches.split(",")]:
            staging = (tmp_path / f"staging{count}").as_uri()
            warehouse = (tmp_path / "warehouse").as_uri()
            root = ObjectStoragePath(staging)
            names = stage(root, count)
            lakehouse = IcebergApplyOperator(task_id="x", staging_root=staging, pipeline="p",
                                             iceberg=IcebergConfig(warehouse=warehouse, namespace="bench"))
            write_marker(root, "p", lakehouse.lakehouse_identity(), names, targets={})
            runs = [idle_tick(staging, warehouse) for _ in range(args.repeat)]
            median = statistics.median(runs)
            print(f"idle apply tick, {count:>5} committed batches: median {median:.3f} s "
                  f"({median / baseline:.3f}x the bare spark-submit); runs {', '.join(f'{r:.3f}' for r in runs)}")


if __name__ == "__main__":
    main()
