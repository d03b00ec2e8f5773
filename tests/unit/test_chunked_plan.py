"""Which tables a chunked load refuses, and the SQL of a chunk's range."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.capture.chunked import plan
from airflow_provider_pglogical.management.published import ColumnInfo, ResolvedTable


def _table(key: bool = True, identity: str = "d", relkind: str = "r") -> ResolvedTable:
    columns = [ColumnInfo(name="id", type_oid=23, typmod=-1, type="int4", formatted="integer", element_type=None,
                          key=key, attnum=1, not_null=True),
               ColumnInfo(name="v", type_oid=25, typmod=-1, type="text", formatted="text", element_type=None, key=False,
                          attnum=2, not_null=False)]
    return ResolvedTable(oid=1, schema="public", name="t", relkind=relkind, replica_identity=identity, columns=columns,
                         has_column_list=False, row_filter=None)


@pytest.mark.parametrize("table, column, expected", [
    (_table(), ("id", "int4"), None),
    (_table(key=False), None, "has no primary key or replica identity index (REPLICA IDENTITY DEFAULT without"),
    (_table(key=False, identity="f"), None, "(REPLICA IDENTITY FULL): its rows are a multiset"),
    (_table(relkind="p"), ("id", "int4"), None),  # its leaves are read in each chunk's one transaction
    (_table(), ("id", "uuid"), "its first key column 'id' has type uuid"),
    (_table(), ("other", "int4"), "its key column 'other' is not published"),
])
def test_tables_the_chunked_load_cannot_copy_exactly_are_named_with_the_fix(table, column, expected):
    problem = plan.table_problem(table, column)
    if expected is None:
        assert problem is None
    else:
        assert expected in problem and "table public.t" in problem and "snapshot_mode='exported'" in problem


def test_a_text_chunk_range_compares_in_byte_order_and_open_bounds_are_left_out():
    chunked = plan.ChunkedTable(_table(), "code", text=True)
    composed = repr(plan.range_condition(chunked, "a'b", None))
    assert "Literal(\"a'b\")" in composed and 'COLLATE "C"' in composed and "<" not in composed
    assert plan.key_range(chunked, "a", None) == {"column": "code", "start": "a", "end": None}
