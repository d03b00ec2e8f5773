"""One identity per table (DESIGN invariant 11): which Iceberg table each source table of a run
writes, and whether it may, decided for the whole run before the job writes anything.

- ``table_map`` keys are parsed as table names (``'"x.y".z'``); an ambiguous one is refused.
- State rows keyed before keys were quoted (``x.y.z``) are taken over by the one source whose
  unquoted name they are; two such sources are refused (they shared one table).
- Two sources with one target (Iceberg names compared case-insensitively, as catalogs may) are refused.
- A source column Iceberg reserves, or two differing only in case, are refused before any table exists.
- A pipeline name the state table knows from another source database is refused.
- Every table the job writes carries :data:`OWNER_PROPERTY` (pipeline, source database, source
  table). A table owned by anyone else is refused; one without the property is adopted when this
  pipeline's state says it applied it, and refused otherwise.
"""

from __future__ import annotations

import json
import logging

from airflow_provider_pglogical.spark.common.identifiers import sql_string
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.format_versions import format_problem, format_version, upgrade
from airflow_provider_pglogical.spark.apply.plan import Step, TableState
from airflow_provider_pglogical.staging.contract import (
    MULTISET_COLUMNS,
    OWNER_PROPERTY,
    STATE_TABLE,
    column_name_problems,
    normal_table_key,
    parse_table_key,
)

log = logging.getLogger("pglogical.apply")

#: state table property naming the source database of each pipeline (``<prefix><pipeline>``)
SOURCE_PROPERTY_PREFIX = "pglogical.source."

_MAP_FIX = ("give each source its own target with table_map={source: target} on IcebergApplyOperator "
            "(--table-map)")


def normal_table_map(table_map: dict | None) -> dict[str, str]:
    """``table_map`` keyed by the pipeline's table keys; ApplyError for an ambiguous or repeated key."""
    out: dict[str, str] = {}
    for key, target in (table_map or {}).items():
        try:
            source = normal_table_key(key)
        except ValueError as error:
            raise ApplyError(f"table_map: {error}. Nothing was applied") from None
        if source in out:
            raise ApplyError(f"table_map names source table {source} twice ({key!r} and another spelling): "
                             "keep one entry. Nothing was applied")
        out[source] = target
    return out


def adopt_legacy_keys(states: dict[str, TableState], sources: set[str]) -> None:
    """Re-key state rows written under an unquoted ``schema.table`` that holds a dot or a quote."""
    claims: dict[str, list[str]] = {}
    for source in sources:
        legacy = "{}.{}".format(*parse_table_key(source))
        if source not in states and legacy != source and legacy in states:
            claims.setdefault(legacy, []).append(source)
    for legacy, claimants in sorted(claims.items()):
        if len(claimants) > 1:
            raise ApplyError(
                f"source tables {' and '.join(sorted(claimants))} were both recorded as {legacy!r} by an earlier "
                f"version and written into one Iceberg table {states[legacy].target}: drop that table, {_MAP_FIX}, "
                "and backfill both tables. Nothing was applied")
        log.info("state of %s is recorded under its unquoted name %r: re-keying it", claimants[0], legacy)
        states[claimants[0]] = states.pop(legacy)


def check_targets(states: dict[str, TableState]) -> None:
    """Refuse two source tables with one target, naming both and the ``table_map`` fix."""
    seen: dict[str, str] = {}
    problems = []
    for source, state in sorted(states.items()):
        other = seen.setdefault(state.target.lower(), source)
        if other != source:
            name = state.target if states[other].target == state.target else \
                f"{states[other].target} / {state.target} (one name to a case-insensitive catalog)"
            problems.append(f"source tables {other} and {source} both map to Iceberg table {name}")
    if problems:
        raise ApplyError("; ".join(problems) + f": {_MAP_FIX}. Nothing was applied")


def owner_of(pipeline: str, identity: dict | None, source: str) -> dict:
    """The owner a table of ``source`` written by this run records."""
    return {"pipeline": pipeline, "source": identity or None, "table": source}


def same_owner(recorded: dict, wanted: dict) -> bool:
    """Same pipeline and source table; same source database when both know it."""
    if recorded.get("pipeline") != wanted["pipeline"] or recorded.get("table") != wanted["table"]:
        return False
    return not (recorded.get("source") and wanted["source"]) or recorded["source"] == wanted["source"]


def check_pipeline_source(lakehouse, pipeline: str, identity: dict | None) -> tuple[str, str] | None:
    """Refuse a pipeline whose name this namespace's state table knows from another source database.

    Its state rows would be taken for this one's: batches at the same positions would count as
    applied, with nothing written. The state table records each pipeline's database in
    ``pglogical.source.<pipeline>``; returns that property to set when it is missing."""
    if not identity:
        return None
    name, value = f"{SOURCE_PROPERTY_PREFIX}{pipeline}", json.dumps(identity, sort_keys=True)
    recorded = lakehouse.iceberg_table(STATE_TABLE).properties().get(name)
    if recorded is None:
        return name, value
    if recorded != value:
        raise ApplyError(
            f"pipeline {pipeline!r} of namespace {lakehouse.namespace} applies database {recorded}, but this "
            f"staging's pipeline {pipeline!r} reads database {value}: two pipelines share one name in one "
            "namespace and would take each other's positions. Give this one another pipeline name (a new "
            "initial sync) or another namespace. Nothing was applied")
    return None


def check_run(lakehouse, pipeline: str, identity: dict | None, plans: dict[str, list[Step]],
              states: dict[str, TableState], known: set[str]) -> None:
    """Every check of this module that needs the lakehouse, for every table with a step, before any
    write; then record the owner of the tables to create and adopt the unowned ones this pipeline applied.

    :param known: the sources this pipeline's state table held when the run started.
    """
    check_targets(states)
    source_property = check_pipeline_source(lakehouse, pipeline, identity)
    problems, adopt, upgrades = [], [], []
    for source, steps in sorted(plans.items()):
        if not steps:
            continue
        target = states[source].target
        wanted = owner_of(pipeline, identity, source)
        table = lakehouse.loaded_table(target)
        existing = [] if table is None else [n for n in lakehouse.spark_types(table) if n not in MULTISET_COLUMNS]
        for step in steps:
            manifest = step.batch.manifest.tables[source]
            columns = [c.name for c in manifest.columns]
            found = column_name_problems(source, list(dict.fromkeys(existing + columns)),
                                         multiset=manifest.is_multiset)
            if found:
                problems.extend(p for p in found if p not in problems)
                break
        if table is None:
            lakehouse.owners[target] = json.dumps(wanted, sort_keys=True)
            continue
        have = format_version(table)
        found = format_problem(lakehouse.name(target), have, lakehouse.format_version, lakehouse.upgrade_format_version)
        if found:
            problems.append(found)
        elif have < lakehouse.format_version:
            upgrades.append((table, target))
        raw = table.properties().get(OWNER_PROPERTY)
        if raw is None:
            if source in known:
                adopt.append((target, wanted))
            else:
                problems.append(
                    f"Iceberg table {lakehouse.name(target)} exists but no pipeline owns it (no {OWNER_PROPERTY} "
                    f"property), and pipeline {pipeline!r} never applied {source} into it: it may be another "
                    f"tool's table. {_MAP_FIX.capitalize()} to write elsewhere, or drop the table if it is unused")
        elif not same_owner(json.loads(raw), wanted):
            problems.append(
                f"Iceberg table {lakehouse.name(target)} is owned by {raw}, and {json.dumps(wanted, sort_keys=True)} "
                f"would write it too: {_MAP_FIX} (for instance another namespace or name for one pipeline)")
    if problems:
        owners = [p for p in problems if p.startswith("Iceberg table ")]
        raise ApplyError("; ".join(problems) + ". Nothing was applied",
                         fix=_MAP_FIX if len(owners) == len(problems) else None)
    if source_property:
        lakehouse.iceberg_table(STATE_TABLE).updateProperties().set(*source_property).commit()
    for table, target in upgrades:
        upgrade(table, lakehouse.name(target), lakehouse.format_version)
    for target, wanted in adopt:
        log.warning("table %s has no owner (written before owners were recorded); pipeline %s applied it: "
                    "adopting it", lakehouse.name(target), pipeline)
        lakehouse.spark.sql(f"ALTER TABLE {lakehouse.name(target)} SET TBLPROPERTIES "
                            f"({sql_string(OWNER_PROPERTY)}={sql_string(json.dumps(wanted, sort_keys=True))})")
