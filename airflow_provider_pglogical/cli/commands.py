"""The ``airflow pglogical`` commands; thin wrappers over :mod:`airflow_provider_pglogical.cli.pipeline_ops`."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Iterator

import psycopg2
from airflow.sdk import ObjectStoragePath

from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.lakehouse.staging_roots import staging_path
from airflow_provider_pglogical.cli.pipeline_ops import drop_pipeline, pipeline_status
from airflow_provider_pglogical.management.validation import check_pipeline_name, check_staging_root


def _target(args) -> tuple[PgLogicalHook, ObjectStoragePath, str]:
    root = staging_path(check_staging_root(args.staging_root))
    return PgLogicalHook(postgres_conn_id=args.conn_id), root, check_pipeline_name(args.pipeline)


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return str(value)


@contextlib.contextmanager
def _clear_errors(args) -> Iterator[None]:
    """A failure the user can fix ends the command with a message naming the fix, not a traceback."""
    try:
        yield
    except PgLogicalError as err:
        raise SystemExit(f"error: {err}") from None
    except psycopg2.OperationalError as err:
        try:
            conn = PgLogicalHook.get_connection(args.conn_id)
            where = f" at {conn.host}:{conn.port or 5432}"
        except Exception:  # the connection was found a moment ago; never hide the real error behind this
            where = ""
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SystemExit(
            f"error: cannot reach the publisher of Airflow connection {args.conn_id!r}{where}: {reason}. "
            f"Fix: check that connection's host, port and credentials (airflow connections get {args.conn_id}) "
            "and that PostgreSQL accepts connections there"
        ) from None
    except Exception as err:
        if type(err).__name__ != "AirflowNotFoundException":
            raise
        raise SystemExit(f"error: {err}. Fix: define the publisher's postgres connection {args.conn_id!r} "
                         "(airflow connections add, or AIRFLOW_CONN_<ID>) or pass the right --conn-id") from None


def status(args) -> None:
    """``airflow pglogical status``."""
    with _clear_errors(args):
        hook, root, pipeline = _target(args)
        result = pipeline_status(hook, root, pipeline)
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
        with _clear_errors(args):
            hook, root, pipeline = _target(args)
            result = drop_pipeline(hook, root, pipeline, dry_run=not args.yes, report=print)
    except SystemExit as err:
        print(err.code, file=sys.stderr)
        raise SystemExit(1) from None
    if args.yes:
        print(json.dumps(result, sort_keys=True))
