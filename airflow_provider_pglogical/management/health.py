"""Publisher health checks: find every problem before anything is created or changed.

PostgreSQL only reports some of these late: a row filter on a column outside the replica
identity is accepted by CREATE PUBLICATION and fails at the application's next UPDATE. We read
the catalogs and report all problems at once, each with the object and the fix. Read-only.
"""

from __future__ import annotations

from typing import Sequence

from airflow_provider_pglogical.exceptions import PublisherCheckError

_SETTINGS = """
SELECT current_setting('wal_level'),
       current_setting('max_replication_slots')::int,
       (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int,
       (SELECT count(*) FROM pg_stat_replication)::int,
       (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
       current_user,
       current_setting('server_version_num')::int,
       current_setting('rds.logical_replication', true),
       current_setting('cloudsql.logical_decoding', true),
       current_setting('azure.replication_support', true),
       (SELECT pg_has_role(current_user, oid, 'member') FROM pg_roles WHERE rolname = 'rds_replication')
"""

#: the oldest publisher the provider supports: row filters and column lists came with 15
MIN_SERVER_VERSION_NUM = 150000
#: failover slots (``CREATE_REPLICATION_SLOT ... (FAILOVER)``, slot sync to standbys) came with 17
FAILOVER_SERVER_VERSION_NUM = 170000
#: below this, ``idle_replication_slot_timeout`` (18, seconds) may invalidate the slot between two
#: scheduled pulls, a weekend's pause or a long apply outage: a day is the shortest we keep quiet about
IDLE_TIMEOUT_WARNING_SECONDS = 24 * 3600
#: ... and below this many of the DAG's pull intervals, when the check knows them
IDLE_TIMEOUT_SCHEDULE_FACTOR = 3


def version_problem(version_num: int) -> str | None:
    """The problem with a publisher of ``server_version_num`` ``version_num`` (150000 = 15.0), if any."""
    if version_num >= MIN_SERVER_VERSION_NUM:
        return None
    return (
        f"the publisher runs PostgreSQL {_version(version_num)}: the provider needs PostgreSQL 15 or later (it relies "
        "on publication row filters and column lists, which came with 15): upgrade the server (pg_upgrade, or a "
        "logical-replication upgrade to a 15+ server) and point the connection at it"
    )


def _version(version_num: int) -> str:
    major = version_num // 10000
    return f"{major}.{version_num % 10000}" if major >= 10 else f"{major}.{version_num // 100 % 100}"

_MISSING_PUBLICATIONS = "SELECT unnest(%s::text[]) EXCEPT SELECT pubname FROM pg_publication ORDER BY 1"

# Per publication and published relation: which columns the row filter reads (the Var nodes of
# PostgreSQL's stored expression tree), the column list, and the replica-identity columns.
_PUBLISHED_RELATIONS = r"""
SELECT p.pubname, (p.pubupdate OR p.pubdelete), format('%%I.%%I', n.nspname, c.relname), c.relkind,
       c.relreplident, gpt.attrs::int2[],
       (SELECT array_agg(DISTINCT m[1]::int2) FROM regexp_matches(gpt.qual::text, ':varattno (\d+)', 'g') m),
       CASE c.relreplident
         WHEN 'd' THEN (SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
         WHEN 'i' THEN (SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
         WHEN 'f' THEN (SELECT array_agg(a.attnum) FROM pg_attribute a
                         WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
       END,
       c.oid
  FROM pg_publication p
 CROSS JOIN LATERAL pg_get_publication_tables(p.pubname) gpt
  JOIN pg_class c ON c.oid = gpt.relid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE p.pubname = ANY(%s)
 ORDER BY 1, 3
"""

_ATTNAMES = "SELECT attnum, attname FROM pg_attribute WHERE attrelid = %s AND attnum = ANY(%s::int2[]) ORDER BY attnum"

_EXISTING_TABLES = "SELECT to_regclass(t) IS NOT NULL FROM unnest(%s::text[]) t"


def find_publisher_problems(cursor, publications: Sequence[str], tables: Sequence[str] = (),
                            replica_identity: bool = True) -> list[str]:
    """Every problem that would stop logical replication of ``publications``; empty when ready.

    :param replica_identity: also report published tables whose replica identity cannot carry
        the publication (those break the application's UPDATEs, not the replication itself).
    """
    problems: list[str] = []
    (wal_level, max_slots, used_slots, max_senders, used_senders, can_replicate, role, version_num,
     rds, cloudsql, azure, rds_replication) = _fetch(cursor, _SETTINGS)[0]
    too_old = version_problem(version_num)
    if too_old:
        return [too_old]  # the catalog queries below need 15's catalogs
    if wal_level != "logical":
        problems.append(f"wal_level is {wal_level!r}: " + _logical_wal_fix(rds, cloudsql, azure))
    if used_slots >= max_slots:
        problems.append(
            f"all {max_slots} replication slots are in use (max_replication_slots): drop unused slots "
            "(pg_replication_slots) or raise max_replication_slots and restart"
        )
    if used_senders >= max_senders:
        problems.append(
            f"all {max_senders} WAL senders are busy (max_wal_senders): raise max_wal_senders and restart, "
            "or stop idle replication connections"
        )
    if not can_replicate and rds_replication is not None:
        if not rds_replication:
            problems.append(
                f"role {role!r} is not a member of rds_replication (Amazon RDS / Aurora, where ALTER ROLE ... "
                f"REPLICATION is not allowed): GRANT rds_replication TO {role}"
            )
    elif not can_replicate:
        problems.append(
            f"role {role!r} has neither REPLICATION nor SUPERUSER: ALTER ROLE {role} WITH REPLICATION "
            "(it is needed to create slots with exported snapshots)"
        )
    if tables:
        for name, exists in zip(tables, (r[0] for r in _fetch(cursor, _EXISTING_TABLES, (list(tables),)))):
            if not exists:
                problems.append(f"table {name} does not exist on the publisher: create it or fix the name")
    missing = [r[0] for r in _fetch(cursor, _MISSING_PUBLICATIONS, (list(publications),))]
    for name in missing:
        problems.append(f"publication {name!r} does not exist: create it (create_publication) or fix the name")
    problems += _reserved_column_problems(cursor, publications)
    problems += _columnless_problems(cursor, publications)
    if not replica_identity:
        return problems
    for pub, updates_or_deletes, table, relkind, replident, attrs, filter_cols, ri_cols, oid in _fetch(
        cursor, _PUBLISHED_RELATIONS, (list(publications),)
    ):
        if not updates_or_deletes or relkind == "p":
            continue
        ri = set(ri_cols or [])
        if not ri:
            problems.append(
                f"table {table} in publication {pub!r} has no replica identity (REPLICA IDENTITY "
                f"{'NOTHING' if replident == 'n' else 'DEFAULT without a primary key'}) while the publication "
                f"publishes UPDATE/DELETE, so PostgreSQL will reject every UPDATE and DELETE on it: add a primary "
                f"key, or ALTER TABLE {table} REPLICA IDENTITY USING INDEX <unique index> (or FULL)"
            )
            continue
        outside_filter = sorted(set(filter_cols or []) - ri)
        if outside_filter:
            names = _names(cursor, oid, outside_filter)
            problems.append(
                f"the row filter of {table} in publication {pub!r} uses column(s) {names} outside the replica "
                f"identity while the publication publishes UPDATE/DELETE, so PostgreSQL will fail the next UPDATE "
                f"of {table}: make the replica identity cover them (e.g. CREATE UNIQUE INDEX ON {table} (<key>, "
                f"{names}); ALTER TABLE {table} REPLICA IDENTITY USING INDEX <that index>), or publish only inserts"
            )
        if attrs:
            outside_list = sorted(ri - set(attrs))
            if outside_list:
                names = _names(cursor, oid, outside_list)
                hint = (
                    "REPLICA IDENTITY FULL makes every column part of the identity, so a column list is "
                    "impossible while UPDATE/DELETE are published: drop the column list, or use a primary key "
                    "or REPLICA IDENTITY USING INDEX"
                    if replident == "f"
                    else f"add {names} to the column list"
                )
                problems.append(
                    f"the column list of {table} in publication {pub!r} leaves out replica-identity column(s) "
                    f"{names} while the publication publishes UPDATE/DELETE, so PostgreSQL will fail the next "
                    f"UPDATE of {table}: {hint}"
                )
    return problems


#: column names the lakehouse side keeps for itself: the keyless tables' ``_pglogical_occurrence`` and
#: ``_pglogical_batch`` columns, and the apply job's working columns (``__op``, ``__lsn``, ``__old0`` …)
RESERVED_PREFIXES = ("_pglogical_", "__")

_RESERVED_COLUMNS = r"""
SELECT DISTINCT format('%%I.%%I', schemaname, tablename), a
  FROM pg_publication_tables, unnest(attnames) a
 WHERE pubname = ANY(%s) AND (starts_with(a, '_pglogical_') OR starts_with(a, '__'))
 ORDER BY 1, 2
"""


def _reserved_column_problems(cursor, publications: Sequence[str]) -> list[str]:
    """Published columns whose names the lakehouse tables or the apply job use themselves.

    Found before a slot exists; staging itself takes any name (see ``staging.staged_name``).
    """
    return [
        f"column {column!r} of {table} has a name the lakehouse keeps for itself (names starting with "
        f"{' or '.join(repr(p) for p in RESERVED_PREFIXES)}): rename it (ALTER TABLE {table} RENAME COLUMN ...), or "
        "leave it out of every publication's column list"
        for table, column in _fetch(cursor, _RESERVED_COLUMNS, (list(publications),))
    ]


def _logical_wal_fix(rds: str | None, cloudsql: str | None, azure: str | None) -> str:
    """How to turn on logical decoding, in the words of the managed service the server is, if any."""
    if rds is not None:
        return ("Amazon RDS / Aurora: set rds.logical_replication = 1 in the DB (cluster) parameter group and "
                "reboot the instance")
    if cloudsql is not None:
        return "Cloud SQL: set the database flag cloudsql.logical_decoding = on (the instance restarts)"
    if azure is not None:
        return ("Azure Database for PostgreSQL: set the server parameter wal_level = logical (azure."
                "replication_support = logical on Single Server) and restart the server")
    return ("set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the "
            "server (Supabase has it on; Neon: enable logical replication in the project settings)")


_FAILOVER_PRIMARY = """
SELECT current_setting('server_version_num')::int, pg_is_in_recovery(),
       current_setting('synchronized_standby_slots', true),
       (SELECT array_agg(slot_name::text ORDER BY slot_name) FROM pg_replication_slots WHERE slot_type = 'physical')
"""

_FAILOVER_STANDBY = """
SELECT current_setting('server_version_num')::int, pg_is_in_recovery(),
       current_setting('sync_replication_slots', true), current_setting('hot_standby_feedback'),
       current_setting('primary_conninfo', true), current_setting('primary_slot_name', true)
"""


def failover_problems(cursor, standby_cursor=None) -> list[str]:
    """What keeps a failover slot created on ``cursor``'s server from surviving a promotion.

    On the primary: 17 or later, and ``synchronized_standby_slots`` naming the standby's physical
    slot (else a pull can confirm changes the standby has not received, and the synced slot would
    be behind the lakehouse, or missing). With ``standby_cursor``: the standby's settings that slot
    synchronization needs. Read-only; ``primary_conninfo`` is read, never shown (it may hold a password).
    """
    version_num, in_recovery, standby_slots, physical = _fetch(cursor, _FAILOVER_PRIMARY)[0]
    if version_num < FAILOVER_SERVER_VERSION_NUM:
        return [
            f"failover=True needs PostgreSQL 17 or later (failover slots came with 17); the publisher runs "
            f"{_version(version_num)}: leave failover out (after a promotion the pipeline then stops with "
            "SlotLostError and resyncs), or upgrade the publisher"
        ]
    problems = []
    if in_recovery:
        problems.append("the publisher connection reaches a standby (pg_is_in_recovery()): point it at the primary")
    if not standby_slots:
        problems.append(
            "synchronized_standby_slots is empty on the primary, so a pull may confirm changes the standby has not "
            "received and the standby's copy of the slot may be missing or behind after a promotion: ALTER SYSTEM "
            "SET synchronized_standby_slots = '<the standby's physical slot>'; SELECT pg_reload_conf()"
            + (f" (physical slots here: {', '.join(physical)})" if physical else "")
        )
    if standby_cursor is not None:
        problems += _standby_problems(standby_cursor, standby_slots)
    return problems


def _standby_problems(cursor, standby_slots: str | None) -> list[str]:
    version_num, in_recovery, sync_slots, feedback, conninfo, slot_name = _fetch(cursor, _FAILOVER_STANDBY)[0]
    if not in_recovery:
        return ["the standby connection reaches a server that is not in recovery: point it at the physical standby"]
    problems = []
    if sync_slots != "on":
        problems.append("sync_replication_slots is off on the standby, so it does not copy failover slots: "
                        "ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf() (on the standby)")
    if feedback != "on":
        problems.append("hot_standby_feedback is off on the standby (slot synchronization needs it): ALTER SYSTEM "
                        "SET hot_standby_feedback = on; SELECT pg_reload_conf() (on the standby)")
    if conninfo is None:
        problems.append("the standby's primary_conninfo cannot be read by this role: connect as a superuser or a "
                        "member of pg_read_all_settings to check it")
    elif not _conninfo_has_dbname(conninfo):
        problems.append("primary_conninfo on the standby names no dbname (slot synchronization connects to a "
                        "database): add dbname=<a database> to primary_conninfo (pg_basebackup -R -d "
                        "'dbname=postgres ...' writes it) and reload the standby")
    if not slot_name:
        problems.append("primary_slot_name is empty on the standby (slot synchronization needs a physical slot): "
                        "create one on the primary (pg_create_physical_replication_slot) and set primary_slot_name "
                        "to it on the standby")
    elif standby_slots and slot_name not in [s.strip() for s in standby_slots.split(",")]:
        problems.append(f"the standby's physical slot {slot_name!r} is not in the primary's synchronized_standby_slots "
                        f"({standby_slots!r}): add it there")
    return problems


def _conninfo_has_dbname(conninfo: str) -> bool:
    from psycopg2.extensions import parse_dsn

    try:
        return bool(parse_dsn(conninfo).get("dbname"))
    except Exception:  # an unparsable conninfo: say it names no dbname rather than echo it
        return False


def publisher_warnings(cursor, pull_every: float | None = None) -> list[str]:
    """What does not stop replication now but may invalidate the slot later (18's idle timeout).

    :param pull_every: seconds between the pipeline's scheduled pulls, when known: a timeout under
        three of them is as risky as one under a day (one late or failed run from invalidation).
    """
    cursor.execute("SELECT setting::int, unit FROM pg_settings WHERE name = 'idle_replication_slot_timeout'")
    row = cursor.fetchone()
    return [] if row is None else idle_timeout_warnings(row[0], row[1], pull_every)


def idle_timeout_warnings(setting: int, unit: str | None, pull_every: float | None = None) -> list[str]:
    """:func:`publisher_warnings`' rule, on the setting as ``pg_settings`` gives it (0: disabled)."""
    if not setting:
        return []
    seconds = setting * {"min": 60, "s": 1, "ms": 0.001}.get(unit or "s", 1)
    schedule_bound = IDLE_TIMEOUT_SCHEDULE_FACTOR * pull_every if pull_every else 0
    if seconds >= max(IDLE_TIMEOUT_WARNING_SECONDS, schedule_bound):
        return []
    why = (f"under {IDLE_TIMEOUT_SCHEDULE_FACTOR} of the DAG's pull intervals ({_duration(pull_every)} each)"
           if seconds >= IDLE_TIMEOUT_WARNING_SECONDS else "under a day")
    wanted = max(IDLE_TIMEOUT_WARNING_SECONDS, schedule_bound)
    return [
        f"idle_replication_slot_timeout is {setting}{unit or ''}, {why}: PostgreSQL invalidates a slot nobody "
        "consumed for that long (at the next checkpoint), and the pipeline then stops with SlotLostError "
        "(invalidation_reason = idle_timeout) and needs a resync. Pulls must come more often than that, outages "
        f"included: raise it to {_duration(wanted)} or more (ALTER SYSTEM SET idle_replication_slot_timeout = "
        f"'{_setting(wanted)}'), or 0 to disable it"
    ]


def _setting(seconds: float) -> str:
    """``seconds`` as a PostgreSQL duration setting, rounded up to a whole unit (1d, 30h, 90min)."""
    for unit, size in (("d", 86400), ("h", 3600)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{-(-int(seconds) // 60)}min"


def _duration(seconds: float) -> str:
    """``seconds`` as people write it in a message (2 days, 6 hours, 10 minutes, 30 seconds)."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


_COLUMNLESS = """
SELECT format('%%I.%%I', schemaname, tablename), string_agg(quote_ident(pubname), ', ' ORDER BY pubname)
  FROM pg_publication_tables
 WHERE pubname = ANY(%s) AND coalesce(cardinality(attnames), 0) = 0
 GROUP BY 1 ORDER BY 1
"""


def _columnless_problems(cursor, publications: Sequence[str]) -> list[str]:
    """Tables published with no column at all (``CREATE TABLE t()``): an Iceberg table needs one."""
    return [
        f"table {table} is published (publication {pubs}) with no columns: a lakehouse table needs at least "
        f"one column, so its rows could not be applied. Add a column (ALTER TABLE {table} ADD COLUMN ...), "
        f"or remove the table from the publication (ALTER PUBLICATION {pubs.split(', ')[0]} DROP TABLE {table})"
        for table, pubs in _fetch(cursor, _COLUMNLESS, (list(publications),))
    ]


def check_publisher(cursor, publications: Sequence[str], tables: Sequence[str] = ()) -> None:
    """Raise :class:`PublisherCheckError` listing every problem found; do nothing when ready."""
    problems = find_publisher_problems(cursor, publications, tables)
    if problems:
        raise PublisherCheckError(problems)


def _fetch(cursor, query: str, params=None) -> list[tuple]:
    cursor.execute(query, params)
    return cursor.fetchall()


def _names(cursor, oid: int, attnums: list[int]) -> str:
    return ", ".join(r[1] for r in _fetch(cursor, _ATTNAMES, (oid, attnums)))
