"""Verify, Python side: stage the source's published projection for the Spark comparison job.

The projection is ``SELECT <published columns> FROM <table> WHERE <row filter>`` — what the
lakehouse must equal — read in one exported snapshot with the same COPY → Arrow path as the
initial sync, so both sides of the comparison went through the same type mapping. Verify
snapshots live under ``<root>/_verify/<pipeline>/`` where the apply job never looks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Sequence

import psycopg2

from airflow_provider_pglogical.lsn import Lsn
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.capture.snapshot import copy_tables
from airflow_provider_pglogical.staging.layout import BatchManifest, StagingPath
from airflow_provider_pglogical.staging.batches import BatchWriter
from airflow_provider_pglogical.management.validation import check_table_map
from airflow_provider_pglogical.staging.contract import default_target_name

VERIFY_DIR = "_verify"


@contextlib.contextmanager
def read_only_snapshot(connect_kwargs: Mapping[str, Any]) -> Iterator[tuple[str, Lsn]]:
    """A plain exported snapshot (no slot needed) and the WAL position it was taken at."""
    conn = psycopg2.connect(**connect_kwargs)
    try:
        with conn.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            cursor.execute("SELECT pg_export_snapshot(), pg_current_wal_lsn()::text")
            name, lsn = cursor.fetchone()
        yield name, Lsn.parse(lsn)
    finally:
        conn.close()


def stage_source_projection(
    connect_kwargs: Mapping[str, Any], tables: Sequence[ResolvedTable], root: StagingPath, pipeline: str, *,
    apply_row_filters: bool = True, parallelism: int = 2, type_overrides: Mapping[str, str] | None = None,
    report: Callable[[str], None] = print,
) -> tuple[str, BatchManifest]:
    """Copy the published projection of ``tables`` into a verify snapshot; returns its directory.

    :param connect_kwargs: where to read: the publisher, or a native subscriber of the same
        publications (then pass ``apply_row_filters=False``: it holds filtered rows already).
    :param type_overrides: the pipeline's ``type_overrides`` (docs/types.md), so the source is
        staged with the types the lakehouse holds.
    """
    if not apply_row_filters:
        tables = [_without_filter(t) for t in tables]
    with read_only_snapshot(connect_kwargs) as (snapshot, lsn):
        manifest = BatchManifest(pipeline=f"{VERIFY_DIR}/{pipeline}", kind="snapshot", start_lsn=str(lsn),
                                 end_lsn=str(lsn), details={"verify": True})
        writer = BatchWriter(root, manifest)
        copy_tables(connect_kwargs, snapshot, tables, writer, parallelism=parallelism, type_overrides=type_overrides,
                    report=report)
        writer.commit()
    return str(writer.directory), manifest


def _without_filter(table: ResolvedTable) -> ResolvedTable:
    return ResolvedTable(
        oid=table.oid, schema=table.schema, name=table.name, relkind=table.relkind,
        replica_identity=table.replica_identity, columns=table.columns, has_column_list=table.has_column_list,
        row_filter=None, publications=table.publications, publish=table.publish,
    )


def comparison_specs(manifest: BatchManifest, catalog: str, namespace: str,
                     table_map: Mapping[str, str] | None = None) -> list[dict]:
    """What the Spark job compares: per table the snapshot files, the target, columns and key."""
    specs = []
    table_map = check_table_map(table_map)  # keys as the pipeline's table keys ('"x.y".z' -> '"x.y"."z"')
    for qualified, table in sorted(manifest.tables.items()):
        target = table_map.get(qualified) or default_target_name(qualified)
        specs.append({
            "source": qualified, "target": f"{catalog}.{namespace}.{target}",
            "files": [f["path"] for f in table.files if f["rows"]],
            "columns": [c["name"] for c in table.columns], "key": table.key,
        })
    return specs


def describe_differences(result: dict) -> str:
    """A short human summary of the Spark job's result (the first differing keys per table)."""
    lines = []
    for table in result["tables"]:
        if table["equal"]:
            lines.append(f"{table['table']}: equal ({table['source_rows']:,} rows)")
            continue
        detail = table.get("problem") or (
            f"{table.get('differing_buckets')} key range(s) differ; source {table.get('source_rows'):,} rows, "
            f"lakehouse {table.get('target_rows'):,} rows; first differing keys {table.get('first_differing_keys')}"
        )
        lines.append(f"{table['table']}: DIFFERENT: {detail}")
    return "\n".join(lines)
