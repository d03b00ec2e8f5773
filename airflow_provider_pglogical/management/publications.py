"""Publications: SQL builders (pure) and read-outs of what PostgreSQL publishes.

Building a statement is a pure function returning ``psycopg2.sql.Composed``; the hook executes it.
Row filters are SQL expressions by design: they go to PostgreSQL verbatim inside ``WHERE (...)``
and PostgreSQL validates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from psycopg2 import sql

from airflow_provider_pglogical.exceptions import PublicationError
from airflow_provider_pglogical.management.sql_fragments import check_row_filter, where_clause_text
from airflow_provider_pglogical.management.validation import check_identifier

PUBLISH_OPERATIONS = ("insert", "update", "delete", "truncate")
#: ``publish_generated_columns`` values (PostgreSQL 18); before 18 generated columns are never published
GENERATED_COLUMNS = ("none", "stored")
GENERATED_COLUMNS_SINCE = 180000


def check_generated_columns(name: str, value: str, server_version: int) -> None:
    """Refuse an unknown ``publish_generated_columns``, or ``stored`` on a server before 18."""
    if value not in GENERATED_COLUMNS:
        raise PublicationError(
            f"publication {name!r}: publish_generated_columns is {value!r}; use one of {list(GENERATED_COLUMNS)}. "
            "Nothing was changed"
        )
    if value == "stored" and server_version < GENERATED_COLUMNS_SINCE:
        raise PublicationError(
            f"publication {name!r}: publish_generated_columns = 'stored' needs PostgreSQL 18 or later, and the "
            f"publisher runs {server_version // 10000}: before 18 PostgreSQL never publishes generated columns. "
            "Use publish_generated_columns='none' (the snapshot and the changes then both leave them out) or "
            "upgrade the publisher. Nothing was changed"
        )


@dataclass(frozen=True)
class PublishedTable:
    """A table to publish, with an optional column list and row filter.

    :param name: ``"schema.table"`` or ``"table"`` (schema ``public``); use :meth:`of` for names
        that themselves contain dots.
    :param columns: the column list; ``None`` publishes every column, including ones added later.
    :param where: a row filter expression, passed to PostgreSQL verbatim inside parentheses.
    """

    name: str
    columns: Sequence[str] | None = None
    where: str | None = None
    schema: str | None = field(default=None, compare=False)

    @classmethod
    def of(cls, schema: str, table: str, columns: Sequence[str] | None = None, where: str | None = None):
        return cls(name=table, columns=columns, where=where, schema=schema)

    @property
    def qualified(self) -> tuple[str, str]:
        """``(schema, table)``; a bare name means schema ``public``."""
        if self.schema is not None:
            return self.schema, self.name
        schema, dot, table = self.name.partition(".")
        return (schema, table) if dot else ("public", self.name)


def _table_clause(table: PublishedTable) -> sql.Composed:
    """``schema.table (cols) WHERE (filter)``; the filter is proven one expression first."""
    schema, name = table.qualified
    check_identifier(schema, "schema")
    check_identifier(name, "table")
    parts = [sql.Identifier(schema, name)]
    if table.columns is not None:
        if isinstance(table.columns, str) or not table.columns:
            raise PublicationError(
                f"column list of {schema}.{name} is {table.columns!r}: pass a non-empty list of column names, "
                "or columns=None to publish every column"
            )
        for column in table.columns:
            check_identifier(column, f"column of {schema}.{name}")
        parts.append(sql.SQL(" ({})").format(sql.SQL(", ").join(map(sql.Identifier, table.columns))))
    if table.where is not None:
        text = where_clause_text(check_row_filter(table.where, f"{schema}.{name}"))
        parts.append(sql.SQL(" WHERE ({})").format(sql.SQL(text)))
    return sql.Composed(parts)


def _tables_clause(tables: Iterable[PublishedTable]) -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL("TABLE {}").format(_table_clause(t)) for t in tables)


def _options(publish: Sequence[str] | None, publish_via_partition_root: bool | None,
             publish_generated_columns: str | None = None) -> list[sql.Composable]:
    options: list[sql.Composable] = []
    if publish is not None:
        unknown = set(publish) - set(PUBLISH_OPERATIONS)
        if unknown:
            raise PublicationError(
                f"unknown publish operation(s) {sorted(unknown)}; use any of {list(PUBLISH_OPERATIONS)}"
            )
        options.append(sql.SQL("publish = {}").format(sql.Literal(", ".join(publish))))
    if publish_via_partition_root is not None:
        options.append(
            sql.SQL("publish_via_partition_root = {}").format(sql.SQL("true" if publish_via_partition_root else "false"))
        )
    if publish_generated_columns is not None:
        if publish_generated_columns not in GENERATED_COLUMNS:
            raise PublicationError(
                f"publish_generated_columns is {publish_generated_columns!r}; use one of {list(GENERATED_COLUMNS)}"
            )
        options.append(sql.SQL("publish_generated_columns = {}").format(sql.SQL(publish_generated_columns)))
    return options


def _with_clause(publish: Sequence[str] | None, publish_via_partition_root: bool | None,
                 publish_generated_columns: str | None = None) -> sql.Composable:
    options = _options(publish, publish_via_partition_root, publish_generated_columns)
    if not options:
        return sql.SQL("")
    return sql.SQL(" WITH ({})").format(sql.SQL(", ").join(options))


def create_publication_sql(
    name: str,
    tables: Sequence[PublishedTable] | None = None,
    *,
    all_tables: bool = False,
    schemas: Sequence[str] | None = None,
    publish: Sequence[str] = PUBLISH_OPERATIONS,
    publish_via_partition_root: bool = False,
    publish_generated_columns: str | None = None,
) -> sql.Composed:
    """``CREATE PUBLICATION`` for a table list, ``FOR ALL TABLES`` or ``FOR TABLES IN SCHEMA``.

    ``publish_generated_columns`` None leaves the option out (PostgreSQL's default, ``none``).
    """
    check_identifier(name, "publication")
    if all_tables and (tables or schemas):
        raise PublicationError(f"publication {name!r}: all_tables=True cannot be combined with tables or schemas")
    targets: list[sql.Composable] = []
    if all_tables:
        targets.append(sql.SQL("ALL TABLES"))
    if tables:
        targets.append(_tables_clause(tables))
    if schemas:
        targets.append(
            sql.SQL("TABLES IN SCHEMA {}").format(sql.SQL(", ").join(map(sql.Identifier, schemas)))
        )
    for_clause = sql.SQL(" FOR {}").format(sql.SQL(", ").join(targets)) if targets else sql.SQL("")
    return sql.SQL("CREATE PUBLICATION {}{}{}").format(
        sql.Identifier(name), for_clause, _with_clause(publish, publish_via_partition_root, publish_generated_columns)
    )


def alter_publication_tables_sql(name: str, action: str, tables: Sequence[PublishedTable]) -> sql.Composed:
    """``ALTER PUBLICATION … ADD | SET | DROP TABLE …`` (DROP takes names only)."""
    check_identifier(name, "publication")
    action = action.upper()
    if action not in ("ADD", "SET", "DROP"):
        raise ValueError(f"action must be ADD, SET or DROP, not {action!r}")
    if action == "DROP":
        clause = sql.SQL(", ").join(sql.SQL("TABLE {}").format(sql.Identifier(*t.qualified)) for t in tables)
    else:
        clause = _tables_clause(tables)
    return sql.SQL("ALTER PUBLICATION {} {} {}").format(sql.Identifier(name), sql.SQL(action), clause)


def alter_publication_options_sql(
    name: str, *, publish: Sequence[str] | None = None, publish_via_partition_root: bool | None = None,
    publish_generated_columns: str | None = None,
) -> sql.Composed:
    options = _options(publish, publish_via_partition_root, publish_generated_columns)
    if not options:
        raise ValueError("set_publication_options needs publish or publish_via_partition_root")
    return sql.SQL("ALTER PUBLICATION {} SET ({})").format(sql.Identifier(name), sql.SQL(", ").join(options))


def set_publication_objects_sql(
    name: str, tables: Sequence[PublishedTable] | None, schemas: Sequence[str] | None
) -> sql.Composed:
    """``ALTER PUBLICATION … SET TABLE …, TABLES IN SCHEMA …``: replace what it publishes."""
    check_identifier(name, "publication")
    targets: list[sql.Composable] = []
    if tables:
        targets.append(_tables_clause(tables))
    if schemas:
        targets.append(sql.SQL("TABLES IN SCHEMA {}").format(sql.SQL(", ").join(map(sql.Identifier, schemas))))
    if not targets:
        raise ValueError("set_publication_objects_sql needs tables or schemas")
    return sql.SQL("ALTER PUBLICATION {} SET {}").format(sql.Identifier(name), sql.SQL(", ").join(targets))


def drop_publication_objects_sql(name: str, info: "PublicationInfo") -> list[sql.Composed]:
    """Statements that empty a publication of its tables and schemas (SET needs at least one)."""
    statements = []
    if info.tables:
        statements.append(alter_publication_tables_sql(name, "DROP", [PublishedTable.of(t.schema, t.table) for t in info.tables]))
    if info.schemas:
        statements.append(sql.SQL("ALTER PUBLICATION {} DROP TABLES IN SCHEMA {}").format(
            sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, info.schemas))))
    return statements


def drop_publication_sql(name: str, missing_ok: bool = True) -> sql.Composed:
    return sql.SQL("DROP PUBLICATION {}{}").format(
        sql.SQL("IF EXISTS ") if missing_ok else sql.SQL(""), sql.Identifier(name)
    )


# -- read-outs --------------------------------------------------------------------------------

_DESCRIBE_PUBLICATION = """
SELECT p.pubname, pg_get_userbyid(p.pubowner), p.puballtables, p.pubinsert, p.pubupdate,
       p.pubdelete, p.pubtruncate, p.pubviaroot
  FROM pg_publication p WHERE p.pubname = %s
"""

_DESCRIBE_TABLES = """
SELECT n.nspname, c.relname,
       pg_get_expr(pr.prqual, c.oid),
       (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a
         WHERE a.attrelid = c.oid AND a.attnum = ANY(pr.prattrs))
  FROM pg_publication p
  JOIN pg_publication_rel pr ON pr.prpubid = p.oid
  JOIN pg_class c ON c.oid = pr.prrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE p.pubname = %s
 ORDER BY 1, 2
"""

_DESCRIBE_SCHEMAS = """
SELECT n.nspname FROM pg_publication p
  JOIN pg_publication_namespace pn ON pn.pnpubid = p.oid
  JOIN pg_namespace n ON n.oid = pn.pnnspid
 WHERE p.pubname = %s ORDER BY 1
"""


@dataclass
class PublicationTableInfo:
    schema: str
    table: str
    row_filter: str | None
    columns: list[str] | None

    def psql_line(self) -> str:
        """The table's line as psql's ``\\dRp+`` prints it."""
        text = f'"{self.schema}.{self.table}"'
        if self.columns:
            text += f" ({', '.join(self.columns)})"
        if self.row_filter:
            text += f" WHERE {self.row_filter}"
        return text


@dataclass
class PublicationInfo:
    """What psql ``\\dRp+`` shows for one publication."""

    name: str
    owner: str
    all_tables: bool
    inserts: bool
    updates: bool
    deletes: bool
    truncates: bool
    via_root: bool
    tables: list[PublicationTableInfo]
    schemas: list[str]
    #: ``publish_generated_columns`` (``none``/``stored``); None before PostgreSQL 18
    generated_columns: str | None = None

    @property
    def publish(self) -> tuple[str, ...]:
        flags = (self.inserts, self.updates, self.deletes, self.truncates)
        return tuple(op for op, on in zip(PUBLISH_OPERATIONS, flags) if on)


def describe_publication(cursor, name: str) -> PublicationInfo | None:
    cursor.execute(_DESCRIBE_PUBLICATION, (name,))
    row = cursor.fetchone()
    if row is None:
        return None
    cursor.execute(_DESCRIBE_TABLES, (name,))
    tables = [PublicationTableInfo(s, t, f, list(c) if c else None) for s, t, f, c in cursor.fetchall()]
    cursor.execute(_DESCRIBE_SCHEMAS, (name,))
    schemas = [r[0] for r in cursor.fetchall()]
    generated = None
    if cursor.connection.server_version >= GENERATED_COLUMNS_SINCE:
        cursor.execute(_GENERATED_COLUMNS, (name,))
        generated = cursor.fetchone()[0]
    return PublicationInfo(*row, tables=tables, schemas=schemas, generated_columns=generated)


_GENERATED_COLUMNS = "SELECT CASE pubgencols WHEN 's' THEN 'stored' ELSE 'none' END FROM pg_publication WHERE pubname = %s"
