"""Fold a table's piled-up delete files into its data as the apply goes, not only at housekeeping.

Each change step a row delta applies (``row_deltas.py``) adds one data file and one position
delete file to its table, and a merge-on-read MERGE adds position deletes too. A read of a data
file opens every delete file that may name it, so the cost of reading grows with the steps since
the last compaction (with the equality deletes earlier versions wrote, with its square). The apply
itself reads its tables (the row delta's read of the rows a batch replaces,
``lookups/table_rows.py``; a MERGE's scan), and so do the users' queries. Measured in a streaming
window with equality deletes (a round a second, one small batch each): rounds of 0.3 s for the
first ~100 rounds, then 3-6 s whenever a round looked values up, and freshness with them.

So after its last state commit an apply compacts each table it wrote whose current snapshot counts
``threshold`` delete files or more: Iceberg's ``rewrite_data_files`` (the housekeeping's call:
small files grouped, every data file a delete applies to rewritten with it applied; Iceberg's own
reader and commit validation), then any equality deletes an earlier version wrote, left applying
to nothing, are removed (``dead_deletes.py``) and, if position deletes remain,
``rewrite_position_delete_files`` drops those of the replaced files. The rewrite changes no row, so
it needs no state commit, and a crash anywhere in it leaves the table as it was or compacted. A
rewrite rewrites every data file a delete applies to: a large unpartitioned table pays a whole
rewrite every ``threshold`` steps, so the threshold is the apply's choice
(``--compact-deletes-at``, default ``staging.contract.DEFAULT_COMPACT_DELETES_AT``; 0 switches it off).
"""

from __future__ import annotations

import datetime as dt
import logging
import time

from airflow_provider_pglogical.spark.common.identifiers import qualified, quote
from airflow_provider_pglogical.spark.housekeeping.dead_deletes import remove_dead_deletes
from airflow_provider_pglogical.spark.housekeeping.position_delete_rewrite import rewrite_blocked
from airflow_provider_pglogical.spark.housekeeping.steps import Housekeeping, procedure_call

log = logging.getLogger("pglogical.apply")

#: the rewrite's grouping: any two small files, and every data file with a delete against it
_REWRITE = Housekeeping(min_input_files=2, delete_file_threshold=1)


def delete_file_count(table) -> int:
    """Delete files (equality and position) in the Iceberg table's (Java) current snapshot, by its
    summary: metadata only, no file is opened."""
    snapshot = table.currentSnapshot()
    count = snapshot.summary().get("total-delete-files") if snapshot is not None else None
    return int(count) if count is not None else 0


def compact_if_due(spark, catalog: str, namespace: str, target: str, table, threshold: int) -> dict | None:
    """Compact ``target`` (``table``: its Iceberg table, Java) when it holds ``threshold`` delete
    files or more; returns what was done, or None when it was not due."""
    before = delete_file_count(table)
    if not threshold or before < threshold:
        return None
    started = time.monotonic()
    now = dt.datetime.now(dt.timezone.utc)
    row = spark.sql(procedure_call("rewrite_data_files", catalog, qualified(namespace, target), _REWRITE, now)).first()
    name = f"{qualified(catalog, namespace)}.{quote(target)}"
    removed = remove_dead_deletes(spark, name)
    table.refresh()
    if delete_file_count(table) and not rewrite_blocked(spark, name):  # position deletes still live
        # after the dead ones were removed: their own rewrite merges them (as housekeeping does); not on
        # a table with a list or map column
        spark.sql(procedure_call("rewrite_position_delete_files", catalog, qualified(namespace, target), _REWRITE,
                                 now)).collect()
        table.refresh()
    outcome = {"delete_files_before": before, "delete_files_after": delete_file_count(table),
               "rewritten_data_files": int(row["rewritten_data_files_count"]) if row is not None else 0,
               "removed_equality_delete_files": removed["removed_equality_delete_files_count"],
               "removed_position_delete_files": removed["removed_position_delete_files_count"],
               "seconds": round(time.monotonic() - started, 3)}
    log.info("%s: %d delete files folded into its data (%s)", target, before, outcome)
    return outcome


def compact_written(spark, lakehouse, steps: list[dict], threshold: int) -> list[dict]:
    """:func:`compact_if_due` for every table ``steps`` wrote (``lakehouse``: the apply's
    ``Lakehouse``); what was done, one entry per compacted table (``target`` named). A compaction
    that fails (another writer's commit met it) only warns: the apply's own work is committed and
    recorded, and housekeeping folds the deletes later."""
    done: list[dict] = []
    if not threshold:
        return done
    for target in sorted({step["target"] for step in steps}):
        try:
            outcome = compact_if_due(spark, lakehouse.catalog, lakehouse.namespace, target,
                                     lakehouse.iceberg_table(target), threshold)
        except Exception as error:  # noqa: BLE001 (the rewrite is an optimisation; no row depends on it)
            first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
            log.warning("%s: the compaction of its delete files did not commit (%s); housekeeping will", target,
                        first_line)
            outcome = {"error": first_line}
        if outcome is not None:
            done.append({"target": target, **outcome})
    return done
