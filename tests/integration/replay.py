"""A reference applier for tests: replays staged batches into a dict, the simplest way possible.

It follows the staging contract literally (position semantics, per-row order by
``(_commit_lsn, _seq)``, unchanged TOAST, old keys, TRUNCATE), so tests of the Python side can
check the exact source state without Spark; the Spark job is tested against the same batches.
"""

from __future__ import annotations

from airflow_provider_pglogical.staging import batches, contract, layout
from airflow_provider_pglogical.lsn import Lsn


def replay(root, pipeline: str) -> dict[str, dict[tuple, dict]]:
    """``{table: {key tuple: row dict}}`` after applying every committed batch in order."""
    state: dict[str, dict[tuple, dict]] = {}
    position: dict[str, Lsn] = {}
    for name, start, end, kind in layout.committed_batches(root, pipeline):
        manifest = layout.read_manifest(root, pipeline, name)
        for qualified, table in manifest.tables.items():
            rows = batches.read_table(root, pipeline, name, table).to_pylist()
            key = table.key
            columns = [c.name for c in table.columns]
            if kind == "snapshot":
                state[qualified] = {tuple(r[k] for k in key): r for r in rows}
                position[qualified] = start
                continue
            current = state.setdefault(qualified, {})
            since = position.get(qualified, Lsn(0))
            for row in sorted(rows, key=lambda r: (r[contract.COMMIT_LSN], r[contract.SEQ])):
                if Lsn(row[contract.COMMIT_LSN]) < since:
                    continue
                op = row[contract.OP]
                if op == "T":
                    current.clear()
                    continue
                new_key = tuple(row[k] for k in key)
                old_key = tuple(row.get(contract.OLD_KEY_PREFIX + k) for k in key)
                if op == "D":
                    current.pop(new_key, None)
                    continue
                previous = None
                if op == "U" and all(v is not None for v in old_key) and old_key != new_key:
                    previous = current.pop(old_key, None)
                previous = previous or current.get(new_key)
                values = {c: row[c] for c in columns}
                for unchanged in row[contract.UNCHANGED] or []:
                    values[unchanged] = previous[unchanged] if previous else None
                current[new_key] = values
            position[qualified] = end
    return state


def table_rows(state: dict, qualified: str, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in state.get(qualified, {}).values())
