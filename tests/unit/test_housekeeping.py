"""IcebergMaintenanceOperator and the job's Iceberg procedure calls, without running Spark (the
procedures run for real in tests/integration/test_iceberg_apply.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from airflow_provider_pglogical.lakehouse.iceberg_config import IcebergConfig
from airflow_provider_pglogical.operators.iceberg_maintenance import MAINTENANCE_JOB, IcebergMaintenanceOperator
from airflow_provider_pglogical.spark.jobs import maintenance
from airflow_provider_pglogical.spark.housekeeping.steps import (
    Housekeeping, HousekeepingError, procedure_call, procedure_calls,
)

NOW = dt.datetime(2024, 1, 4, 3, 4, 5, tzinfo=dt.timezone.utc)


def test_maintenance_operator_passes_every_setting_to_the_job():
    op = IcebergMaintenanceOperator(task_id="maintain", iceberg=IcebergConfig(warehouse="/wh", namespace="sales"),
                                    tables=["orders"], older_than_hours=12, retain_last=3, rewrite_manifests=False)
    assert Path(op.application) == MAINTENANCE_JOB and MAINTENANCE_JOB.is_file()
    assert op.application_args == [
        "--catalog", "lake", "--namespace", "sales", "--compact-data-files", "--min-input-files", "5",
        "--delete-file-threshold", "1", "--compact-delete-files", "--no-rewrite-manifests", "--expire-snapshots",
        "--older-than-hours", "12", "--retain-last", "3", "--remove-orphan-files", "--orphan-older-than-hours", "72",
        "--table", "orders"]
    # what the job parses back is what the operator was given
    parsed = maintenance.parse_args(op.application_args)
    assert (parsed.namespace, parsed.tables, parsed.housekeeping) == ("sales", ["orders"], op.housekeeping)
    assert maintenance.parse_args(["--namespace", "sales"]).housekeeping == Housekeeping()


def test_procedure_calls_in_order_with_their_iceberg_arguments():
    calls = procedure_calls("lake", "`sales`.`orders`", Housekeeping(retain_last=3), NOW)
    assert calls == [
        ("rewrite_data_files",
         "CALL `lake`.system.rewrite_data_files(table => '`sales`.`orders`', options => map('min-input-files', '5', "
         "'delete-file-threshold', '1', 'remove-dangling-deletes', 'true'))"),
        ("rewrite_position_delete_files",
         "CALL `lake`.system.rewrite_position_delete_files(table => '`sales`.`orders`', "
         "options => map('rewrite-all', 'true'))"),
        ("rewrite_manifests", "CALL `lake`.system.rewrite_manifests(table => '`sales`.`orders`')"),
        # cut-offs carry their zone: the Spark session's time zone cannot move them
        ("expire_snapshots",
         "CALL `lake`.system.expire_snapshots(table => '`sales`.`orders`', "
         "older_than => TIMESTAMP '2024-01-03 03:04:05.000000Z', retain_last => 3)"),
        ("remove_orphan_files",
         "CALL `lake`.system.remove_orphan_files(table => '`sales`.`orders`', "
         "older_than => TIMESTAMP '2024-01-01 03:04:05.000000Z')"),
    ]


def test_expiry_keeps_the_newest_pipeline_commit_and_every_snapshot_after_it():
    eager = Housekeeping(older_than_hours=0)
    newest = NOW - dt.timedelta(minutes=5)  # an apply's data commit whose state commit never came
    assert "older_than => TIMESTAMP '2024-01-04 02:59:04.999000Z'" in procedure_call(
        "expire_snapshots", "lake", "`s`.`t`", eager, NOW, keep_from=newest)
    # a cut-off before the newest commit is kept as it is
    assert "older_than => TIMESTAMP '2024-01-03 03:04:05.000000Z'" in procedure_call(
        "expire_snapshots", "lake", "`s`.`t`", Housekeeping(), NOW, keep_from=newest)


def test_each_step_can_be_switched_off():
    only_expiry = Housekeeping(compact_data_files=False, compact_delete_files=False, rewrite_manifests=False,
                               remove_orphan_files=False)
    assert [step for step, _ in procedure_calls("lake", "`s`.`t`", only_expiry, NOW)] == ["expire_snapshots"]
    nothing = Housekeeping(compact_data_files=False, compact_delete_files=False, rewrite_manifests=False,
                           expire_snapshots=False, remove_orphan_files=False)
    assert procedure_calls("lake", "`s`.`t`", nothing, NOW) == []


def test_an_orphan_cut_off_under_a_day_is_refused_naming_the_option(capsys):
    with pytest.raises(HousekeepingError, match=r"^orphan_older_than_hours must be at least 24 hours \(got 1\)"):
        IcebergMaintenanceOperator(task_id="m", orphan_older_than_hours=1)
    # the job refuses it too, in its own spelling
    with pytest.raises(SystemExit):
        maintenance.parse_args(["--namespace", "s", "--orphan-older-than-hours", "23.5"])
    assert "--orphan-older-than-hours must be at least 24 hours (got 23.5)" in capsys.readouterr().err
    # with the step off, the cut-off does not matter
    assert IcebergMaintenanceOperator(task_id="m2", remove_orphan_files=False, orphan_older_than_hours=1)
    assert Housekeeping(orphan_older_than_hours=24).orphan_older_than_hours == 24


@pytest.mark.parametrize("option, value", [("min_input_files", 0), ("delete_file_threshold", -1),
                                           ("retain_last", 0), ("retain_last", True), ("older_than_hours", -1)])
def test_out_of_range_settings_are_refused_naming_the_option(option, value):
    with pytest.raises(HousekeepingError, match=f"^{option} must be") as caught:
        IcebergMaintenanceOperator(task_id="m", **{option: value})
    assert caught.value.option == option
