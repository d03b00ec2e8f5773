"""Which tables a chunked load loads whole (and why), its progress figures, and the SQL of a chunk's range."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.capture.chunked import plan, progress
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
    (_table(key=False), None, "no primary key or replica identity index (REPLICA IDENTITY DEFAULT without"),
    (_table(key=False, identity="f"), None, "(REPLICA IDENTITY FULL): its rows are a multiset"),
    (_table(relkind="p"), ("id", "int4"), None),  # its leaves are read in each chunk's one transaction
    (_table(), ("id", "uuid"), "its first key column 'id' has type uuid"),
    (_table(), ("other", "int4"), "its key column 'other' is not published"),
])
def test_tables_the_chunked_load_cannot_chunk_are_loaded_whole_with_the_reason(table, column, expected):
    why = plan.whole_reason(table, column)
    if expected is None:
        assert why is None
    else:
        assert expected in why


def test_the_log_names_the_tables_loaded_whole_and_how_long_the_xmin_is_held():
    keyed, bag = plan.ChunkedTable(_table(), "id"), plan.ChunkedTable(_table(key=False, identity="f"), None,
                                                                      whole="its rows are a multiset")
    assert plan.whole_tables_line([keyed]) == ""
    line = plan.whole_tables_line([keyed, bag])
    assert line.startswith("; 1 table(s) loaded whole, each in the exported snapshot of a temporary slot of its own")
    assert "xmin is held while that one table is copied, not for the whole load" in line
    assert line.endswith("public.t (its rows are a multiset)")


def test_a_table_loaded_whole_shows_as_one_chunk_with_its_reason_in_the_pipeline_view():
    record = progress.LoadRecord("s", "0/1", 100, {
        "public.a": progress.TableProgress(chunks=3, rows=250, done=True, estimated_rows=250, column="id"),
        "public.bag": progress.TableProgress(chunks=1, rows=7, done=True, estimated_rows=5, whole="a multiset"),
    }, complete=True)
    figures = progress.load_figures(record)
    assert (figures["chunks"], figures["rows"], figures["tables_done"], figures["tables_whole"]) == (4, 257, 2, 1)
    assert figures["per_table"]["public.bag"]["whole"] == "a multiset"
    assert figures["per_table"]["public.a"]["whole"] is None


def test_a_text_chunk_range_compares_in_byte_order_and_open_bounds_are_left_out():
    chunked = plan.ChunkedTable(_table(), "code", text=True)
    composed = repr(plan.range_condition(chunked, "a'b", None))
    assert "Literal(\"a'b\")" in composed and 'COLLATE "C"' in composed and "<" not in composed
    assert plan.key_range(chunked, "a", None) == {"column": "code", "start": "a", "end": None}
