"""The ``airflow pglogical`` commands; thin wrappers over :mod:`airflow_provider_pglogical.management.pipeline_ops`."""

from __future__ import annotations

import json
import sys

from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.management.pipeline_ops import drop_pipeline, pipeline_status
from airflow_provider_pglogical.management.validation import check_pipeline_name, check_staging_root


def _target(args) -> tuple[PgLogicalHook, ObjectStoragePath, str]:
    root = ObjectStoragePath(check_staging_root(args.staging_root))
    return PgLogicalHook(postgres_conn_id=args.conn_id), root, check_pipeline_name(args.pipeline)


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return str(value)


def status(args) -> None:
    """``airflow pglogical status``."""
    try:
        hook, root, pipeline = _target(args)
        result = pipeline_status(hook, root, pipeline)
    except PgLogicalError as err:
        raise SystemExit(f"error: {err}")
    if args.output == "json":
        print(json.dumps(result.as_dict(), sort_keys=True))  # one line: the last line of the output
        return
    rows = [
        ("pipeline", result.pipeline), ("state", result.state), ("publications", ", ".join(result.publications)),
        ("slot", result.slot or "-"),
        ("slot active", "-" if result.slot_active is None else str(result.slot_active).lower()),
        ("wal_status", result.wal_status or "-"), ("invalidation", result.invalidation_reason or "-"),
        ("confirmed up to", result.confirmed_flush_lsn or "-"),
        ("lag", _bytes(result.lag_bytes)), ("retained WAL", _bytes(result.retained_wal_bytes)),
        ("committed batches", str(result.committed_batches)), ("last batch", result.last_batch or "-"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print()
    if not result.applied:
        print("applied: nothing yet")
        return
    print(f"{'table':<32} {'target':<32} {'applied up to':<16} {'kind':<9} {'rows':>10}  applied at")
    for table, position in sorted(result.applied.items()):
        print(f"{table:<32} {position['target']:<32} {position['lsn'] or '-':<16} {position['kind']:<9} "
              f"{position['rows']:>10,}  {position['applied_at']}")


def drop(args) -> None:
    """``airflow pglogical drop``."""
    try:
        hook, root, pipeline = _target(args)
        result = drop_pipeline(hook, root, pipeline, dry_run=not args.yes, report=print)
    except PgLogicalError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1)
    if args.yes:
        print(json.dumps(result, sort_keys=True))
