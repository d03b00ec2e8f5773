"""A change batch, read and reduced to one row per key: what one MERGE INTO a keyed table needs
(and, at the end, netted per row value: what a keyless table's MERGE needs).

The reduction keeps the last change per key by ``(_commit_lsn, _seq)``, skips rows before the
table's position and before the last TRUNCATE, turns a key-changing UPDATE into a delete of the
old key plus the new row, and fills unchanged-TOAST columns from an earlier change of the same
row in the batch (following key changes) or marks them to keep the lakehouse's value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.common.identifiers import col, quote
from airflow_provider_pglogical.staging.contract import (
    COMMIT_LSN,
    MULTISET_COLUMNS,
    OLD_KEY_PREFIX,
    OP,
    SEQ,
    UNCHANGED,
    staged_name,
)
from airflow_provider_pglogical.staging.seam.manifests import ChangeFacts, TableManifest


def read_rows(spark, files: list[str], staged: dict[str, str], types: dict[str, str], keys: list[str],
              changes: bool):
    """The batch's rows of one table: value columns cast to their lakehouse type (+ metadata).

    :param staged: the files' columns and Spark types (``column_types.staged_columns``).
    Change rows also get ``__op``, ``__lsn``, ``__seq``, ``__u`` (unchanged-TOAST column names)
    and ``__old{i}`` (the old key of an UPDATE or DELETE).
    """
    from pyspark.sql import functions as F

    if not files:  # a table with no rows in this batch
        return spark.createDataFrame([], ", ".join(f"{quote(n)} {t}" for n, t in types.items()))
    # the schema is given, not inferred (a Spark job per read); staged Parquet is proleptic
    # Gregorian (pyarrow): read dates before 1582 as they are
    raw = (spark.read.schema(", ".join(f"{quote(n)} {t}" for n, t in staged.items()))
           .option("datetimeRebaseMode", "CORRECTED").option("int96RebaseMode", "CORRECTED").parquet(*files))
    present = set(raw.columns)

    def value(name):
        staged = staged_name(name) if changes else name  # snapshot files keep every name as it is
        return (col(staged) if staged in present else F.lit(None)).cast(types[name]).alias(name)

    columns = [value(name) for name in types]
    if not changes:
        return raw.select(*columns)
    unchanged = col(UNCHANGED) if UNCHANGED in present else F.lit(None)
    columns += [
        col(OP).alias("__op"),
        col(COMMIT_LSN).cast("decimal(20,0)").alias("__lsn"),
        col(SEQ).cast("long").alias("__seq"),
        F.coalesce(unchanged.cast("array<string>"), F.array().cast("array<string>")).alias("__u"),
    ]
    for index, key in enumerate(keys):
        old = OLD_KEY_PREFIX + key
        columns.append((col(old) if old in present else F.lit(None)).cast(types[key]).alias(f"__old{index}"))
    frame = raw.select(*columns)
    # REPLICA IDENTITY FULL: every column is key, and an unchanged TOAST value is in the old tuple
    # (one projection for all keys: each withColumn is a round of analysis in the driver)
    return frame.withColumns({
        key: F.when(F.array_contains("__u", key) & F.col(f"__old{index}").isNotNull(), F.col(f"__old{index}"))
        .otherwise(col(key))
        for index, key in enumerate(keys)
    })



def from_position_on(rows, position: int):
    """The change rows committed at or after ``position`` (the rest is in the lakehouse already)."""
    from pyspark.sql import functions as F

    return rows.where(F.col("__lsn") >= F.lit(position).cast("decimal(20,0)"))


def last_truncate():
    """Aggregate: ``(__lsn, __seq)`` of the batch's last TRUNCATE, null when there is none."""
    from pyspark.sql import functions as F

    return F.max(F.when(F.col("__op") == "T", F.struct("__lsn", "__seq"))).alias("last_truncate")


def after_truncate(rows, truncate):
    """The rows after the TRUNCATE at ``truncate`` (a Row of :func:`last_truncate`); all when None."""
    from pyspark.sql import functions as F

    if truncate is None:
        return rows
    t_lsn = F.lit(truncate["__lsn"]).cast("decimal(20,0)")
    t_seq = F.lit(truncate["__seq"]).cast("long")
    return rows.where((F.col("__lsn") > t_lsn) | ((F.col("__lsn") == t_lsn) & (F.col("__seq") > t_seq)))


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


def reduce_changes(spark, rows, keys: list[str], values: list[str], from_position: int,
                   known: ChangeFacts | None = None) -> Reduced:
    """Last change per key by ``(_commit_lsn, _seq)``, TRUNCATE, key changes and unchanged TOAST.

    :param known: the pull's facts of the rows when they decide the batch's aggregate
        (``contract.facts_decide``): no Spark job reads the batch to learn them.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = from_position_on(rows, from_position)
    old_given = reduce(lambda a, b: a | b, [F.col(f"__old{i}").isNotNull() for i in range(len(keys))], F.lit(False))
    same_key = reduce(lambda a, b: a & b, [col(k).eqNullSafe(F.col(f"__old{i}")) for i, k in enumerate(keys)], F.lit(True))
    is_key_change = (F.col("__op") == "U") & old_given & ~same_key
    facts = _known_facts(known) if known is not None else rows.agg(
        F.count(F.lit(1)).alias("rows"),
        last_truncate(),
        F.max(F.when(F.size("__u") > 0, 1).otherwise(0)).alias("unchanged"),
        F.max(F.when(is_key_change, 1).otherwise(0)).alias("key_changes"),
        F.max(F.when(is_key_change & (F.size("__u") > 0), 1).otherwise(0)).alias("moved_unchanged"),
        F.array_distinct(F.flatten(F.collect_set("__u"))).alias("unchanged_columns"),
        # the key changes that leave columns unchanged, for the chain depth (in this same pass)
        F.collect_list(F.when(is_key_change & (F.size("__u") > 0), F.struct(
            "__lsn", "__seq", F.struct(*[F.col(f"__old{i}") for i in range(len(keys))]).alias("old"),
            F.struct(*map(col, keys)).alias("new")))).alias("moves"),
    ).first()
    truncated = facts.last_truncate is not None
    rows = after_truncate(rows, facts.last_truncate).where(F.col("__op") != "T")

    moved = is_key_change if facts.key_changes else F.lit(False)
    events = rows.withColumns({
        "__sub": F.lit(1), "__moved": moved,
        **{f"__src{i}": F.when(moved, F.col(f"__old{i}")).otherwise(col(key)) for i, key in enumerate(keys)},
    })
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
    by_key = Window.partitionBy(*map(col, keys)).orderBy(*order)
    events = events.withColumn(
        "__seg", F.sum(F.when((F.col("__op") == "I") | F.col("__moved"), 1).otherwise(0)).over(
            by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    )
    need_fill = bool(facts.unchanged)
    if need_fill:
        events = _fill_unchanged(spark, events, keys, values, rounds=chain_depth(facts.moves))

    last = Window.partitionBy(*map(col, keys)).orderBy(*[c.desc() for c in order])
    final = events.withColumn("__rn", F.row_number().over(last)).where("__rn = 1")
    out = [col(k) for k in keys]
    for index, name in enumerate(values):
        if need_fill:
            filled = F.col(f"__v{index}")
            out.append(filled["v"].alias(name))
            # after a TRUNCATE the lakehouse has nothing to keep
            out.append((filled.isNull() & F.lit(not truncated)).alias(f"__keep{index}"))
        else:
            out += [col(name), F.lit(False).alias(f"__keep{index}")]
    out.append(F.when(F.col("__op") == "D", "D").otherwise("U").alias("__op"))
    out += [(F.col(f"__ok{i}") if need_fill else col(k)).alias(f"__ok{i}") for i, k in enumerate(keys)]
    return Reduced(final.select(*out), truncated, facts.rows, bool(facts.moved_unchanged) and not truncated,
                   set(facts.unchanged_columns or ()) & set(values))


@dataclass
class _Facts:
    """The batch aggregate's fields, as ``reduce_changes`` reads them."""

    rows: int
    last_truncate: object = None
    unchanged: int = 0
    key_changes: int = 0
    moved_unchanged: int = 0
    unchanged_columns: list = field(default_factory=list)
    moves: list = field(default_factory=list)


def _known_facts(known: ChangeFacts) -> _Facts:
    """The aggregate's answer for rows without a TRUNCATE or an unchanged value: a key change is
    possible wherever an old key was staged (each row's own test then decides)."""
    return _Facts(rows=known.rows, key_changes=int(known.old_keys))


def _fill_unchanged(spark, events, keys, values, rounds: int):
    """Per event, each value column's latest sent value within the row's history in the batch.

    ``__v{i}`` is ``struct(v)`` (null: not known in the batch) and ``__ok{j}`` the key whose
    lakehouse row holds the unknown values: the key itself, or for a row that arrived by a key
    change the old key's origin. Key-change chains are followed one link per round.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    segment = Window.partitionBy(*map(col, keys), F.col("__seg")).orderBy("__lsn", "__seq", "__sub").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)

    def fill(frame):
        filled = {}
        for index, name in enumerate(values):
            sent = (F.col("__op") != "D") & ~F.array_contains("__u", name)
            filled[f"__v{index}"] = F.last(F.when(sent, F.struct(col(name).alias("v"))), True).over(segment)
        for i, key in enumerate(keys):
            origin = F.first(F.when(F.col("__seg") > 0, F.col(f"__src{i}")), True).over(segment)
            filled[f"__ok{i}"] = F.when(F.col("__seg") == 0, col(key)).otherwise(origin)
        return frame.withColumns(filled)

    events = fill(events)
    for _ in range(rounds):
        # a moved row inherits, for its unchanged columns, the old key's state at the move
        twins = events.where((F.col("__sub") == 0)).select(
            *[col(k).alias(f"__t_key{i}") for i, k in enumerate(keys)], F.col("__lsn").alias("__t_lsn"),
            F.col("__seq").alias("__t_seq"), *[F.col(f"__v{i}").alias(f"__t_v{i}") for i in range(len(values))],
            *[F.col(f"__ok{i}").alias(f"__t_ok{i}") for i in range(len(keys))],
        )
        cond = [F.col("__moved"), F.col("__lsn") == F.col("__t_lsn"), F.col("__seq") == F.col("__t_seq")]
        cond += [F.col(f"__old{i}").eqNullSafe(F.col(f"__t_key{i}")) for i in range(len(keys))]
        joined = events.join(twins, reduce(lambda a, b: a & b, cond), "left")
        inherited, changed = [], {}
        for index, name in enumerate(values):  # every expression reads the joined row as it was
            take = F.col("__moved") & F.array_contains("__u", name) & F.col(f"__t_v{index}").isNotNull()
            changed[name] = F.when(take, F.col(f"__t_v{index}")["v"]).otherwise(col(name))
            inherited.append(F.when(take, F.lit(name)))
        if inherited:
            changed["__u"] = F.array_except("__u", F.array(*inherited))
        for i in range(len(keys)):
            changed[f"__src{i}"] = F.when(F.col("__moved"), F.col(f"__t_ok{i}")).otherwise(F.col(f"__src{i}"))
        joined = joined.withColumns(changed)
        events = fill(joined.drop(*[c for c in joined.columns if c.startswith("__t_")]))
        if rounds > 3:  # each round doubles the plan: cut it
            events = events.localCheckpoint()
    return events


def chain_depth(moves) -> int:
    """How many key changes with unchanged columns follow each other in the batch: each one that
    moves a row which itself arrived by such a change adds a link (driver-side, from the moves the
    batch's one aggregate collected)."""
    depth_of: dict = {}
    for move in sorted(moves or (), key=lambda m: (m["__lsn"], m["__seq"])):
        depth_of[tuple(move["new"])] = depth_of.get(tuple(move["old"]), 0) + 1
    return max(depth_of.values(), default=0)


# keyless tables (multisets) ----------------------------------------------------------------------
def multiset_values(types: dict[str, str]) -> dict[str, str]:
    """A keyless table's value columns (its multiset columns left out)."""
    return {name: kind for name, kind in types.items() if name not in MULTISET_COLUMNS}


def multiset_deltas(rows, values: dict[str, str], keys: list[str], from_position: int,
                    known_rows: int | None = None):
    """Per distinct row value (NULLs equal), the net change of its number of copies in a batch.

    +1 per INSERT, -1 per DELETE, an UPDATE -1 for its old row and +1 for its new one; rows before
    ``from_position`` are skipped, and only rows after the last TRUNCATE count. Returns the frame
    (value columns + ``__d``), whether the batch truncates, and the number of change rows counted.

    :param known_rows: the pull's count when its facts decide the batch (``contract.facts_decide``:
        every row counts, no TRUNCATE): no Spark job counts them.
    """
    from pyspark.sql import functions as F

    rows = from_position_on(rows, from_position)
    if known_rows is not None:
        count, truncate = known_rows, None
    else:
        facts = rows.agg(F.count(F.lit(1)).alias("rows"), last_truncate()).first()
        count, truncate = facts.rows, facts.last_truncate
    rows = after_truncate(rows, truncate)

    deltas = signed_copies(rows, values, keys).groupBy(*[col(c) for c in values]).agg(F.sum("__d").alias("__d"))
    return deltas, truncate is not None, count


def signed_copies(rows, values: dict[str, str], keys: list[str], keep: tuple[str, ...] = ()):
    """Each change row as the copies it adds (+1) and removes (-1): an INSERT adds its row, a
    DELETE removes it, an UPDATE removes its old row and adds its new one. ``keep`` names change
    columns (``__op``, ``__lsn``, ``__seq``) to carry along; with ``__op`` kept, a TRUNCATE stays
    as a row of its own (``__d`` 0) so that the rows before it can be dropped."""
    from pyspark.sql import functions as F

    def new(name):
        return (col(name) if name in keys else F.lit(None)).cast(values[name]).alias(name)

    def old(name):
        return (F.col(f"__old{keys.index(name)}") if name in keys else F.lit(None)).cast(values[name]).alias(name)

    def none(name):
        return F.lit(None).cast(values[name]).alias(name)

    kept = [F.col(name) for name in keep]
    parts = [
        rows.where(F.col("__op").isin("I", "U")).select(*[new(c) for c in values], F.lit(1).alias("__d"), *kept),
        rows.where(F.col("__op") == "D").select(*[new(c) for c in values], F.lit(-1).alias("__d"), *kept),
        rows.where(F.col("__op") == "U").select(*[old(c) for c in values], F.lit(-1).alias("__d"), *kept),
    ]
    if "__op" in keep:
        parts.append(rows.where(F.col("__op") == "T").select(*[none(c) for c in values], F.lit(0).alias("__d"), *kept))
    return reduce(lambda a, b: a.unionByName(b), parts)


def check_multiset_identity(batch: str, source: str, manifest: TableManifest) -> None:
    """Refuse a batch of a keyless table whose replica identity is not every column (FULL)."""
    keys = list(manifest.key)
    if sorted(keys) != sorted(c.name for c in manifest.columns):
        raise ApplyError(
            f"batch {batch}, table {source}: the lakehouse keeps this table as a keyless multiset "
            f"but the batch's replica identity is {keys}, not every column; restore REPLICA IDENTITY FULL, "
            "or drop the Iceberg table and backfill it"
        )
