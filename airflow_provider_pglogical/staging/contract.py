"""The staging contract: what capture writes and the Spark apply job reads, in one place.

Imports nothing but the standard library, because the Spark job ships it to the cluster beside
itself (``spark/launch.py`` zips ``spark/`` with this module through ``py_files``) and a
cluster has neither Airflow, psycopg2 nor pyarrow. The Python side (``staging/layout.py``,
``staging/typemap.py``, ``decoding/staged_tables.py``) and the job read every name, pattern and
type rule from here, so the two sides cannot drift apart.

A batch is ``<root>/<pipeline>/<start>-<end>-<kind>/`` (LSNs as 16 upper-case hex digits, so
names sort in LSN order whatever the kind) holding Parquet files per table and
:data:`MANIFEST`, written last. A *position* P means every transaction committed before P is
reflected and none at or after it.
"""

from __future__ import annotations

import hashlib
import re

# --- batches -------------------------------------------------------------------------------------

MANIFEST = "_manifest.json"
FORMAT_VERSION = 1
KINDS = ("snapshot", "changes")
BATCH_NAME = re.compile(r"^([0-9A-F]{16})-([0-9A-F]{16})-(snapshot|changes)$")


def hex16(position: int) -> str:
    """An LSN as the 16 hex digits batch names and the state table use."""
    return f"{position:016X}"


def format_batch_name(start: int, end: int, kind: str) -> str:
    """The directory name of a batch covering ``[start, end)`` (a snapshot: ``start == end``)."""
    if kind not in KINDS:
        raise ValueError(f"batch kind must be one of {KINDS}, not {kind!r}")
    return f"{hex16(start)}-{hex16(end)}-{kind}"


def parse_batch_name(name: str) -> tuple[int, int, str] | None:
    """``(start, end, kind)`` of a batch directory name; None for anything else under staging."""
    match = BATCH_NAME.match(name)
    return (int(match.group(1), 16), int(match.group(2), 16), match.group(3)) if match else None


# --- the chain of change batches (invariant 12) --------------------------------------------------

#: a change batch's manifest key: where the change batch before it ended (``X/Y``). The slot
#: decoded nothing of the pipeline's publications between there and the batch's own start (empty
#: windows advance the slot without a batch), so ``[previous_end, end)`` of consecutive batches
#: tile the WAL: a batch that is missing leaves a hole the apply finds. Batches staged before
#: this key existed have none.
PREVIOUS_END = "previous_end"
#: the key of the pipeline's record (:data:`PIPELINE_RECORD`) holding the end of the newest change
#: batch the pull committed: a deleted newest batch is a hole too
STAGED_THROUGH = "staged_through"
#: keys of a manifest's file entries (``{"path", "rows", "size", "sha256"}``): the file's length in
#: bytes and its SHA-256 (hex), computed while it was written
FILE_SIZE = "size"
FILE_SHA256 = "sha256"


def parse_lsn(text: str) -> int:
    """``"16/B374D848"`` -> its integer (the manifests' LSN text)."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def format_lsn(value: int) -> str:
    """An LSN as PostgreSQL prints it (``16/B374D848``), for messages."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


# --- change rows ---------------------------------------------------------------------------------

#: metadata columns of a staged change row; the source columns follow, then ``_old_<key>`` columns
OP = "_op"
COMMIT_LSN = "_commit_lsn"
SEQ = "_seq"
XID = "_xid"
COMMIT_TS = "_commit_ts"
UNCHANGED = "_unchanged_toast"
OLD_KEY_PREFIX = "_old_"
CHANGE_METADATA = (OP, COMMIT_LSN, SEQ, XID, COMMIT_TS, UNCHANGED)
#: marks a source column staged under another name (see :func:`staged_name`)
ESCAPE = "~"


def staged_name(column: str) -> str:
    """The name a source column has in a staged *change* file: its own, unless that is taken.

    A source column may be called anything, ``_op`` or ``_old_id`` included, and may be added at
    any time after the slot exists. Names a metadata column has or could have (a metadata name,
    ``_old_…``) and names starting with :data:`ESCAPE` are staged as ``ESCAPE + name``: no staged
    source name then equals another or a metadata name. Snapshot files hold source columns only
    and keep every name as it is.
    """
    if column in CHANGE_METADATA or column.startswith(OLD_KEY_PREFIX) or column.startswith(ESCAPE):
        return ESCAPE + column
    return column


#: key of a snapshot table's manifest ``details``: why the apply replaces the Iceberg table itself (drops
#: and creates it) before writing the snapshot: DDL at the source that the lakehouse cannot follow
REPLACE_TABLE = "replace_table"
#: key of the pipeline record's ``extra``: source table -> ``{"why", "action"}`` of each table a
#: ``publish_via_partition_root`` flip orphaned; the apply marks (``action`` "mark") or drops its
#: Iceberg table (``capture/published_changes.py``)
ORPHANED_TABLES = "orphaned"
#: the Iceberg table property of an orphaned table: why no change reaches it any more
ORPHANED_PROPERTY = "pglogical.orphaned"
#: key of a change table's manifest ``details``: ``{"renamed": {old: new}, "dropped": [names]}``, the
#: columns renamed (same attnum) or dropped at the source, which the apply renames (same field id)
#: or drops in the Iceberg table before the batch
COLUMN_EVOLUTION = "column_evolution"
#: key of a table manifest's ``details``: the table's name at the source when it differs from the
#: name it is staged under (its identity: the name the pipeline first snapshotted it by)
SOURCE_NAME = "source_name"

#: key of a change table's manifest ``details``: what the pull knows of the rows it staged, so the
#: apply job need not read them once to learn it (``rows``, ``first_commit_lsn``, ``unchanged``:
#: some row keeps a value, ``old_keys``: some row has an old key); see :func:`facts_decide`
CHANGE_FACTS = "change_facts"


#: in a folded step's table manifest (``spark/apply/plan.py``: ``fold_changes``), each file entry
#: names the batch directory it lies in
FOLDED_FROM = "folded_from"
#: a streaming window folds the pending change batches of a table into one step of at most this
#: many staged rows (``ApplyOptions.fold_rows``)
DEFAULT_FOLD_ROWS = 500_000


def facts_decide(details: dict, position: int) -> dict | None:
    """The pull's facts of a table's change rows when they answer what the apply job would
    otherwise aggregate: every row is at or after ``position``, none is a TRUNCATE and none keeps
    an unchanged value. None otherwise, or for a batch staged before facts were written."""
    facts = details.get(CHANGE_FACTS)
    if not facts or details.get("truncated") or facts["unchanged"]:
        return None
    if facts["rows"] and facts["first_commit_lsn"] < position:
        return None
    return facts


# --- the lakehouse side --------------------------------------------------------------------------

#: the Iceberg table holding each pipeline's applied positions, in the target namespace
STATE_TABLE = "_pglogical_state"
#: table property holding the replica-identity key (JSON list) of every table the job creates
KEY_PROPERTY = "pglogical.replica-identity-key"
#: what every snapshot the apply commits to a target table records in its summary: the pipeline,
#: the batch, the position the table holds after the commit (16 hex digits; absent when the commit
#: leaves the table at no one source position: a ranged backfill catching up) and the position from
#: which the commit applied changes, so a reader can take one cut across tables
#: (``lakehouse/consistent_cut.py``)
SNAPSHOT_PIPELINE = "pglogical.pipeline"
SNAPSHOT_BATCH = "pglogical.batch"
SNAPSHOT_LSN = "pglogical.lsn"
SNAPSHOT_FROM_LSN = "pglogical.from-lsn"
#: a snapshot batch's details entry when it is part of a chunked initial load (``capture/chunked/``):
#: the load's empty start (``empty_start``) or one of its chunks (its ``key_range`` ends the table
#: when its end is null; a table loaded whole has one chunk without a ``key_range``, ``whole`` saying
#: why: a whole snapshot at its temporary slot's LSN); until a table's last chunk is applied its
#: commits are no cut
CHUNKED_LOAD = "chunked_load"
#: metadata columns of a keyless (REPLICA IDENTITY FULL) table, kept as a multiset: which copy of
#: identical rows this row is (1..n), and the batch that last changed how many copies there are
OCCURRENCE = "_pglogical_occurrence"
WRITTEN_BY = "_pglogical_batch"
MULTISET_COLUMNS = {OCCURRENCE: "int", WRITTEN_BY: "string"}
WRITE_MODES = ("merge-on-read", "copy-on-write")
#: tables the apply job applies at once: enough to overlap one MERGE's planning and commit with
#: another's work on the executors
DEFAULT_CONCURRENCY = 4
#: the Spark property naming the file a job leaves its JSON result in
RESULT_CONF = "spark.pglogical.resultUri"
#: the pipeline's record under ``<root>/<pipeline>/`` (``staging/pipeline_record.py``); its
#: ``extra[SOURCE_IDENTITY]`` names the publisher database (``system_identifier``, ``database``, ``database_oid``)
PIPELINE_RECORD = "_pipeline.json"
SOURCE_IDENTITY = "source"
#: staged rows are private to the OS user the provider runs as (files 0600, directories 0700) on
#: a local file system; this environment variable widens them (octal, e.g. ``640``: group-readable)
STAGING_FILE_MODE_ENV = "PGLOGICAL_STAGING_FILE_MODE"
DEFAULT_STAGING_FILE_MODE = 0o600
#: the Spark property that hands the file mode to a job (the operators set it)
STAGING_FILE_MODE_CONF = "spark.pglogical.stagingFileMode"


def staging_file_mode(text: str | None) -> int:
    """The mode of staged files from its octal text (None or empty: the private default); a
    ValueError names what is wrong. The owner must keep read and write."""
    if text is None or not str(text).strip():
        return DEFAULT_STAGING_FILE_MODE
    try:
        mode = int(str(text).strip(), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
        raise ValueError(f"{STAGING_FILE_MODE_ENV}={text!r} is not a usable file mode: give octal permission "
                         "bits that keep the owner's read and write, e.g. 600 (private, the default) or "
                         "640 (readable by the group)")
    return mode


def staging_directory_mode(file_mode: int) -> int:
    """The mode of staged directories: the owner's ``rwx``, and ``x`` wherever files are readable."""
    return file_mode | 0o700 | ((file_mode & 0o044) >> 2)
#: what staging retention removed, under ``<root>/<pipeline>/`` (``spark/apply/retention.py``)
RETENTION_RECORD = "_retention.json"
#: where retention moves batches when it archives instead of deleting: ``<root>/<pipeline>/_archive/``
ARCHIVE_DIRECTORY = "_archive"
#: the default retention of applied batches, in hours (a week: re-applies, verifies and slow backfills)
DEFAULT_RETENTION_HOURS = 168
#: the apply job also prints its result after this prefix, for people reading the log
APPLY_RESULT_PREFIX = "PGLOGICAL_APPLY_RESULT "
#: table property of the state table holding a pipeline's apply lease (JSON: holder, by,
#: taken_at, expires_at), one apply per pipeline and lakehouse (``spark/row_delta/driver_commits.py``)
APPLY_LEASE_PROPERTY_PREFIX = "pglogical.apply-lease."
#: how long an apply's lease lasts unless renewed (seconds; renewed every third of it), so a killed
#: apply blocks the next one for at most this long
DEFAULT_APPLY_LEASE_SECONDS = 120
#: ``error.kind`` of a job result: another apply of the pipeline holds the lease (retry later)
APPLY_LEASE_HELD = "apply-lease-held"
#: seconds between two looks of a streaming window: the pull's pulls, the apply's listings
DEFAULT_POLL_INTERVAL = 0.5
#: an apply compacts a table it wrote once the table holds this many delete files (0: never;
#: ``spark/housekeeping/delete_compaction.py``)
DEFAULT_COMPACT_DELETES_AT = 32
#: what the tasks measured, tick by tick (and round by round in a ``--keep-running`` window of the
#: apply job): ``<root>/<pipeline>/_history_<kind>.jsonl``, the newest :data:`HISTORY_KEEP` entries
#: (``ui/history.py`` reads and writes them; the apply job writes its rounds' entries itself)
HISTORY_KINDS = ("pull", "apply")
HISTORY_KEEP = 500


def history_name(kind: str) -> str:
    if kind not in HISTORY_KINDS:
        raise ValueError(f"history kind must be one of {HISTORY_KINDS}, not {kind!r}")
    return f"_history_{kind}.jsonl"


# --- table identity (DESIGN invariant 11) ---------------------------------------------------------

#: table property of a keyless table whose every row has its copy number (set once that is so)
NUMBERED_PROPERTY = "pglogical.multiset-numbered"
#: table property of every table the apply writes: JSON ``{"pipeline", "source", "table"}``
OWNER_PROPERTY = "pglogical.owner"
#: a schema or table name that needs no quoting in a table key
_KEY_PLAIN = re.compile(r'^[^."]+$')
#: schema and table names whose default target is ``<schema>__<table>`` as written (one split)
_TARGET_PLAIN_SCHEMA = re.compile(r"^(?!.*__)[a-z0-9_]*[a-z0-9]$")
_TARGET_PLAIN_TABLE = re.compile(r"^[a-z0-9_]+$")


def quote_part(name: str) -> str:
    """A name in double quotes, inner quotes doubled, as PostgreSQL writes a quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def table_key(schema: str, table: str) -> str:
    """The one key of a source table in manifests, the state table, ``table_map`` and
    ``type_overrides``: ``schema.table`` when neither name holds a dot or a double quote, else
    both quoted (``"x.y"."z"``), so two tables never share a key. Names are exact (case kept)."""
    if _KEY_PLAIN.match(schema) and _KEY_PLAIN.match(table):
        return f"{schema}.{table}"
    return f"{quote_part(schema)}.{quote_part(table)}"


def split_dotted(text: str, parts: int, what: str) -> tuple[str, ...]:
    """``text`` split into ``parts`` names at the dots outside double quotes (``'"x.y".z'``);
    unquoted names are taken as written. ValueError, naming the quoting fix, when the count differs."""
    names: list[str] = []
    i = 0
    while True:
        if text.startswith('"', i):
            end, chars = i + 1, []
            while True:
                close = text.find('"', end)
                if close < 0:
                    raise ValueError(f"{what} {text!r} has an unterminated double quote")
                chars.append(text[end:close])
                if text.startswith('"', close + 1):  # a doubled quote inside the name
                    chars.append('"')
                    end = close + 2
                    continue
                break
            names.append("".join(chars))
            i = close + 1
        else:
            end = text.find(".", i)
            end = len(text) if end < 0 else end
            if '"' in text[i:end] or end == i:
                raise ValueError(f"{what} {text!r} is not {parts} names separated by dots")
            names.append(text[i:end])
            i = end
        if i == len(text):
            break
        if text[i] != ".":
            raise ValueError(f"{what} {text!r} has text after a closing double quote")
        i += 1
    if len(names) != parts:
        raise ValueError(
            f"{what} {text!r} is {len(names)} dot-separated names, not {parts}: a name that holds a dot must be "
            f"written in double quotes, e.g. '\"x.y\".z' for table z of schema \"x.y\"")
    return tuple(names)


def parse_table_key(key: str) -> tuple[str, str]:
    """``(schema, table)`` of a table key or a user's ``"schema.table"`` (quoted parts allowed)."""
    schema, table = split_dotted(key, 2, "table name")
    return schema, table


def normal_table_key(key: str) -> str:
    """A user's ``"schema.table"`` as the pipeline's :func:`table_key` (``'"x.y".z'`` -> ``'"x.y"."z"'``)."""
    return table_key(*parse_table_key(key))


def override_key(table: str, column: str) -> str:
    """The ``type_overrides`` key of a column of a table (a :func:`table_key`)."""
    return f"{table}.{column if _KEY_PLAIN.match(column) else quote_part(column)}"


def keyed_tables(tables: dict) -> dict:
    """A manifest's ``tables`` keyed by :func:`table_key` of each entry's ``schema`` and ``name``:
    batches staged before keys were quoted used ``schema.table`` as written, ambiguous with dots."""
    return {table_key(t["schema"], t["name"]) if "schema" in t and "name" in t else key: t
            for key, t in tables.items()}


def default_target_name(source: str) -> str:
    """The Iceberg table of a source table (a :func:`table_key`) when ``table_map`` names none.

    ``public.orders`` -> ``public__orders``: lower-case names of letters, digits and ``_`` (a schema
    without ``__`` and not ending in ``_``) map as written. Any other name is made readable the
    same way and gets 8 hex digits of its key's SHA-256, so ``"Foo"`` and ``foo``, or ``"a-b"`` and
    ``a_b``, get two tables (``public__foo_…``, ``public__foo``); the apply still refuses two
    sources with one target.
    """
    schema, table = parse_table_key(source)
    readable = re.sub(r"[^a-z0-9_]", "_", f"{schema}__{table}".lower())
    if _TARGET_PLAIN_SCHEMA.match(schema) and _TARGET_PLAIN_TABLE.match(table):
        return readable
    return f"{readable}_{hashlib.sha256(table_key(schema, table).encode()).hexdigest()[:8]}"


#: column names Iceberg (1.9) keeps for its metadata columns: a table column so named is shadowed
#: by them in every read (``MetadataColumns``), and ``_row_id`` / ``_last_updated_sequence_number``
#: are format v3's row lineage
ICEBERG_RESERVED_COLUMNS = frozenset({
    "_file", "_pos", "_deleted", "_spec_id", "_partition", "_row_id", "_last_updated_sequence_number",
    "_change_type", "_change_ordinal", "_commit_snapshot_id",
})


def column_name_problems(table: str, columns: list[str], *, multiset: bool = False) -> list[str]:
    """What makes these source columns unfit for one Iceberg table that any Spark session reads:
    a name Iceberg reserves, or two names that differ only in case (Spark's default session
    resolves names case-insensitively). Each problem names the column and the fix."""
    problems = []
    reserved = ICEBERG_RESERVED_COLUMNS | (set(MULTISET_COLUMNS) if multiset else set())
    for name in columns:
        if name.lower() in reserved:
            problems.append(
                f"table {table}: column {name!r} has a name Iceberg or this provider reserves for a metadata "
                "column, so no Spark session could read it")
    seen: dict[str, str] = {}
    for name in columns:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            problems.append(
                f"table {table}: columns {other!r} and {name!r} differ only in case, so a Spark session "
                "(case-insensitive by default) cannot tell them apart")
    if problems:
        problems.append(f"fix for {table}: rename the column at the source (ALTER TABLE … RENAME COLUMN), "
                        "or leave it out of the publication's column list")
    return problems


def is_multiset(table_manifest: dict) -> bool:
    """A table without a key: REPLICA IDENTITY FULL, or no identity at all (a table without a
    primary key, or NOTHING, which can publish INSERTs only). Its rows may repeat, so it is stored
    as a multiset, as PostgreSQL's subscriber keeps it; its manifest ``key`` is every column."""
    return table_manifest.get("replica_identity", "d") == "f" or bool(table_manifest.get("keyless"))
