"""The pipeline view's pure parts: the tasks' capped history, freshness from the pull's commit
times, the pipelines found in serialized DAGs, and how the provider registers the plugin."""

from __future__ import annotations

import configparser
import datetime as dt
import os
from pathlib import Path

import pytest
from airflow.sdk import DAG, ObjectStoragePath

from airflow_provider_pglogical import get_provider_info
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.ui.history import (
    apply_entry,
    errors_recorded,
    history_name,
    read_history,
    record_history,
)
from airflow_provider_pglogical.staging.layout import BatchManifest, TableManifest
from airflow_provider_pglogical.ui.discovery import discover

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path):
    return ObjectStoragePath((tmp_path / "staging").as_uri())


def test_history_keeps_the_newest_entries_in_a_private_file(root, tmp_path):
    for i in range(7):
        record_history(root, "p", "pull", {"rows": i}, keep=5)
    entries = read_history(root, "p", "pull")
    assert [e["rows"] for e in entries] == [2, 3, 4, 5, 6], "bounded: the oldest go first"
    assert all(dt.datetime.fromisoformat(e["at"]).tzinfo is not None for e in entries)
    path = tmp_path / "staging" / "p" / history_name("pull")
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600), "staged files are private"
    assert read_history(root, "p", "apply") == [], "each kind has its own file"
    path.write_text(path.read_text() + '{"rows": 7, "at": "cut')  # a line cut short by a crash
    assert [e["rows"] for e in read_history(root, "p", "pull")][-1] == 6
    with pytest.raises(ValueError, match="history kind"):
        history_name("maintenance")


def test_an_error_is_recorded_with_its_message_and_raised_again(root):
    with pytest.raises(RuntimeError, match="slot s1 was dropped"):
        with errors_recorded(root, "p", "pull", print):
            raise RuntimeError("slot s1 was dropped: run the initial sync again")
    [entry] = read_history(root, "p", "pull")
    assert entry["error"] == "RuntimeError: slot s1 was dropped: run the initial sync again"


def _manifest(root, name: str, first_commit_ts: str | None) -> None:
    start, end, kind = contract.parse_batch_name(name)
    manifest = BatchManifest(pipeline="p", kind=kind, start_lsn=str(start), end_lsn=str(end), tables={
        "public.t": TableManifest(schema="public", name="t", columns=[], key=["id"], rows=3,
                                  details={contract.CHANGE_FACTS: {"rows": 3, "first_commit_ts": first_commit_ts}})})
    directory = Path(root.path) / "p" / name
    directory.mkdir(parents=True)
    (directory / contract.MANIFEST).write_text(manifest.to_json())


def test_freshness_runs_from_the_oldest_commit_applied_to_the_end_of_the_apply(root):
    now = dt.datetime(2026, 11, 27, 18, 0, 10, tzinfo=dt.timezone.utc)
    changes = contract.format_batch_name(0x100, 0x200, "changes")
    snapshot = contract.format_batch_name(0x100, 0x100, "snapshot")
    _manifest(root, changes, "2026-11-27T18:00:02.500000+00:00")
    steps = [{"table": "public.t", "batch": snapshot, "kind": "snapshot", "rows": 10},
             {"table": "public.t", "batch": changes, "kind": "changes", "rows": 3},
             {"table": "public.u", "batch": contract.format_batch_name(0x200, 0x300, "changes"), "kind": "changes",
              "rows": 1}]  # removed by retention meanwhile: no figure, no error
    entry = apply_entry(root, "p", steps, 5.0, now=now)
    assert entry == {"seconds": 5.0, "rows": 14, "steps": 3, "freshness_seconds": 7.5, "tables": {"public.t": 7.5}}


def _serialized(dag: DAG) -> dict:
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.to_dict(dag)


def test_pipelines_are_found_in_serialized_dags_and_templated_ones_left_out():
    from airflow_provider_pglogical import IcebergApplyOperator, PgSlotPullOperator

    with DAG("sync", schedule=None) as sync:
        PgSlotPullOperator(task_id="pull", slot="s1", publications=["p"], staging_root="file:///lake/staging/",
                           pipeline="orders", postgres_conn_id="source")
        IcebergApplyOperator(task_id="apply", staging_root="file:///lake/staging", pipeline="orders")
        PgSlotPullOperator(task_id="templated", slot="s2", publications=["p"], staging_root="{{ var.value.root }}",
                           pipeline="other", postgres_conn_id="source")
    with DAG("maintenance", schedule=None) as maintenance:
        IcebergApplyOperator(task_id="apply", staging_root="file:///lake/staging", pipeline="orders")
    [ref] = discover([("sync", _serialized(sync)), ("maintenance", _serialized(maintenance))])
    assert (ref.staging_root, ref.pipeline, ref.postgres_conn_id, ref.slot) == ("file:///lake/staging", "orders",
                                                                               "source", "s1")
    assert ref.dag_ids == ["sync", "maintenance"]


def test_the_plugin_is_registered_by_the_provider_info_and_the_entry_point():
    from airflow.plugins_manager import AirflowPlugin

    [entry] = get_provider_info()["plugins"]
    module, _, name = entry["plugin-class"].rpartition(".")
    plugin = getattr(__import__(module, fromlist=[name]), name)
    assert issubclass(plugin, AirflowPlugin) and plugin.name == entry["name"] == "pglogical"
    assert plugin.fastapi_apps[0]["url_prefix"] == "/pglogical" and plugin.external_views[0]["href"] == "/pglogical/"
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    declared = dict(line.split(" = ") for line in setup["options.entry_points"]["airflow.plugins"].strip().splitlines())
    assert declared == {"pglogical": f"{module}:{name}"}
