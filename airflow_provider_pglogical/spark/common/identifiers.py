"""The one way the Spark jobs name things: quoted identifiers for SQL text and for DataFrame code.

A source column may be called anything PostgreSQL allows: ``a.b`` (which a bare ``F.col`` reads
as a struct field), a name with a backtick, a reserved word. Every identifier a job puts into SQL
text goes through :func:`quote`, every column a job reads in DataFrame code through :func:`col`,
and every string value through :func:`sql_string`; nothing is formatted in by hand.
"""

from __future__ import annotations

import uuid


def quote(name: str) -> str:
    """A Spark SQL identifier, backtick-quoted (a backtick inside is doubled)."""
    return "`" + name.replace("`", "``") + "`"


def qualified(*parts: str) -> str:
    """``catalog.namespace.table`` with every part quoted."""
    return ".".join(quote(part) for part in parts)


def col(name: str):
    """The column called exactly ``name`` (``F.col`` would read ``a.b`` as field b of struct a)."""
    from pyspark.sql import functions as F

    return F.col(quote(name))


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_literal(value) -> str:
    """A JSON scalar (bool, number, string) as a Spark SQL literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return sql_string(value)
    raise TypeError(f"{value!r} is not a number or a string")


def temporary_view_name(purpose: str) -> str:
    """A session-unique temporary view name: tables are applied concurrently in one session."""
    return f"__pglogical_{purpose}_{uuid.uuid4().hex[:12]}"
