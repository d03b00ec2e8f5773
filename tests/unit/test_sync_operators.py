"""The snapshot operators template what a DAG author varies per run, parallelism included."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_pglogical.operators.sync import PgBackfillOperator, PgInitialSyncOperator


def test_initial_sync_and_backfill_render_their_templated_arguments():
    context = {"ds": "2024-01-01", "params": {"workers": 3, "table": "public.orders"}}
    sync = PgInitialSyncOperator(task_id="sync", slot="s_{{ ds_nodash }}", publications=["pub"],
                                 staging_root="file:///staging/{{ ds }}", pipeline="orders",
                                 parallelism="{{ params.workers }}")
    backfill = PgBackfillOperator(task_id="backfill", tables=["{{ params.table }}"], publications=["pub"],
                                  staging_root="file:///staging", pipeline="orders",
                                  key_range={"column": "id", "start": "{{ ds }}", "end": None},
                                  parallelism="{{ params.workers }}")
    sync.render_template_fields({**context, "ds_nodash": "20240101"})
    backfill.render_template_fields(context)
    assert (sync.slot, sync.staging_root, sync.parallelism) == ("s_20240101", "file:///staging/2024-01-01", "3")
    assert backfill.tables == ["public.orders"] and backfill.parallelism == "3"
    assert backfill.key_range == {"column": "id", "start": "2024-01-01", "end": None}


@pytest.mark.parametrize("bad", ["many", 0, -1, "0", 1.5, None])
def test_a_bad_parallelism_is_refused_before_anything_runs(bad):
    # No connection "pg_nowhere" exists: reaching the hook would fail differently.
    sync = PgInitialSyncOperator(task_id="sync", slot="s", publications=["pub"], staging_root="file:///x",
                                 pipeline="p", parallelism=bad, postgres_conn_id="pg_nowhere")
    backfill = PgBackfillOperator(task_id="backfill", tables="public.t", publications=["pub"],
                                  staging_root="file:///x", pipeline="p", parallelism=bad, postgres_conn_id="pg_nowhere")
    for op in (sync, backfill):
        with pytest.raises(AirflowFailException, match=rf"{type(op).__name__} '{op.task_id}': parallelism must be a whole "
                                             r"number of connections, 1 or more \(got .*\); pass e.g. parallelism=2"):
            op.execute({})


def test_staging_path_the_old_name_of_staging_root_still_works_with_a_warning():
    from airflow.exceptions import AirflowProviderDeprecationWarning

    with pytest.warns(AirflowProviderDeprecationWarning, match="task 'sync': staging_path is deprecated, pass staging_root"):
        sync = PgInitialSyncOperator(task_id="sync", slot="s", publications=["pub"], staging_path="file:///old",
                                     pipeline="p")
    assert sync.staging_root == "file:///old"
    with pytest.raises(TypeError, match="pass staging_root only"):
        PgInitialSyncOperator(task_id="both", slot="s", publications=["pub"], staging_path="file:///a",
                              staging_root="file:///b", pipeline="p")


@pytest.mark.parametrize("arguments, message", [
    ({"snapshot_mode": "chunky"}, r"snapshot_mode must be one of 'exported', 'chunked' \(got 'chunky'\)"),
    ({"snapshot_mode": "chunked", "failover": True}, r"snapshot_mode='chunked' reads on this worker and creates "
                                                     r"the slot without FAILOVER"),
])
def test_a_bad_snapshot_mode_is_refused_before_anything_runs(arguments, message):
    # No connection "pg_nowhere" exists: reaching the hook would fail differently.
    sync = PgInitialSyncOperator(task_id="sync", slot="s", publications=["pub"], staging_root="file:///x",
                                 pipeline="p", postgres_conn_id="pg_nowhere", **arguments)
    with pytest.raises(AirflowFailException, match=rf"PgInitialSyncOperator 'sync': {message}"):
        sync.execute({})


@pytest.mark.parametrize("given", [None, "SnapshotMode", "chunked", "{{ params.mode }}"])
def test_the_snapshot_mode_survives_template_rendering(given):
    """A templated field is rendered as Jinja when it is a str: the default enum member included,
    which must render as its value ('exported'), not its name."""
    from airflow_provider_pglogical.capture.chunked.plan import SnapshotMode

    arguments = {} if given is None else {"snapshot_mode": SnapshotMode.CHUNKED if given == "SnapshotMode" else given}
    sync = PgInitialSyncOperator(task_id="sync", slot="s", publications=["pub"], staging_root="file:///x",
                                 pipeline="p", **arguments)
    sync.render_template_fields({"params": {"mode": "chunked"}})
    expected = SnapshotMode.EXPORTED if given is None else SnapshotMode.CHUNKED
    assert sync._mode() is expected
