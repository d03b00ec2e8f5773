"""What a table's staged change rows hold, counted once by the pull while the rows are in memory.

The apply job reads a batch once before reducing it, to learn whether it truncates, keeps
unchanged values or changes keys: a Spark job of its own per table per batch. The pull has the
rows in Arrow already and writes these facts into the table's manifest entry
(``contract.CHANGE_FACTS``); where they decide the answer (``contract.facts_decide``) the job
skips its read.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_pglogical.staging import contract


def change_facts(data: pa.Table, key: list[str]) -> dict:
    """``rows``, ``first_commit_lsn`` (None without rows), ``unchanged`` (some row keeps a column's
    value), ``old_keys`` (some row carries an old key: a key change may be among them) and
    ``first_commit_ts`` / ``last_commit_ts`` (ISO, UTC; the UI's freshness: commit to queryable)."""
    unchanged = data[contract.UNCHANGED]
    old_keys = [data[contract.OLD_KEY_PREFIX + k] for k in key if contract.OLD_KEY_PREFIX + k in data.column_names]
    return {
        "rows": data.num_rows,
        "first_commit_lsn": pc.min(data[contract.COMMIT_LSN]).as_py() if data.num_rows else None,
        "unchanged": bool(data.num_rows) and pc.max(pc.list_value_length(unchanged)).as_py() not in (None, 0),
        "old_keys": any(column.null_count < len(column) for column in old_keys),
        "first_commit_ts": _iso(pc.min(data[contract.COMMIT_TS]).as_py()) if data.num_rows else None,
        "last_commit_ts": _iso(pc.max(data[contract.COMMIT_TS]).as_py()) if data.num_rows else None,
    }


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None
