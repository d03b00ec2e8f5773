"""Apply staged snapshot and change batches to Apache Iceberg tables (a PySpark job).

Runs on Spark 3.5 and 4.x and imports nothing from Airflow or from the rest of this package, so it
ships to any cluster as this one file::

    spark-submit apply_changes.py --staging-root s3a://bucket/staging --pipeline orders \\
        --catalog lake --namespace sales [--table-map '{"public.orders": "orders"}'] \\
        [--write-mode merge-on-read|copy-on-write] [--bucket-count 16]

What it does, per source table, in batch-name (= LSN) order (the staging contract is
``staging/layout.py``):

- A **snapshot** batch at position C that the table has not applied replaces the table's contents
  (a ranged backfill only the range named in its manifest ``details``: ``key_range`` or
  ``replace_where``) and sets the table's position to C, even when the position was already past
  C (a late backfill): the change batches holding commits at or after C are then applied again,
  from C. The latest pending full snapshot makes every earlier batch irrelevant.
- A **change** batch whose end is past the table's position is reduced to the last change per key
  by ``(_commit_lsn, _seq)`` (rows before the position are skipped; key-changing updates delete the
  old key; unchanged-TOAST columns keep the value of an earlier change of the same row, following
  key changes, else the lakehouse's) and applied with ONE ``MERGE INTO``. A batch holding a
  TRUNCATE replaces the table with the rows after the last TRUNCATE (one atomic overwrite).
- A **keyless** table (REPLICA IDENTITY FULL) is a multiset, as PostgreSQL's subscriber keeps it:
  identical rows are numbered in ``_pglogical_occurrence`` and a change batch changes the number of
  copies of each row value it touches (:class:`Multisets`).
- Positions and applied snapshot batches are recorded per table in
  ``<catalog>.<namespace>._pglogical_state`` (one row per pipeline and source table, partitioned
  by pipeline). Tables advance in rounds of one step each; after every round this pipeline's rows
  are rewritten in one commit. A crash between a data commit and the state commit makes the next
  run apply that one step again, which is exact: a step sets every key it touches to a value
  computed from the batch, or keeps the lakehouse's value where the batch does not know it (a
  keyless table's step marks the row values it changed and skips them when run again).

Schema: missing tables are created from the manifest: format-version 2, the write mode's
``write.{merge,update,delete}.mode``, key columns NOT NULL and recorded in the table property
``pglogical.replica-identity-key``; Iceberg identifier fields are set to the key only for
copy-on-write tables, because Iceberg 1.6-1.9's Spark runtime fails every merge-on-read
MERGE/UPDATE/DELETE on a table with identifier fields (apache/iceberg#11709). REPLICA IDENTITY FULL
tables (key = every column) get neither, and two metadata columns (``_pglogical_occurrence``,
``_pglogical_batch``) that make (row, occurrence) a key. Added columns are
added; widening type changes (int -> bigint, float -> double, decimal precision) are applied, others
refused with an error; columns dropped at the source stay as nullable columns, NULL in rows
inserted afterwards and unchanged in rows updated afterwards. A target table that was dropped is
rebuilt from the staged batches (its state is reset), so staged batches are never deleted by this job.
Run one apply per pipeline at a time (``max_active_tis_per_dag=1``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from functools import reduce

log = logging.getLogger("pglogical.apply")

MANIFEST = "_manifest.json"
STATE_TABLE = "_pglogical_state"
BATCH_NAME = re.compile(r"^([0-9A-F]{16})-([0-9A-F]{16})-(snapshot|changes)$")
#: metadata columns of a staged change row (see ``staging/layout.py``)
OP, COMMIT_LSN, SEQ, UNCHANGED, OLD_KEY_PREFIX = "_op", "_commit_lsn", "_seq", "_unchanged_toast", "_old_"
CHANGE_METADATA = (OP, COMMIT_LSN, SEQ, "_xid", "_commit_ts", UNCHANGED)
ESCAPE = "~"
WRITE_MODES = ("merge-on-read", "copy-on-write")
RESULT_PREFIX = "PGLOGICAL_APPLY_RESULT "
#: table property holding the replica-identity key (JSON list) of every table the job creates
KEY_PROPERTY = "pglogical.replica-identity-key"
#: metadata columns of a keyless (REPLICA IDENTITY FULL) table, kept as a multiset: which copy of
#: identical rows this row is (1..n), and the batch that last changed how many copies there are
OCCURRENCE, WRITTEN_BY = "_pglogical_occurrence", "_pglogical_batch"
MULTISET_COLUMNS = {OCCURRENCE: "int", WRITTEN_BY: "string"}


class ApplyError(RuntimeError):
    """A batch cannot be applied as staged; the message names the batch, the table and the fix."""


# --- PostgreSQL -> Spark types: a copy of staging/typemap.py (a unit test keeps them equal) ---

_SPARK_TYPES = {
    "bool": "boolean", "int2": "int", "int4": "int", "int8": "bigint", "oid": "bigint",
    "float4": "float", "float8": "double", "bytea": "binary", "date": "date",
    "timestamp": "timestamp_ntz", "timestamptz": "timestamp",
}
_NUMERIC_TYPMOD = re.compile(r"^numeric\((\d+),(\d+)\)$")


def spark_type(type_name: str, element_type: str | None = None, formatted: str | None = None) -> str:
    """Spark SQL type of a PostgreSQL type; anything unknown (json, uuid, interval, ...) is string."""
    if type_name == "numeric":
        match = _NUMERIC_TYPMOD.match((formatted or "").replace(" ", ""))
        if match and int(match.group(1)) <= 38:
            return f"decimal({match.group(1)},{match.group(2)})"
        return "string"
    if element_type is not None:
        return f"array<{spark_type(element_type)}>"
    return _SPARK_TYPES.get(type_name, "string")


#: ``type_overrides`` a manifest column entry can carry (``"override": "string"``): the column was
#: staged as PostgreSQL's text output and is a string column in Iceberg (typemap.OVERRIDE_TYPES)
_OVERRIDE_TYPES = {"string": "string"}


def column_type(column: dict) -> str:
    """Spark SQL type of a manifest column entry, honouring its ``override``."""
    if column.get("override") is not None:
        if column["override"] not in _OVERRIDE_TYPES:
            raise ApplyError(f"column {column['name']}: unknown type override {column['override']!r}")
        return _OVERRIDE_TYPES[column["override"]]
    return spark_type(column["type"], column.get("element_type"), column.get("formatted"))


# --- names, LSNs, SQL text --------------------------------------------------------------------


def quote(name: str) -> str:
    """A Spark SQL identifier, quoted."""
    return "`" + name.replace("`", "``") + "`"


def staged_name(column: str) -> str:
    """A source column's name in a staged change file (``staging/layout.py``'s rule)."""
    if column in CHANGE_METADATA or column.startswith(OLD_KEY_PREFIX) or column.startswith(ESCAPE):
        return ESCAPE + column
    return column


def default_target_name(source: str) -> str:
    """``public.Order Items`` -> ``public__order_items``."""
    schema, _, table = source.partition(".")
    return re.sub(r"[^a-z0-9_]", "_", f"{schema}__{table}".lower())


def parse_lsn(text: str | int) -> int:
    """``X/Y`` or 16 hex digits (or an int) -> int."""
    if isinstance(text, int):
        return text
    if "/" in text:
        high, low = text.split("/")
        return (int(high, 16) << 32) | int(low, 16)
    return int(text, 16)


def hex16(value: int) -> str:
    return f"{value:016X}"


def sql_literal(value) -> str:
    """A JSON scalar as a Spark SQL literal (for ``key_range`` bounds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise ApplyError(f"key_range bound {value!r} is not a number or a string")


def range_predicate(details: dict, batch: str, table: str) -> str | None:
    """The rows a ranged snapshot replaces, as Spark SQL over the target's columns; None = all rows.

    ``details`` are the batch's and the table's manifest details, merged (the table's win):
    ``key_range = {"column": c, "start": a, "end": b}`` (what ``initial_sync.backfill`` writes)
    means ``a <= c < b``, a null bound is open; ``replace_where`` is a Spark SQL predicate used
    verbatim. A table copied with an ``extra_where`` (PostgreSQL SQL) and neither is refused.
    """
    spec = details.get("key_range")
    if spec:
        parts = []
        for bound, operator in (("start", ">="), ("end", "<")):
            value = spec.get(bound, spec.get({"start": "lower", "end": "upper"}[bound]))
            if value is not None:
                parts.append(f"{quote(spec['column'])} {operator} {sql_literal(value)}")
        return " AND ".join(parts) or "true"
    if details.get("replace_where"):
        return f"({details['replace_where']})"
    if details.get("extra_where") or details.get("backfill_where"):
        raise ApplyError(
            f"batch {batch}, table {table}: a ranged snapshot copied with a PostgreSQL filter needs the "
            "range the lakehouse must replace, as details.key_range or details.replace_where (Spark SQL); "
            "Spark does not evaluate PostgreSQL's SQL"
        )
    return None


def snapshot_details(manifest: dict, source: str) -> dict:
    """The batch's details overlaid with the table's (the table's win; nulls do not count)."""
    merged = {k: v for k, v in (manifest.get("details") or {}).items() if v is not None}
    merged.update({k: v for k, v in (manifest["tables"][source].get("details") or {}).items() if v is not None})
    return merged


# --- batches and plans (pure) -----------------------------------------------------------------


@dataclass
class Batch:
    name: str
    start: int
    end: int
    kind: str
    manifest: dict = field(default_factory=dict)


@dataclass
class TableState:
    """What the lakehouse holds of one source table."""

    target: str
    position: int = 0
    snapshots: set = field(default_factory=set)
    last_batch: str | None = None


@dataclass
class Step:
    kind: str  # "snapshot" | "changes"
    batch: Batch
    #: rows with ``_commit_lsn`` >= this are applied (changes); the snapshot's position (snapshot)
    position: int


def parse_batch(name: str) -> tuple[int, int, str] | None:
    match = BATCH_NAME.match(name)
    return (int(match.group(1), 16), int(match.group(2), 16), match.group(3)) if match else None


def is_ranged(batch: Batch, source: str) -> bool:
    details = snapshot_details(batch.manifest, source)
    return any(details.get(key) for key in ("key_range", "replace_where", "extra_where", "backfill_where"))


def plan_table(source: str, batches: list[Batch], state: TableState) -> tuple[list[Step], list[str]]:
    """The steps that bring one table from ``state`` to the end of ``batches`` (name order).

    Returns the steps and the pending snapshot batches made irrelevant by a later full snapshot.
    """
    mine = [batch for batch in batches if source in batch.manifest["tables"]]
    pending_full = [
        index for index, batch in enumerate(mine)
        if batch.kind == "snapshot" and batch.name not in state.snapshots and not is_ranged(batch, source)
    ]
    first = pending_full[-1] if pending_full else 0
    superseded = [b.name for b in mine[:first] if b.kind == "snapshot" and b.name not in state.snapshots]
    steps: list[Step] = []
    position = state.position
    for index in range(first, len(mine)):
        batch = mine[index]
        if batch.kind == "snapshot":
            if batch.name in state.snapshots:
                continue
            steps.append(Step("snapshot", batch, batch.start))
            position = batch.start
            # change batches named before the snapshot that hold commits at or after it
            for earlier in mine[:index]:
                if earlier.kind == "changes" and earlier.end > position:
                    steps.append(Step("changes", earlier, position))
                    position = earlier.end
        elif batch.end > position:
            steps.append(Step("changes", batch, position))
            position = batch.end
    return steps, superseded


# --- staging through Hadoop's FileSystem (file://, s3a://, gs://, hdfs://) -----------------------


class Staging:
    def __init__(self, spark, root: str, pipeline: str) -> None:
        self.spark = spark
        self.directory = root.rstrip("/") + "/" + pipeline
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._path = jvm.org.apache.hadoop.fs.Path(self.directory)
        self._fs = self._path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def committed(self) -> list[Batch]:
        """Every batch with a manifest, in name order (manifests not read yet)."""
        pattern = self._jvm.org.apache.hadoop.fs.Path(self.directory + "/*/" + MANIFEST)
        statuses = self._fs.globStatus(pattern) or []
        found = []
        for status in statuses:
            name = status.getPath().getParent().getName()
            parsed = parse_batch(name)
            if parsed:
                found.append(Batch(name, *parsed))
        return sorted(found, key=lambda batch: batch.name)

    def read_manifest(self, batch: Batch) -> dict:
        path = self._jvm.org.apache.hadoop.fs.Path(f"{self.directory}/{batch.name}/{MANIFEST}")
        stream = self._fs.open(path)
        try:
            text = self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        return json.loads(text)

    def files(self, batch: Batch, source: str) -> list[str]:
        return [f"{self.directory}/{batch.name}/{f['path']}" for f in batch.manifest["tables"][source]["files"]]


# --- the lakehouse side -----------------------------------------------------------------------


#: name prefix of the temporary tables a bucketed target's batch is staged in
BATCH_TABLE_PREFIX = "_pglogical_batch__"


class Lakehouse:
    def __init__(self, spark, catalog: str, namespace: str, write_mode: str, bucket_count: int | None):
        self.spark = spark
        self.catalog = catalog
        self.namespace = namespace
        self.write_mode = write_mode
        self.bucket_count = bucket_count
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quote(catalog)}.{quote(namespace)}")

    def name(self, table: str) -> str:
        return f"{quote(self.catalog)}.{quote(self.namespace)}.{quote(table)}"

    def exists(self, table: str) -> bool:
        return self.spark.catalog.tableExists(f"{self.catalog}.{self.namespace}.{table}")

    def drop_batch_tables(self) -> None:
        """Drop the bucketed batch tables a killed run left (see ``Applier._merge_source``)."""
        for row in self.spark.sql(f"SHOW TABLES IN {quote(self.catalog)}.{quote(self.namespace)}").collect():
            if row.tableName.startswith(BATCH_TABLE_PREFIX):
                self.spark.sql(f"DROP TABLE IF EXISTS {self.name(row.tableName)} PURGE")

    def bucketed(self, table: str, column: str) -> bool:
        """True when ``table`` is partitioned by ``bucket(bucket_count, column)`` and nothing else."""
        spec = [r for r in self.spark.sql(f"DESCRIBE TABLE {self.name(table)}").collect()]
        start = next((i for i, r in enumerate(spec) if r.col_name.strip() == "# Partitioning"), None)
        if start is None:
            return False
        parts = [r.data_type.strip() for r in spec[start + 1:] if r.col_name.startswith("Part ")]
        return parts == [f"bucket({int(self.bucket_count)}, {column})"]

    # state ---------------------------------------------------------------------------------
    def read_state(self, pipeline: str) -> dict[str, TableState]:
        state_table = self.name(STATE_TABLE)
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS {state_table} (pipeline string NOT NULL, source_table string NOT NULL, "
            "target_table string, position string, applied_snapshots array<string>, last_batch string, "
            "updated_at timestamp) USING iceberg PARTITIONED BY (pipeline) "
            "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write', "
            "'write.delete.mode'='copy-on-write', 'write.merge.mode'='copy-on-write')"
        )
        from pyspark.sql import functions as F

        rows = self.spark.table(state_table).where(F.col("pipeline") == pipeline).collect()
        return {
            row.source_table: TableState(
                row.target_table, int(row.position, 16), set(row.applied_snapshots or ()), row.last_batch
            )
            for row in rows
        }

    def write_state(self, pipeline: str, states: dict[str, TableState]) -> None:
        """Replace this pipeline's rows of the state table in one commit."""
        from pyspark.sql import functions as F

        schema = ("pipeline string, source_table string, target_table string, position string, "
                  "applied_snapshots array<string>, last_batch string")
        rows = [
            (pipeline, source, s.target, hex16(s.position), sorted(s.snapshots), s.last_batch)
            for source, s in sorted(states.items())
        ]
        frame = self.spark.createDataFrame(rows, schema).withColumn("updated_at", F.current_timestamp())
        frame.writeTo(self.name(STATE_TABLE)).overwrite(F.col("pipeline") == F.lit(pipeline))

    # tables --------------------------------------------------------------------------------
    def ensure_table(self, table: str, manifest: dict) -> dict[str, str]:
        """Create or evolve the table for a table manifest; returns column name -> Spark type."""
        wanted = {column["name"]: column_type(column) for column in manifest["columns"]}
        key = manifest["key"]
        if not self.exists(table):
            not_null = manifest.get("replica_identity", "d") != "f" and key
            columns = ", ".join(
                f"{quote(name)} {kind}{' NOT NULL' if not_null and name in key else ''}"
                for name, kind in wanted.items()
            )
            if is_multiset(manifest):
                wanted = {**wanted, **MULTISET_COLUMNS}
                columns += "".join(f", {quote(name)} {kind}" for name, kind in MULTISET_COLUMNS.items())
            mode = self.write_mode
            partitioning = ""
            if self.bucket_count and key:
                partitioning = f" PARTITIONED BY (bucket({int(self.bucket_count)}, {quote(key[0])}))"
            key_property = json.dumps(key).replace("\\", "\\\\").replace("'", "\\'")
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self.name(table)} ({columns}) USING iceberg{partitioning} "
                f"TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='{mode}', "
                f"'write.update.mode'='{mode}', 'write.delete.mode'='{mode}', "
                f"'{KEY_PROPERTY}'='{key_property}')"
            )
            # Iceberg 1.6-1.9 Spark fails every merge-on-read MERGE/UPDATE/DELETE of a table with
            # identifier fields (apache/iceberg#11709): there the key lives in KEY_PROPERTY only.
            if not_null and mode == "copy-on-write":
                fields = ", ".join(quote(name) for name in key)
                self.spark.sql(f"ALTER TABLE {self.name(table)} SET IDENTIFIER FIELDS {fields}")
            log.info("created %s", self.name(table))
            return wanted
        current = {f.name: f.dataType.simpleString() for f in self.spark.table(self.name(table)).schema.fields}
        if is_multiset(manifest) and self._unnumbered(table, current):
            current = self._number_copies(table, current)
        for name, kind in wanted.items():
            if name not in current:
                self.spark.sql(f"ALTER TABLE {self.name(table)} ADD COLUMN {quote(name)} {kind}")
                log.info("added column %s %s to %s", name, kind, table)
            elif current[name] != kind:
                if not _widens(current[name], kind):
                    raise ApplyError(
                        f"table {self.name(table)}: column {name} is {current[name]} in Iceberg but {kind} at "
                        "the source; Iceberg cannot change it in place. Drop the Iceberg table (or the "
                        "column) and re-run the apply: it is rebuilt from the staged batches, or backfill it."
                    )
                self.spark.sql(f"ALTER TABLE {self.name(table)} ALTER COLUMN {quote(name)} TYPE {kind}")
        return {**current, **wanted}

    def _unnumbered(self, table: str, current: dict[str, str]) -> bool:
        """A keyless table without (complete) copy numbers: written before this job numbered them."""
        from pyspark.sql import functions as F

        if OCCURRENCE not in current:
            return True
        # file statistics answer this for every file a finished numbering wrote
        return bool(self.spark.table(self.name(table)).where(F.col(quote(OCCURRENCE)).isNull()).limit(1).count())

    def _number_copies(self, table: str, current: dict[str, str]) -> dict[str, str]:
        """Add the multiset columns to a keyless table and number its identical rows (one overwrite).

        A crash between the two commits leaves NULL occurrences, which the next run numbers.
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        log.warning("table %s is keyless but its identical rows are not numbered (written by an earlier "
                    "version, which could lose copies): numbering them now; backfill it to be sure it is exact",
                    self.name(table))
        for name, kind in MULTISET_COLUMNS.items():
            if name not in current:
                self.spark.sql(f"ALTER TABLE {self.name(table)} ADD COLUMN {quote(name)} {kind}")
        values = [F.col(quote(c)) for c in current if c not in MULTISET_COLUMNS]
        numbered = self.spark.table(self.name(table)).select(
            *values, F.row_number().over(Window.partitionBy(*values).orderBy(F.lit(1))).cast("int").alias(OCCURRENCE),
            F.lit(None).cast("string").alias(WRITTEN_BY)).localCheckpoint()
        numbered.writeTo(self.name(table)).overwrite(F.lit(True))
        return {**current, **MULTISET_COLUMNS}


def _widens(old: str, new: str) -> bool:
    if (old, new) in {("int", "bigint"), ("float", "double")}:
        return True
    old_dec, new_dec = re.match(r"decimal\((\d+),(\d+)\)", old), re.match(r"decimal\((\d+),(\d+)\)", new)
    return bool(old_dec and new_dec and old_dec.group(2) == new_dec.group(2) and int(new_dec.group(1)) > int(old_dec.group(1)))


# --- reading a batch --------------------------------------------------------------------------


def _lsn_column(frame):
    """``_commit_lsn`` as decimal(20,0), whether it was staged as an integer or as LSN text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    column = F.col(COMMIT_LSN)
    if isinstance(frame.schema[COMMIT_LSN].dataType, StringType):
        def hexval(text):
            return F.conv(text, 16, 10).cast("decimal(20,0)")

        column = F.when(
            F.instr(column, "/") > 0,
            hexval(F.substring_index(column, "/", 1)) * F.lit(4294967296).cast("decimal(20,0)")
            + hexval(F.substring_index(column, "/", -1)),
        ).otherwise(hexval(column))
    return column.cast("decimal(20,0)")


def read_rows(spark, files: list[str], types: dict[str, str], keys: list[str], changes: bool):
    """The batch's rows of one table: value columns cast to their lakehouse type (+ metadata)."""
    from pyspark.sql import functions as F

    if not files:  # a table with no rows in this batch
        return spark.createDataFrame([], ", ".join(f"{quote(n)} {t}" for n, t in types.items()))
    # staged Parquet is proleptic Gregorian (pyarrow): read dates before 1582 as they are
    raw = (spark.read.option("mergeSchema", "true").option("datetimeRebaseMode", "CORRECTED")
           .option("int96RebaseMode", "CORRECTED").parquet(*files))
    present = set(raw.columns)

    def value(name):
        staged = staged_name(name) if changes else name  # snapshot files keep every name as it is
        return (F.col(quote(staged)) if staged in present else F.lit(None)).cast(types[name]).alias(name)

    columns = [value(name) for name in types]
    if not changes:
        return raw.select(*columns)
    unchanged = F.col(UNCHANGED) if UNCHANGED in present else F.lit(None)
    columns += [
        F.col(OP).alias("__op"),
        _lsn_column(raw).alias("__lsn"),
        F.col(SEQ).cast("long").alias("__seq"),
        F.coalesce(unchanged.cast("array<string>"), F.array().cast("array<string>")).alias("__u"),
    ]
    for index, key in enumerate(keys):
        old = OLD_KEY_PREFIX + key
        columns.append((F.col(quote(old)) if old in present else F.lit(None)).cast(types[key]).alias(f"__old{index}"))
    frame = raw.select(*columns)
    for index, key in enumerate(keys):
        # REPLICA IDENTITY FULL: every column is key, and an unchanged TOAST value is in the old tuple
        old = F.col(f"__old{index}")
        frame = frame.withColumn(key, F.when(F.array_contains("__u", key) & old.isNotNull(), old).otherwise(F.col(quote(key))))
    return frame


# --- reducing a change batch to one row per key -----------------------------------------------


@dataclass
class Reduced:
    """One row per touched key: key + value columns, ``__op`` (D or U), ``__keep{i}`` (keep the
    lakehouse value of value column i), ``__ok{j}`` (the key whose lakehouse row the kept values
    come from)."""

    frame: object
    truncated: bool
    rows: int
    #: some rows moved (key change) with unchanged columns: kept values may sit under an old key
    moved_unchanged: bool = False
    #: value columns sent as unchanged somewhere in the batch: only they may keep lakehouse values
    unchanged_columns: set = field(default_factory=set)


def reduce_changes(spark, rows, keys: list[str], values: list[str], from_position: int) -> Reduced:
    """Last change per key by ``(_commit_lsn, _seq)``, TRUNCATE, key changes and unchanged TOAST."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = rows.where(F.col("__lsn") >= F.lit(from_position).cast("decimal(20,0)"))
    old_given = reduce(lambda a, b: a | b, [F.col(f"__old{i}").isNotNull() for i in range(len(keys))], F.lit(False))
    same_key = reduce(lambda a, b: a & b, [F.col(k).eqNullSafe(F.col(f"__old{i}")) for i, k in enumerate(keys)], F.lit(True))
    is_key_change = (F.col("__op") == "U") & old_given & ~same_key
    facts = rows.agg(
        F.count(F.lit(1)).alias("rows"),
        F.max(F.when(F.col("__op") == "T", F.struct("__lsn", "__seq"))).alias("last_truncate"),
        F.max(F.when(F.size("__u") > 0, 1).otherwise(0)).alias("unchanged"),
        F.max(F.when(is_key_change, 1).otherwise(0)).alias("key_changes"),
        F.max(F.when(is_key_change & (F.size("__u") > 0), 1).otherwise(0)).alias("moved_unchanged"),
        F.array_distinct(F.flatten(F.collect_set("__u"))).alias("unchanged_columns"),
    ).first()
    truncated = facts.last_truncate is not None
    if truncated:
        t_lsn = F.lit(facts.last_truncate["__lsn"]).cast("decimal(20,0)")
        t_seq = F.lit(facts.last_truncate["__seq"]).cast("long")
        rows = rows.where((F.col("__lsn") > t_lsn) | ((F.col("__lsn") == t_lsn) & (F.col("__seq") > t_seq)))
    rows = rows.where(F.col("__op") != "T")

    events = rows.withColumn("__sub", F.lit(1)).withColumn("__moved", is_key_change if facts.key_changes else F.lit(False))
    for i, key in enumerate(keys):
        events = events.withColumn(f"__src{i}", F.when(F.col("__moved"), F.col(f"__old{i}")).otherwise(F.col(key)))
    if facts.key_changes:
        # the old key of a key-changing UPDATE leaves: a delete event just before the new row
        away = events.where("__moved").select(
            *[F.col(f"__old{i}").alias(k) for i, k in enumerate(keys)],
            *[F.lit(None).cast(events.schema[v].dataType).alias(v) for v in values],
            F.lit("D").alias("__op"), "__lsn", "__seq", F.array().cast("array<string>").alias("__u"),
            *[F.lit(None).cast(events.schema[f"__old{i}"].dataType).alias(f"__old{i}") for i in range(len(keys))],
            F.lit(0).alias("__sub"), F.lit(False).alias("__moved"),
            *[F.col(f"__old{i}").alias(f"__src{i}") for i in range(len(keys))],
        )
        events = events.unionByName(away)

    order = [F.col("__lsn"), F.col("__seq"), F.col("__sub")]
    by_key = Window.partitionBy(*keys).orderBy(*order)
    events = events.withColumn(
        "__seg", F.sum(F.when((F.col("__op") == "I") | F.col("__moved"), 1).otherwise(0)).over(
            by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    )
    need_fill = bool(facts.unchanged)
    if need_fill:
        events = _fill_unchanged(spark, events, keys, values, rounds=_chain_depth(events, keys) if facts.moved_unchanged else 0)

    last = Window.partitionBy(*keys).orderBy(*[c.desc() for c in order])
    final = events.withColumn("__rn", F.row_number().over(last)).where("__rn = 1")
    out = [F.col(k) for k in keys]
    for index, name in enumerate(values):
        if need_fill:
            filled = F.col(f"__v{index}")
            out.append(filled["v"].alias(name))
            # after a TRUNCATE the lakehouse has nothing to keep
            out.append((filled.isNull() & F.lit(not truncated)).alias(f"__keep{index}"))
        else:
            out += [F.col(name), F.lit(False).alias(f"__keep{index}")]
    out.append(F.when(F.col("__op") == "D", "D").otherwise("U").alias("__op"))
    out += [F.col(f"__ok{i}" if need_fill else k).alias(f"__ok{i}") for i, k in enumerate(keys)]
    return Reduced(final.select(*out), truncated, facts.rows, bool(facts.moved_unchanged) and not truncated,
                   set(facts.unchanged_columns or ()) & set(values))


def _fill_unchanged(spark, events, keys, values, rounds: int):
    """Per event, each value column's latest sent value within the row's history in the batch.

    ``__v{i}`` is ``struct(v)`` (null: not known in the batch) and ``__ok{j}`` the key whose
    lakehouse row holds the unknown values: the key itself, or for a row that arrived by a key
    change the old key's origin. Key-change chains are followed one link per round.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    segment = Window.partitionBy(*keys, "__seg").orderBy("__lsn", "__seq", "__sub").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)

    def fill(frame):
        for index, name in enumerate(values):
            sent = (F.col("__op") != "D") & ~F.array_contains("__u", name)
            frame = frame.withColumn(f"__v{index}", F.last(F.when(sent, F.struct(F.col(name).alias("v"))), True).over(segment))
        for i, key in enumerate(keys):
            origin = F.first(F.when(F.col("__seg") > 0, F.col(f"__src{i}")), True).over(segment)
            frame = frame.withColumn(f"__ok{i}", F.when(F.col("__seg") == 0, F.col(key)).otherwise(origin))
        return frame

    events = fill(events)
    for _ in range(rounds):
        # a moved row inherits, for its unchanged columns, the old key's state at the move
        twins = events.where((F.col("__sub") == 0)).select(
            *[F.col(k).alias(f"__t_key{i}") for i, k in enumerate(keys)], F.col("__lsn").alias("__t_lsn"),
            F.col("__seq").alias("__t_seq"), *[F.col(f"__v{i}").alias(f"__t_v{i}") for i in range(len(values))],
            *[F.col(f"__ok{i}").alias(f"__t_ok{i}") for i in range(len(keys))],
        )
        cond = [F.col("__moved"), F.col("__lsn") == F.col("__t_lsn"), F.col("__seq") == F.col("__t_seq")]
        cond += [F.col(f"__old{i}").eqNullSafe(F.col(f"__t_key{i}")) for i in range(len(keys))]
        joined = events.join(twins, reduce(lambda a, b: a & b, cond), "left")
        inherited = []
        for index, name in enumerate(values):
            take = F.col("__moved") & F.array_contains("__u", name) & F.col(f"__t_v{index}").isNotNull()
            joined = joined.withColumn(name, F.when(take, F.col(f"__t_v{index}")["v"]).otherwise(F.col(name)))
            inherited.append(F.when(take, F.lit(name)))
        joined = joined.withColumn("__u", F.array_except("__u", F.array(*inherited)) if inherited else F.col("__u"))
        for i in range(len(keys)):
            joined = joined.withColumn(f"__src{i}", F.when(F.col("__moved"), F.col(f"__t_ok{i}")).otherwise(F.col(f"__src{i}")))
        events = fill(joined.drop(*[c for c in joined.columns if c.startswith("__t_")]))
        if rounds > 3:  # each round doubles the plan: cut it
            events = events.localCheckpoint()
    return events


def _chain_depth(events, keys) -> int:
    """How many key changes with unchanged columns follow each other in the batch (driver-side)."""
    from pyspark.sql import functions as F

    moves = events.where(F.col("__moved") & (F.size("__u") > 0)).select(
        *[f"__old{i}" for i in range(len(keys))], *keys, "__lsn", "__seq").orderBy("__lsn", "__seq").collect()
    depth_of: dict = {}
    for row in moves:
        old = tuple(row[f"__old{i}"] for i in range(len(keys)))
        depth_of[tuple(row[k] for k in keys)] = depth_of.get(old, 0) + 1
    return max(depth_of.values(), default=0)


# --- applying steps ---------------------------------------------------------------------------


class Applier:
    def __init__(self, spark, staging: Staging, lakehouse: Lakehouse):
        self.spark = spark
        self.staging = staging
        self.lakehouse = lakehouse

    def snapshot(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import functions as F

        if OCCURRENCE in types:
            return Multisets(self).snapshot(step, source, target, types)
        manifest = step.batch.manifest["tables"][source]
        frame = read_rows(self.spark, self.staging.files(step.batch, source), types, manifest["key"], changes=False)
        predicate = range_predicate(snapshot_details(step.batch.manifest, source), step.batch.name, source)
        if predicate is None:
            frame.writeTo(self.lakehouse.name(target)).overwrite(F.lit(True))
            return manifest.get("rows", 0)
        view = "__pglogical_snapshot"
        frame.createOrReplaceTempView(view)
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {view} s ON {_join(manifest)} "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{quote(c)} = s.{quote(c)}' for c in types)} "
            f"WHEN NOT MATCHED THEN INSERT ({', '.join(map(quote, types))}) VALUES ({', '.join('s.' + quote(c) for c in types)}) "
            f"WHEN NOT MATCHED BY SOURCE AND {predicate} THEN DELETE"
        )
        return manifest.get("rows", 0)

    def changes(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import functions as F

        if OCCURRENCE in types:
            return Multisets(self).changes(step, source, target, types)
        manifest = step.batch.manifest["tables"][source]
        keys = list(manifest["key"])
        if not keys:
            raise ApplyError(
                f"batch {step.batch.name}, table {source}: no replica-identity key; set REPLICA IDENTITY "
                "(a primary key, USING INDEX or FULL) on the source table"
            )
        batch_columns = [c["name"] for c in manifest["columns"]]
        values = [c for c in batch_columns if c not in keys]
        batch_types = {c: types[c] for c in batch_columns}
        if not manifest.get("files"):
            return 0
        rows = read_rows(self.spark, self.staging.files(step.batch, source), batch_types, keys, changes=True)
        reduced = reduce_changes(self.spark, rows, keys, values, step.position)
        if reduced.rows == 0:
            return 0
        frame = reduced.frame
        if reduced.truncated:
            kept = frame.where(F.col("__op") != "D").select(*[F.col(c) for c in batch_columns])
            for name, kind in types.items():  # dropped columns: NULL
                if name not in batch_types:
                    kept = kept.withColumn(name, F.lit(None).cast(kind))
            kept.select(*types).writeTo(self.lakehouse.name(target)).overwrite(F.lit(True))
            return reduced.rows
        keep = reduced.unchanged_columns
        if keep and reduced.moved_unchanged:
            frame = self._fetch_moved(frame, target, keys, values)
        source, staged = self._merge_source(frame, target, keys)
        sets = []
        for index, name in enumerate(values):
            if name in keep:
                sets.append(f"{quote(name)} = CASE WHEN s.__keep{index} THEN t.{quote(name)} ELSE s.{quote(name)} END")
            else:
                sets.append(f"{quote(name)} = s.{quote(name)}")
        matched_update = f"WHEN MATCHED THEN UPDATE SET {', '.join(sets)} " if sets else ""
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {source} s ON {_join(manifest)} "
            "WHEN MATCHED AND s.__op = 'D' THEN DELETE "
            f"{matched_update}"
            f"WHEN NOT MATCHED AND s.__op <> 'D' THEN INSERT ({', '.join(map(quote, batch_columns))}) "
            f"VALUES ({', '.join('s.' + quote(c) for c in batch_columns)})"
        )
        if staged:
            self.spark.sql(f"DROP TABLE IF EXISTS {source} PURGE")
        return reduced.rows

    def _merge_source(self, frame, target: str, keys: list[str]) -> tuple[str, bool]:
        """What the MERGE reads the reduced batch from: a temporary view or, for a bucketed target,
        an Iceberg table bucketed the same way (True).

        A MERGE shuffles every target row to join it with the batch, so its cost grows with the
        table. When both sides are Iceberg tables bucketed alike on the join key, Spark joins them
        bucket by bucket without that shuffle (a storage-partitioned join, ``session_defaults``).
        Each MERGE gets a table of its own name, dropped after it; ones a killed run left behind
        are dropped when the next run starts (:meth:`Lakehouse.drop_batch_tables`).
        """
        import uuid

        from pyspark.sql import functions as F

        if not (self.lakehouse.bucket_count and keys and self.lakehouse.bucketed(target, keys[0])):
            frame.createOrReplaceTempView("__pglogical_changes")
            return "__pglogical_changes", False
        staged = self.lakehouse.name(f"{BATCH_TABLE_PREFIX}{target}__{uuid.uuid4().hex[:12]}")
        (frame.writeTo(staged).using("iceberg").tableProperty("format-version", "2")
         .partitionedBy(F.bucket(int(self.lakehouse.bucket_count), F.col(keys[0]))).create())
        return staged, True

    def _fetch_moved(self, frame, target, keys, values):
        """Moved rows (``__ok`` != key) take kept values from the lakehouse row of their old key."""
        from pyspark.sql import functions as F

        same = reduce(lambda a, b: a & b, [F.col(k).eqNullSafe(F.col(f"__ok{i}")) for i, k in enumerate(keys)])
        moved = frame.where(~same & (F.col("__op") != "D"))
        lake = self.spark.table(self.lakehouse.name(target)).select(
            *[F.col(k).alias(f"__lk{i}") for i, k in enumerate(keys)],
            *[F.col(v).alias(f"__lv{i}") for i, v in enumerate(values)], F.lit(True).alias("__found"))
        cond = reduce(lambda a, b: a & b, [F.col(f"__ok{i}").eqNullSafe(F.col(f"__lk{i}")) for i in range(len(keys))])
        fetched = moved.join(lake, cond, "left")
        for index, name in enumerate(values):
            take = F.col(f"__keep{index}") & F.col("__found").isNotNull()
            fetched = fetched.withColumn(name, F.when(take, F.col(f"__lv{index}")).otherwise(F.col(name)))
            fetched = fetched.withColumn(f"__keep{index}", F.col(f"__keep{index}") & ~take)
        fetched = fetched.select(*frame.columns)
        return frame.where(same | (F.col("__op") == "D")).unionByName(fetched)


def is_multiset(manifest: dict) -> bool:
    """A table with REPLICA IDENTITY FULL: stored as a multiset (PostgreSQL's subscriber treats it so)."""
    return manifest.get("replica_identity", "d") == "f"


class Multisets:
    """Applies steps to a keyless table, kept as PostgreSQL's own subscriber keeps it: a multiset.

    An INSERT adds one row even when identical ones exist; a DELETE, or an UPDATE's old row,
    removes exactly one identical row; NULLs compare equal. The n identical copies of a row value
    are numbered 1..n in ``_pglogical_occurrence``, so (values, occurrence) is a key. A change
    batch reduces to the net change of the number of copies per row value and one MERGE adds
    copies count+1..count+d or deletes the copies above count+d.

    Exactly once: the MERGE also writes the batch's name into ``_pglogical_batch`` of the copies
    it inserts, or of the highest copy it keeps, so a re-run after the data commit and before
    the state commit finds the row values the batch has changed already and skips them; a row
    value the batch removed entirely cannot go below zero copies.
    """

    def __init__(self, applier: "Applier"):
        self.spark = applier.spark
        self.staging = applier.staging
        self.lakehouse = applier.lakehouse

    def snapshot(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        manifest = step.batch.manifest["tables"][source]
        if range_predicate(snapshot_details(step.batch.manifest, source), step.batch.name, source) is not None:
            raise ApplyError(
                f"batch {step.batch.name}, table {source}: a ranged backfill of a keyless table cannot be "
                "applied exactly (the change batches after it would count the rows outside the range "
                "twice); run a backfill of the whole table, which supersedes this batch"
            )
        values = _value_types(types)
        frame = read_rows(self.spark, self.staging.files(step.batch, source), values, manifest["key"], changes=False)
        copies = Window.partitionBy(*[F.col(quote(c)) for c in values]).orderBy(F.lit(1))
        numbered = frame.select(
            *[F.col(quote(c)) for c in values], F.row_number().over(copies).cast("int").alias(OCCURRENCE),
            F.lit(step.batch.name).alias(WRITTEN_BY))
        numbered.writeTo(self.lakehouse.name(target)).overwrite(F.lit(True))
        return manifest.get("rows", 0)

    def changes(self, step: Step, source: str, target: str, types: dict[str, str]) -> int:
        from pyspark.sql import functions as F

        manifest = step.batch.manifest["tables"][source]
        keys = list(manifest["key"])
        batch_columns = [c["name"] for c in manifest["columns"]]
        if sorted(keys) != sorted(batch_columns):
            raise ApplyError(
                f"batch {step.batch.name}, table {source}: the lakehouse keeps this table as a keyless multiset "
                f"but the batch's replica identity is {keys}, not every column; restore REPLICA IDENTITY FULL, "
                "or drop the Iceberg table and backfill it"
            )
        if not manifest.get("files"):
            return 0
        values = _value_types(types)
        rows = read_rows(self.spark, self.staging.files(step.batch, source), {c: types[c] for c in batch_columns},
                         keys, changes=True)
        deltas, truncated, count = multiset_deltas(rows, values, keys, step.position)
        if count == 0:
            return 0
        if truncated:
            copies = deltas.where(F.col("__d") > 0).select(
                *[F.col(quote(c)) for c in values],
                F.explode(F.sequence(F.lit(1), F.col("__d").cast("int"))).alias(OCCURRENCE))
            (copies.withColumn(WRITTEN_BY, F.lit(step.batch.name)).select(*[F.col(quote(c)) for c in types])
             .writeTo(self.lakehouse.name(target)).overwrite(F.lit(True)))
            return count
        self._merge(deltas, target, list(values), step.batch.name)
        return count

    def _merge(self, deltas, target: str, values: list[str], batch: str) -> None:
        """Set each touched row value's number of copies to (copies now) + (its change)."""
        from pyspark.sql import functions as F

        touched = deltas.where(F.col("__d") != 0).select(
            *[F.col(quote(c)).alias(f"__v{i}") for i, c in enumerate(values)], "__d")
        lake = self.spark.table(self.lakehouse.name(target)).select(
            *[F.col(quote(c)) for c in values], F.col(quote(OCCURRENCE)).alias("__occ"),
            F.col(quote(WRITTEN_BY)).alias("__by"))
        same = reduce(lambda a, b: a & b, [F.col(quote(c)).eqNullSafe(F.col(f"__v{i}")) for i, c in enumerate(values)])
        counts = (lake.join(touched, same, "right")
                  .groupBy(*[f"__v{i}" for i in range(len(values))], "__d")
                  .agg(F.count("__occ").cast("int").alias("__c"),
                       F.max(F.when(F.col("__by") == F.lit(batch), 1).otherwise(0)).alias("__done"))
                  .where(F.col("__done") == 0)  # this batch's MERGE committed already (a re-run)
                  .withColumn("__n", F.greatest(F.lit(0), F.col("__c") + F.col("__d")).cast("int")))
        row = [F.col(f"__v{i}").alias(c) for i, c in enumerate(values)]
        inserts = counts.where("__n > __c").select(
            *row, F.explode(F.sequence(F.col("__c") + 1, F.col("__n"))).alias("__occ"), F.lit("I").alias("__a"))
        deletes = counts.where("__n < __c").select(
            *row, F.explode(F.sequence(F.col("__n") + 1, F.col("__c"))).alias("__occ"), F.lit("D").alias("__a"))
        marks = counts.where("__n < __c AND __n > 0").select(*row, F.col("__n").alias("__occ"), F.lit("M").alias("__a"))
        view = "__pglogical_multiset"
        # materialised: the MERGE must not read the target it is rewriting through its own source
        inserts.unionByName(deletes).unionByName(marks).localCheckpoint().createOrReplaceTempView(view)
        join = " AND ".join(f"t.{quote(c)} <=> s.{quote(c)}" for c in values)
        written_by = sql_literal(batch)
        self.spark.sql(
            f"MERGE INTO {self.lakehouse.name(target)} t USING {view} s "
            f"ON {join} AND t.{quote(OCCURRENCE)} = s.__occ "
            "WHEN MATCHED AND s.__a = 'D' THEN DELETE "
            f"WHEN MATCHED AND s.__a = 'M' THEN UPDATE SET {quote(WRITTEN_BY)} = {written_by} "
            f"WHEN NOT MATCHED AND s.__a = 'I' THEN INSERT ({', '.join(map(quote, [*values, OCCURRENCE, WRITTEN_BY]))}) "
            f"VALUES ({', '.join('s.' + quote(c) for c in values)}, s.__occ, {written_by})"
        )


def _value_types(types: dict[str, str]) -> dict[str, str]:
    return {name: kind for name, kind in types.items() if name not in MULTISET_COLUMNS}


def multiset_deltas(rows, values: dict[str, str], keys: list[str], from_position: int):
    """Per distinct row value (NULLs equal), the net change of its number of copies in a batch.

    +1 per INSERT, -1 per DELETE, an UPDATE -1 for its old row and +1 for its new one; rows before
    ``from_position`` are skipped, and only rows after the last TRUNCATE count. Returns the frame
    (value columns + ``__d``), whether the batch truncates, and the number of change rows counted.
    """
    from pyspark.sql import functions as F

    rows = rows.where(F.col("__lsn") >= F.lit(from_position).cast("decimal(20,0)"))
    facts = rows.agg(F.count(F.lit(1)).alias("rows"),
                     F.max(F.when(F.col("__op") == "T", F.struct("__lsn", "__seq"))).alias("last_truncate")).first()
    truncated = facts.last_truncate is not None
    if truncated:
        t_lsn = F.lit(facts.last_truncate["__lsn"]).cast("decimal(20,0)")
        t_seq = F.lit(facts.last_truncate["__seq"]).cast("long")
        rows = rows.where((F.col("__lsn") > t_lsn) | ((F.col("__lsn") == t_lsn) & (F.col("__seq") > t_seq)))

    def new(name):
        return (F.col(quote(name)) if name in keys else F.lit(None)).cast(values[name]).alias(name)

    def old(name):
        return (F.col(f"__old{keys.index(name)}") if name in keys else F.lit(None)).cast(values[name]).alias(name)

    added = rows.where(F.col("__op").isin("I", "U")).select(*[new(c) for c in values], F.lit(1).alias("__d"))
    deleted = rows.where(F.col("__op") == "D").select(*[new(c) for c in values], F.lit(-1).alias("__d"))
    replaced = rows.where(F.col("__op") == "U").select(*[old(c) for c in values], F.lit(-1).alias("__d"))
    deltas = (added.unionByName(deleted).unionByName(replaced)
              .groupBy(*[F.col(quote(c)) for c in values]).agg(F.sum("__d").alias("__d")))
    return deltas, truncated, facts.rows


def _join(manifest: dict) -> str:
    # identifier (NOT NULL) keys join with '='; REPLICA IDENTITY FULL rows may hold NULLs
    equals = "<=>" if manifest.get("replica_identity", "d") == "f" else "="
    return " AND ".join(f"t.{quote(k)} {equals} s.{quote(k)}" for k in manifest["key"])


# --- the run ----------------------------------------------------------------------------------


def run(spark, staging_root: str, pipeline: str, catalog: str = "lake", namespace: str = "pglogical",
        table_map: dict | None = None, write_mode: str = "merge-on-read", bucket_count: int | None = None) -> dict:
    """Apply every pending batch of ``pipeline``; returns a summary (per step: table, batch, rows, seconds)."""
    if write_mode not in WRITE_MODES:
        raise ApplyError(f"write mode must be one of {WRITE_MODES}, not {write_mode!r}")
    table_map = table_map or {}
    staging = Staging(spark, staging_root, pipeline)
    batches = staging.committed()
    if not batches:
        log.info("no committed batch under %s", staging.directory)
        return {"pipeline": pipeline, "batches": 0, "steps": [], "seen": []}
    lakehouse = Lakehouse(spark, catalog, namespace, write_mode, bucket_count)
    if bucket_count:
        lakehouse.drop_batch_tables()
    applier = Applier(spark, staging, lakehouse)
    states = lakehouse.read_state(pipeline)
    for source, state in states.items():
        if not lakehouse.exists(state.target):
            log.warning("table %s of %s is missing: rebuilding it from staging", state.target, source)
            states[source] = TableState(state.target)

    # Manifests are read only for batches that can matter: snapshots not applied yet, and change
    # batches ending after the lowest position or after a pending snapshot (a late backfill).
    applied_anywhere = set().union(*(s.snapshots for s in states.values())) if states else set()
    pending = [b.start for b in batches if b.kind == "snapshot" and b.name not in applied_anywhere]
    floor = min([s.position for s in states.values()] + pending) if states else 0
    wanted = [b for b in batches if (b.kind == "snapshot" and b.name not in applied_anywhere) or b.end > floor]
    for batch in wanted:
        batch.manifest = staging.read_manifest(batch)
    sources = sorted({source for batch in wanted for source in batch.manifest["tables"]} | set(states))

    # "seen": every batch this run found committed; once the run succeeds, each of them is applied
    # or irrelevant, which lets the operator skip Spark when nothing else has been committed since
    summary = {"pipeline": pipeline, "batches": len(batches), "steps": [], "seen": [b.name for b in batches]}
    plans = {}
    for source in sources:
        state = states.setdefault(source, TableState(table_map.get(source) or default_target_name(source)))
        steps, superseded = plan_table(source, wanted, state)
        state.snapshots.update(superseded)
        plans[source] = steps
    # Tables advance in rounds, one step each, then one state commit: no table's recorded
    # position ever lags its data by more than one step, so a crash costs one exact re-apply.
    for round_ in range(max((len(steps) for steps in plans.values()), default=0)):
        for source, steps in plans.items():
            if round_ < len(steps):
                summary["steps"].append(_apply_step(applier, lakehouse, source, states[source], steps[round_]))
                _crash_point(len(summary["steps"]))
        lakehouse.write_state(pipeline, states)
    return summary


def _apply_step(applier: "Applier", lakehouse: Lakehouse, source: str, state: TableState, step: Step) -> dict:
    started = time.monotonic()
    types = lakehouse.ensure_table(state.target, step.batch.manifest["tables"][source])
    if step.kind == "snapshot":
        rows = applier.snapshot(step, source, state.target, types)
        state.snapshots.add(step.batch.name)
        state.position = step.position
    else:
        rows = applier.changes(step, source, state.target, types)
        state.position = step.batch.end
    state.last_batch = step.batch.name
    seconds = round(time.monotonic() - started, 3)
    log.info("%s: applied %s %s (%d rows) in %.2fs", source, step.kind, step.batch.name, rows, seconds)
    return {"table": source, "target": state.target, "kind": step.kind, "batch": step.batch.name,
            "rows": rows, "seconds": seconds}


def _crash_point(step: int) -> None:
    """Tests only: die like a killed executor between a data commit and its state commit."""
    if os.environ.get("PGLOGICAL_APPLY_CRASH_BEFORE_STATE") == str(step):
        log.error("crash point reached after the data commit of step %d", step)
        os.kill(os.getpid(), signal.SIGKILL)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--staging-root", required=True, help="staging root URI (file:///x, s3a://b/x, /x)")
    parser.add_argument("--pipeline", required=True, help="pipeline name: batches live in <root>/<pipeline>/")
    parser.add_argument("--catalog", default="lake", help="Spark catalog name of the Iceberg catalog")
    parser.add_argument("--namespace", required=True, help="Iceberg namespace of the target tables")
    parser.add_argument("--table-map", default=None,
                        help='JSON: {"schema.table": "target_table"}; default <schema>__<table>')
    parser.add_argument("--write-mode", choices=WRITE_MODES, default="merge-on-read")
    parser.add_argument("--bucket-count", type=int, default=None,
                        help="partition new tables by bucket(N, first key column)")
    parser.add_argument("--log-level", default="WARN", help="Spark's log level inside the job (default WARN)")
    return parser.parse_args(argv)


def session_defaults(default_parallelism: int) -> dict[str, str]:
    """Spark SQL settings for applying batches that are small next to their tables.

    * a few shuffle partitions per core, not 200;
    * storage-partitioned joins: a bucketed target MERGEs with a batch bucketed alike without
      shuffling the target (only tables created with ``--bucket-count`` are bucketed).
    """
    return {
        "spark.sql.shuffle.partitions": str(max(4, 2 * default_parallelism)),
        "spark.sql.sources.v2.bucketing.enabled": "true",
        "spark.sql.iceberg.planning.preserve-data-grouping": "true",
        "spark.sql.sources.v2.bucketing.pushPartValues.enabled": "true",
        "spark.sql.requireAllClusterKeysForCoPartition": "false",
    }


def tune_session(spark) -> None:
    """Apply :func:`session_defaults` where the submitter did not set its own value."""
    conf = spark.sparkContext.getConf()
    for key, value in session_defaults(spark.sparkContext.defaultParallelism).items():
        if not conf.contains(key):
            spark.conf.set(key, value)


def main(argv: list[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = (
        SparkSession.builder.appName(f"pglogical-apply-{args.pipeline}")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.caseSensitive", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(args.log_level)
    tune_session(spark)
    summary = run(spark, args.staging_root, args.pipeline, args.catalog, args.namespace,
                  json.loads(args.table_map) if args.table_map else None, args.write_mode, args.bucket_count)
    print(RESULT_PREFIX + json.dumps(summary), flush=True)  # for people reading the log
    write_result(spark, summary)
    spark.stop()
    return 0


# Kept in step with verify_tables.py's copy: each job is submitted as one file with nothing beside it
# (shipping spark/ as a zip through py_files is issue 15).
def write_result(spark, summary: dict) -> None:
    """Leave the summary where the operator reads it (``spark.pglogical.resultUri``): stdout is lost
    in cluster deploy modes. Written to a temporary name, then renamed."""
    uri = spark.conf.get("spark.pglogical.resultUri", None)
    if not uri:
        return
    hadoop_path = spark._jvm.org.apache.hadoop.fs.Path
    fs = hadoop_path(uri).getFileSystem(spark._jsc.hadoopConfiguration())
    fs.setWriteChecksum(False)
    out = fs.create(hadoop_path(uri + ".tmp"), True)
    try:
        out.write(bytearray(json.dumps(summary).encode()))
    finally:
        out.close()
    if not fs.rename(hadoop_path(uri + ".tmp"), hadoop_path(uri)):
        raise OSError(f"could not rename the result file to {uri}")


if __name__ == "__main__":
    sys.exit(main())
