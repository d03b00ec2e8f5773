"""The pure pieces of the copy on Spark: the plan the executors read, the driver's loop over units,
the files the operator adds to the manifest, and what is refused before anything is created."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_pglogical.capture import copy_job
from airflow_provider_pglogical.capture.snapshot import CopyPlan, WorkUnit, column_mapping, manifest_columns
from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.management.published import ColumnInfo, ResolvedTable
from airflow_provider_pglogical.operators.spark_copy import SparkCopy, _unit_error, add_files
from airflow_provider_pglogical.spark.launch import COPY_MEMBERS, job_bundle
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest


def table(name: str, keyed: bool) -> ResolvedTable:
    columns = [ColumnInfo("id", 1, 23, -1, "int4", "integer", None, True, keyed),
               ColumnInfo("note", 2, 25, -1, "text", "text", None, False, False)]
    return ResolvedTable(oid=16384, schema="public", name=name, relkind="r", replica_identity="d" if keyed else "f",
                         columns=columns, has_column_list=False, row_filter="id > 1" if keyed else None,
                         publications=["p"], publish={"insert", "update"})


def planned(tmp_path: Path) -> tuple[CopyPlan, BatchWriter]:
    orders, events = table("orders", True), table("events", False)
    writer = BatchWriter(tmp_path, BatchManifest(pipeline="p", kind="snapshot", start_lsn="0/10", end_lsn="0/10"))
    for t in (orders, events):
        writer.add_table(TableManifest(schema=t.schema, name=t.name, columns=manifest_columns(t), key=t.key,
                                       replica_identity=t.replica_identity, keyless=t.keyless))
    units = [WorkUnit(orders, ("public", "orders"), 0, 100, 100), WorkUnit(events, ("public", "events"), 0, None, 80),
             WorkUnit(orders, ("public", "orders"), 100, None, 60)]
    plan = CopyPlan(units, {t.qualified_name: column_mapping(t) for t in (orders, events)},
                    {t.qualified_name: t.qualified_name for t in (orders, events)}, True, {"public.orders": "id < 9"})
    return plan, writer


def test_the_plan_gives_the_executors_the_same_units_with_their_part_numbers(tmp_path):
    plan, writer = planned(tmp_path)
    document = json.loads(json.dumps(copy_job.plan_document(plan, writer, str(tmp_path), "snap-1", 2, "r.json")))
    units = copy_job.work_units(document)
    assert [unit for unit, _part in units] == plan.units
    assert [part for _unit, part in units] == [0, 0, 1]  # numbered per table
    assert document["extra_where"] == {"public.orders": "id < 9"} and document["snapshot"] == "snap-1"
    # an executor's writer names the unit's file as the operator's writer would
    executor = copy_job._writer(document)
    with executor.part_writer("public.orders", pa.schema([("id", pa.int32())]), 1) as out:
        out.write_batch(pa.record_batch([pa.array([2, 3], pa.int32())], names=["id"]))
    entry = executor.manifest.tables["public.orders"].files[0]
    assert entry.path == "table0000-part00001.parquet" and entry.rows == 2
    assert pq.read_table(tmp_path / "p" / writer.manifest.name / entry.path).num_rows == 2


def outcome(unit: int, table: str, part: int, rows: int) -> dict:
    return {"unit": unit, "table": table, "staged_as": table, "rows": rows, "bytes": rows * 10,
            "file": {"path": f"table0000-part{part:05d}.parquet", "rows": rows, "size": 1, "sha256": "x"}}


def test_the_driver_reports_each_finished_unit_and_stops_at_the_first_failure(tmp_path):
    plan, writer = planned(tmp_path)
    document = copy_job.plan_document(plan, writer, str(tmp_path), "snap", 1, "r.json")
    lines: list[str] = []
    ran: list[int] = []
    cancelled: list[bool] = []

    def run_one(index: int) -> dict:
        ran.append(index)
        if index == 1:
            return {"unit": 1, "error": {"type": "UnrepresentableValue", "message": "NaN in total", "permanent": True}}
        return outcome(index, "public.orders", index, 5)

    result = copy_job.run_units(document, run_one, lines.append, cancel=lambda: cancelled.append(True))
    assert result["error"] == {"type": "UnrepresentableValue", "message": "NaN in total", "permanent": True,
                               "table": "public.events", "blocks": [0, None]}
    assert ran == [0, 1] and cancelled == [True] and len(result["files"]) == 1  # unit 2 never started
    assert any(line.startswith("public.orders: 5 rows") and "rows/s" in line for line in lines)
    error = _unit_error(result["error"])
    assert error.permanent and str(error).startswith(
        "the snapshot copy on Spark failed in public.events (blocks 0 to the end): UnrepresentableValue: NaN in total")


def test_the_operator_records_the_units_files_in_name_order(tmp_path):
    _plan, writer = planned(tmp_path)
    rows = add_files(writer, [outcome(2, "public.orders", 1, 4), outcome(0, "public.orders", 0, 3)], lambda _: None)
    assert rows == {"public.orders": 7}
    orders = writer.manifest.tables["public.orders"]
    assert [f.path for f in orders.files] == ["table0000-part00000.parquet", "table0000-part00001.parquet"]
    assert orders.rows == 7
    assert writer.manifest.details["spark_copy"] == {"units": 2, "peak_python_worker_mb": 0.0}


class _ObjectStore:
    protocol = "s3"

    def __str__(self) -> str:
        return "s3://aws@bucket/staging"


def test_an_object_store_staging_root_is_refused_before_anything_is_created():
    with pytest.raises(InvalidInputError, match=r"PgInitialSyncOperator 'snap': copy_on_spark needs a staging root "
                                                r"the Spark executors reach as a local path .* not s3://aws@bucket/staging"):
        SparkCopy().copier({"password": "x"}, _ObjectStore(), 2, "PgInitialSyncOperator 'snap'")


def test_the_copy_bundle_imports_the_job_without_airflow(tmp_path):
    bundle = job_bundle(tmp_path, members=COPY_MEMBERS)
    names = zipfile.ZipFile(bundle).namelist()
    assert "airflow_provider_pglogical/capture/copy_job.py" in names
    assert not [n for n in names if "/operators/" in n or "/hooks/" in n]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import airflow_provider_pglogical.capture.copy_job as job; "
            "assert job.__file__.startswith(sys.argv[1]), job.__file__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'airflow'))")
    done = subprocess.run([sys.executable, "-E", "-c", code, str(bundle)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
