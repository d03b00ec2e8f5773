"""Helpers for tests that stage a source's batches and compare them with PostgreSQL's own subscriber."""

from __future__ import annotations

from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.capture.initial_sync import run_initial_sync
from airflow_provider_pglogical.capture.pull import run_pull
from airflow_provider_pglogical.embedded.postgres import wait_until
from airflow_provider_pglogical.management.publications import PublishedTable
from airflow_provider_pglogical.staging.contract import parse_table_key
from airflow_provider_pglogical.staging.layout import committed_batches, read_manifest
from airflow_provider_pglogical.staging.batches import read_table


def synced(publisher, publisher_hook, root, source: str, tables) -> ObjectStoragePath:
    """Run ``source`` (SQL), publish ``tables`` as publication ``p`` and sync them into ``root``
    (pipeline ``p``, slot ``s1``); returns the staging root for :func:`pull`."""
    publisher.execute(source)
    publisher_hook.create_publication("p", [PublishedTable(name) for name in tables])
    storage = ObjectStoragePath(root.as_uri())
    run_initial_sync(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")
    return storage


def pull(publisher_hook, storage: ObjectStoragePath) -> str:
    """One pull of :func:`synced`'s pipeline; returns the batch's name."""
    return run_pull(publisher_hook, slot="s1", publications=["p"], root=storage, pipeline="p")["batch"].rsplit("/", 1)[1]


def native_rows(subscriber_hook, subscriber, publisher, name: str, publications: list[str], tables: list[str]):
    """Subscribe natively (copy_data) and return ``{table: sorted rows}`` once every table is ready."""
    subscriber_hook.create_subscription(name, publications, publisher_conn_id=publisher.conn_id)
    wait_until(lambda: (s := subscriber_hook.subscription_status(name)) and s.ready, timeout=60,
               message=f"subscription {name} to be ready")
    return {t: sorted(subscriber.query(f"SELECT * FROM {t}")) for t in tables}


def staged_rows(root, pipeline: str, kind: str = "snapshot") -> dict[str, list[tuple]]:
    """Rows of every table of the newest committed batch of ``kind``, as sorted tuples."""
    name = [b for b, _s, _e, k in committed_batches(root, pipeline) if k == kind][-1]
    manifest = read_manifest(root, pipeline, name)
    out = {}
    for qualified, table in manifest.tables.items():
        data = read_table(root, pipeline, name, table)
        out[parse_table_key(qualified)[1]] = sorted(tuple(r.values()) for r in data.to_pylist())
    return out
