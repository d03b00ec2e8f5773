"""Changes to what the source publishes that leave no row change in the stream: re-snapshot or refuse.

pgoutput sends a row only when it changes. Some changes make the published rows differ without
a row change: a widened or narrowed row filter (rows enter or leave it as they are), a column
list that grows (the rows not changed since hold the new column only at the source), a table
rewrite (``ALTER COLUMN … TYPE … USING``, a column filled by a volatile default or an identity,
``TRUNCATE``, ``VACUUM FULL``, ``CLUSTER``, a partition attached or detached), a publish set that
gains an action (what it lacked was not published meanwhile), and ``publish_via_partition_root``
flipped (the rows move between the root's and the partitions' tables). The pipeline record
keeps, per table, what the publications published (:func:`recorded_fields`), and each pull
compares it with the catalog (:func:`resnapshot_reasons`): any such change re-snapshots the table
at a fresh LSN, ordered after the pull's window, whose changes of it are dropped, so the
lakehouse is exact whenever between two pulls the change happened.

``VACUUM FULL`` and ``CLUSTER`` change the relfilenode without changing values; the catalog cannot
tell them from a rewrite with ``USING``, so they re-snapshot too (exact, at the cost of one copy
of the table). A ``TRUNCATE`` also changes it, but travels in the stream: a new relfilenode of a
table whose window holds a TRUNCATE of it is followed, not re-snapshotted (the one case this
cannot see: a same-type ``ALTER … USING`` of rows inserted after a TRUNCATE, between the same
two pulls; docs/reliability.md). A publish set without ``update`` or ``delete`` is
refused (:func:`publish_problems`) unless the pipeline runs append-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from airflow_provider_pglogical.exceptions import InvalidInputError, PublicationError
from airflow_provider_pglogical.management.published import ResolvedTable
from airflow_provider_pglogical.staging.contract import ORPHANED_PROPERTY, ORPHANED_TABLES, table_key
from airflow_provider_pglogical.staging.pipeline_record import PipelineRecord

#: what the publish set must hold for the lakehouse to equal the source's published rows
REQUIRED_ACTIONS = ("insert", "update", "delete")
#: what an append-only pipeline needs: the lakehouse keeps every row ever inserted
APPEND_ONLY_ACTIONS = ("insert",)


#: ``on_ddl``: re-snapshot what the lakehouse cannot follow, or stop naming the backfill
DDL_POLICIES = ("snapshot", "fail")
#: ``orphaned_tables``: a table no change reaches any more (a via_root flip) is marked, or dropped
ORPHAN_POLICIES = ("mark", "drop")


@dataclass(frozen=True)
class SourceChangePolicy:
    """What a pull does about a change to what the source publishes (docs/reliability.md)."""

    #: DDL or a publication change the lakehouse cannot follow: ``snapshot`` the table again or ``fail``
    on_ddl: str = "snapshot"
    #: accept publications without update/delete: the lakehouse keeps what was inserted
    append_only: bool = False
    #: a table a via_root flip leaves without changes: ``mark`` its Iceberg table, or ``drop`` it
    orphaned_tables: str = "mark"

    def __post_init__(self) -> None:
        if self.on_ddl not in DDL_POLICIES:
            raise InvalidInputError(f"on_ddl must be one of {DDL_POLICIES}, not {self.on_ddl!r}")
        if self.orphaned_tables not in ORPHAN_POLICIES:
            raise InvalidInputError(f"orphaned_tables must be one of {ORPHAN_POLICIES}, not {self.orphaned_tables!r}")
        if not isinstance(self.append_only, bool):
            raise InvalidInputError(f"append_only must be True or False, not {self.append_only!r}")


def publication_state(table: ResolvedTable) -> dict:
    """What the publications publish of ``table``, as ``pg_publication_tables`` and ``pg_get_expr`` show it."""
    return {
        "columns": [c.attnum for c in table.columns] if table.has_column_list else None,
        "row_filter": table.row_filter, "publish": sorted(table.publish), "via_root": table.via_root,
    }


def recorded_fields(table: ResolvedTable) -> dict:
    """The pipeline record's fields of a table that :func:`resnapshot_reasons` compares."""
    return {"publication": publication_state(table), "storage": [list(s) for s in table.storage],
            "fill": {str(c.attnum): c.fill for c in table.columns if c.fill},
            "publication_rows": [list(v) for v in table.publication_rows]}


def resnapshot_reasons(entry: Mapping, table: ResolvedTable, truncated: bool = False) -> list[str]:
    """Why ``table`` must be snapshotted again since the record's ``entry`` (none: it need not).

    ``truncated``: the pull's window holds a TRUNCATE of the table, which explains a new
    relfilenode (the window carries the TRUNCATE and every row inserted after it). An entry
    recorded by an older version has none of these fields: it is only brought up to date.
    """
    why: list[str] = []
    old, new = entry.get("publication"), publication_state(table)
    if old is not None:
        if old["row_filter"] != new["row_filter"]:
            why.append(f"its row filter changed from {_shown(old['row_filter'])} to {_shown(new['row_filter'])} "
                       "(rows that entered or left it without changing are not in the stream)")
        before = {a for a, *_ in entry["columns"]}
        grown = [c.name for c in table.columns if c.attnum not in before]
        if old["columns"] != new["columns"] and grown and (old["columns"] is not None or new["columns"] is None):
            why.append(f"its publication's column list now also publishes {', '.join(grown)} (the rows not "
                       "changed since hold them only at the source)")
        gained = sorted(set(new["publish"]) - set(old["publish"]))
        if gained:
            why.append(f"its publications now publish {', '.join(gained)} too (publish was "
                       f"{', '.join(old['publish']) or 'nothing'}: those changes were not published meanwhile)")
    rows = entry.get("publication_rows")
    if not why and rows is not None and rows != [list(v) for v in table.publication_rows]:
        why.append("its publications were altered since the last pull (ALTER PUBLICATION wrote the rows that "
                   "publish it: its publish actions, row filter or column list may have changed and changed back, "
                   "which the stream does not show)")
    storage = entry.get("storage")
    if storage is not None and storage != [list(s) for s in table.storage] and not (
            truncated and [s[0] for s in storage] == [s[0] for s in table.storage]):
        why.append("its storage was rewritten (a new relfilenode: ALTER COLUMN … TYPE … USING, a column filled by "
                   "a volatile default or an identity, TRUNCATE, VACUUM FULL, CLUSTER, or a partition attached or "
                   "detached), so rows not changed since may hold other values")
    return why


def _shown(row_filter: str | None) -> str:
    return "none" if row_filter is None else f"WHERE {row_filter}"


def publish_problems(tables: Iterable[ResolvedTable], append_only: bool) -> list[str]:
    """Tables whose publications leave out changes the lakehouse needs, each with its fix."""
    needed = APPEND_ONLY_ACTIONS if append_only else REQUIRED_ACTIONS
    problems = []
    for table in tables:
        missing = [action for action in needed if action not in table.publish]
        if missing:
            problems.append(
                f"table {table.qualified_name} is published by {', '.join(sorted(table.publications))} without "
                f"{', '.join(missing)} (publish = '{', '.join(sorted(table.publish))}'), so its "
                f"{'/'.join(a.upper() for a in missing)}s never reach the lakehouse and it would drift from the "
                "source: publish them (ALTER PUBLICATION … SET (publish = 'insert, update, delete, truncate'))"
                + ("" if append_only else ", or run the pipeline append-only (append_only=True on the initial sync "
                                          "and pull: the lakehouse then keeps rows the source updated or deleted, "
                                          "docs/reliability.md)")
            )
    return problems


def via_root_flips(known: Mapping[str, dict], published: Mapping[int, ResolvedTable]) -> dict[int, list[int]]:
    """``publish_via_partition_root`` flipped: each newly published table -> the known tables whose
    rows it now carries (a root for its partitions, when turned on; the partitions for their root,
    when turned off). Those known tables are orphans: no changes reach them any more."""
    flips: dict[int, list[int]] = {}
    for oid, table in published.items():
        if str(oid) in known:
            continue
        leaves = {leaf for leaf, _ in table.storage}
        if table.relkind == "p":  # turned on: its partitions were published one by one
            orphans = [int(k) for k in known if int(k) in leaves and int(k) not in published and int(k) != oid]
        else:  # turned off: a known root that is not published any more held this partition
            orphans = [int(k) for k, e in known.items() if int(k) not in published
                       and oid in {leaf for leaf, _ in e.get("storage") or []} and int(k) != oid]
        if orphans:
            flips[oid] = sorted(orphans)
    return flips


def refuse_partial_publish(record: PipelineRecord, published: Iterable[ResolvedTable], append_only: bool,
                           pipeline: str, save: Callable[[], None]) -> None:
    """Stop a pull whose publications leave out updates or deletes (unless append-only).

    The record keeps the publish set the pull found, so that once the publications publish them
    again the next pull re-snapshots those tables: the changes left out meanwhile are gone from the
    stream (:func:`resnapshot_reasons`, "now publish … too").
    """
    tables = list(published)
    problems = publish_problems(tables, append_only)
    if not problems:
        return
    changed = False
    for table in tables:
        state = (record.relations.get(str(table.oid)) or {}).get("publication")
        if state is not None and state["publish"] != sorted(table.publish):
            state["publish"] = sorted(table.publish)
            changed = True
    if changed:
        save()
    raise PublicationError(
        "; ".join(problems) + f". Pipeline {pipeline!r} staged nothing and its slot was not advanced; once the "
        "publications publish these changes again, the next pull snapshots these tables again (what was left out "
        "meanwhile is not in the stream)"
    )


def forget_orphans(record: PipelineRecord, orphaned: Mapping[int, str], action: str,
                   report: Callable[[str], None]) -> dict[str, str]:
    """Note tables a via_root flip orphaned in the record (the apply marks or drops their Iceberg
    tables: ``spark/apply/state_table.settle_orphans``) and stop following them as the pipeline's
    tables; returns source table -> why."""
    done: dict[str, str] = {}
    for oid, why in sorted(orphaned.items()):
        entry = record.relations.pop(str(oid), None)
        names = [name for name, known in record.tables.items() if known == oid]
        for name in names:
            del record.tables[name]
        source = table_key(*entry["identity"]) if entry else (names[0] if names else str(oid))
        record.extra.setdefault(ORPHANED_TABLES, {})[source] = {"why": why, "action": action}
        done[source] = why
        report(f"{source}: {why}; the apply {'marks its Iceberg table (' + ORPHANED_PROPERTY + ')' if action == 'mark' else 'drops its Iceberg table'}")
    return done
