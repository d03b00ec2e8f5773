"""SQL fragments a user passes (row filters) are proven to be one expression before use.

A row filter goes to PostgreSQL inside ``WHERE (...)``; text such as ``true); DROP TABLE t; --``
would close the parenthesis and run a second statement. PostgreSQL's own parser (through
``pglast``) decides instead of a regular expression: the text must parse as the WHERE clause of
an otherwise empty ``SELECT``, and nothing else. PostgreSQL then validates the expression itself
(column names, types, the publication's restrictions) when it runs.
"""

from __future__ import annotations

from airflow_provider_pglogical.exceptions import InvalidInputError

#: SelectStmt fields that must stay empty: anything there is not part of a lone expression
_NOT_AN_EXPRESSION = (
    "distinctClause", "intoClause", "targetList", "fromClause", "groupClause", "havingClause",
    "windowClause", "valuesLists", "sortClause", "limitOffset", "limitCount", "lockingClause",
    "withClause", "larg", "rarg",
)


def check_row_filter(expression: str, table: str) -> str:
    """Return ``expression`` unchanged when it is exactly one SQL expression; raise otherwise.

    :param table: the table the filter belongs to, for the message.
    """
    import pglast  # PostgreSQL's parser; a hard dependency, imported here to keep import cost low

    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInputError(
            f"row filter of {table} is empty ({expression!r}): pass a boolean SQL expression such as "
            "\"region = 'EU'\", or where=None to publish every row"
        )
    fix = (f"pass one boolean SQL expression over {table}'s columns, e.g. \"region = 'EU' AND amount > 0\" "
           "(no ';', no statements, no clauses such as ORDER BY)")
    try:
        statements = pglast.parse_sql("SELECT WHERE " + expression)
    except pglast.parser.ParseError as err:
        raise InvalidInputError(
            f"row filter of {table} is not one SQL expression ({err}): {expression!r}. Nothing was "
            f"changed. Fix: {fix}"
        ) from None
    statement = statements[0].stmt if len(statements) == 1 else None
    if (
        statement is None
        or type(statement).__name__ != "SelectStmt"
        or statement.whereClause is None
        or any(getattr(statement, name, None) for name in _NOT_AN_EXPRESSION)
        or int(getattr(statement, "op", 0) or 0) != 0  # UNION / INTERSECT / EXCEPT
    ):
        raise InvalidInputError(
            f"row filter of {table} is more than one SQL expression ({len(statements)} statement(s), or "
            f"clauses beyond WHERE): {expression!r}. Nothing was changed. Fix: {fix}"
        )
    return expression


def where_clause_text(expression: str) -> str:
    """The filter as it goes inside ``WHERE (…)``: a line break before the closing parenthesis
    keeps a trailing ``-- comment`` from swallowing it."""
    return expression + "\n"
