"""A reference applier for tests: replays staged batches into a dict, the simplest way possible.

It follows the staging contract literally (position semantics, per-row order by
``(_commit_lsn, _seq)``, unchanged TOAST, old keys, TRUNCATE), so tests of the Python side can
check the exact source state without Spark; the Spark job is tested against the same batches.
A keyed *ranged* snapshot (``key_range``: a ranged backfill, a chunk of a chunked load) replaces
the rows of its range and then re-applies every change row committed at or after its position,
as the apply's plan does (``spark/apply/plan.py``); a whole snapshot staged after change batches
that hold commits from its position (a backfill, a table a chunked load copied whole) is followed
by those. A keyless table is a multiset: :func:`multiset_rows`.
"""

from __future__ import annotations

from collections import Counter

from airflow_provider_pglogical.staging import batches, contract, layout
from airflow_provider_pglogical.lsn import Lsn


def _in_range(value, spec: dict) -> bool:
    def order(v):
        return v.encode() if isinstance(v, str) else v  # Spark compares strings in byte order
    return ((spec.get("start") is None or order(value) >= order(spec["start"]))
            and (spec.get("end") is None or order(value) < order(spec["end"])))


def _apply(current: dict, rows: list[dict], key: list[str], columns: list[str], since: Lsn) -> None:
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


def replay(root, pipeline: str) -> dict[str, dict[tuple, dict]]:
    """``{table: {key tuple: row dict}}`` after applying every committed batch in order."""
    state: dict[str, dict[tuple, dict]] = {}
    position: dict[str, Lsn] = {}
    changes: dict[str, list[dict]] = {}  # every change row seen, per table (ranged snapshots re-apply them)
    for name, start, end, kind in layout.committed_batches(root, pipeline):
        manifest = layout.read_manifest(root, pipeline, name)
        for qualified, table in manifest.tables.items():
            rows = batches.read_table(root, pipeline, name, table).to_pylist()
            key = table.key
            columns = [c.name for c in table.columns]
            if kind == "snapshot":
                spec = table.details.get("key_range") or manifest.details.get("key_range")
                if spec is None:  # the whole table at ``start``, then the changes seen committed from there
                    state[qualified] = {tuple(r[k] for k in key): r for r in rows}
                    _apply(state[qualified], changes.get(qualified, []), key, columns, start)
                    position[qualified] = start  # later change batches hold no row seen here
                    continue
                current = state.setdefault(qualified, {})
                for k in [k for k, r in current.items() if _in_range(r[spec["column"]], spec)]:
                    del current[k]
                current.update({tuple(r[k] for k in key): r for r in rows})
                _apply(current, changes.get(qualified, []), key, columns, start)
                position[qualified] = max(position.get(qualified, start), start)
                continue
            current = state.setdefault(qualified, {})
            changes.setdefault(qualified, []).extend(rows)
            _apply(current, rows, key, columns, position.get(qualified, Lsn(0)))
            position[qualified] = end
    return state


def table_rows(state: dict, qualified: str, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in state.get(qualified, {}).values())


def multiset_rows(root, pipeline: str, qualified: str, columns: list[str]) -> Counter:
    """A keyless table (a multiset) after every committed batch, as PostgreSQL's subscriber keeps it:
    its last whole snapshot holds the table at the snapshot's position (what came before is
    replaced, as the apply's plan supersedes it), then every change row committed from there, in
    commit order: an INSERT adds one copy, a DELETE removes one, an UPDATE both."""
    listed = [(name, start, kind) for name, start, _end, kind in layout.committed_batches(root, pipeline)
              if qualified in layout.read_manifest(root, pipeline, name).tables]
    snapshots = [(name, start) for name, start, kind in listed if kind == "snapshot"]
    assert snapshots, f"{qualified}: no snapshot"
    last, position = snapshots[-1]

    def rows(name: str) -> list[dict]:
        manifest = layout.read_manifest(root, pipeline, name)
        assert not (manifest.tables[qualified].details.get("key_range") or manifest.details.get("key_range"))
        return batches.read_table(root, pipeline, name, manifest.tables[qualified]).to_pylist()

    bag = Counter(tuple(r[c] for c in columns) for r in rows(last))
    changes = [r for name, _start, kind in listed if kind == "changes" for r in rows(name)
               if Lsn(r[contract.COMMIT_LSN]) >= position]
    for row in sorted(changes, key=lambda r: (r[contract.COMMIT_LSN], r[contract.SEQ])):
        if row[contract.OP] == "T":
            bag.clear()
            continue
        if row[contract.OP] in ("U", "D"):  # a DELETE stages the old row as its row, an UPDATE in ``_old_*``
            old = tuple(row[c if row[contract.OP] == "D" else contract.OLD_KEY_PREFIX + c] for c in columns)
            assert bag[old] > 0, f"{qualified}: a change removes a copy of {old} the table does not hold"
            bag[old] -= 1
        if row[contract.OP] in ("I", "U"):
            bag[tuple(row[c] for c in columns)] += 1
    return +bag
