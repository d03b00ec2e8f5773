"""PostgreSQL text values Spark/Iceberg can hold are parsed exactly (BC years, years past 9999);
the others raise an error naming the table, the column, the value and the override to set."""

from __future__ import annotations

import datetime as dt
import io

import pyarrow as pa
import pytest

from airflow_provider_pglogical.exceptions import TypeOverrideError, UnrepresentableValue
from airflow_provider_pglogical.capture import copy_text
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.staging.typemap import apply_overrides, map_column, map_type

EPOCH = dt.datetime(1970, 1, 1)


def parse(type_name: str, texts: list, **kwargs) -> pa.Array:
    return values.text_to_arrow(pa.array(texts, pa.string()), map_type(type_name, **kwargs), "c", "public.t")


def test_dates_in_python_range_agree_with_the_calendar_everywhere():
    # 4-digit years take pyarrow's cast; the same dates written as 5-digit years go through our
    # own arithmetic: both must agree with Python's proleptic Gregorian calendar.
    dates = [dt.date(1, 1, 1), dt.date(1582, 10, 4), dt.date(1600, 2, 29), dt.date(1969, 12, 31), dt.date(9999, 12, 31)]
    expected = [(d - dt.date(1970, 1, 1)).days for d in dates]
    assert parse("date", [d.isoformat() for d in dates]).view(pa.int32()).to_pylist() == expected
    assert [values._temporal_value("0" + d.isoformat(), "date") for d in dates] == expected


def test_bc_and_far_future_values_are_exact():
    days = parse("date", ["0001-12-31 BC", "4714-11-24 BC", "294276-12-31", "5874897-12-31", None])
    # 1 BC is a leap year (astronomical year 0); 4714-11-24 BC is Julian day 0, 2440588 days before 1970
    assert days.view(pa.int32()).to_pylist() == [-719163, -2440588, 106762939, 2145042905, None]
    micros = parse("timestamp", ["0001-12-31 23:59:59.999999 BC", "2000-01-01 00:00:00.5", "294247-01-10 04:00:54.775807"])
    assert micros.view(pa.int64()).to_pylist() == [-62135596800000001, 946684800500000, 2**63 - 1]
    tz = parse("timestamptz", ["0044-03-15 12:00:00+00 BC", "12345-06-07 08:09:10.000011+00"])
    assert tz.type == pa.timestamp("us", tz="UTC")
    assert tz.view(pa.int64()).to_pylist() == [
        values._temporal_value("0044-03-15 12:00:00 BC", "timestamp"),
        values._temporal_value("12345-06-07 08:09:10.000011", "timestamp"),
    ]
    assert parse("float8", ["NaN", "Infinity", "-Infinity"]).to_pylist()[1:] == [float("inf"), float("-inf")]


@pytest.mark.parametrize("type_name, text, reason", [
    ("date", "infinity", "no infinity date"),
    ("date", "-infinity", "no -infinity date"),
    ("timestamp", "infinity", "no infinity timestamp"),
    ("timestamptz", "-infinity", "no -infinity timestamp"),
    ("timestamp", "294276-12-31 23:59:59.999999", "outside the range"),
    ("timestamptz", "294247-01-10 04:00:54.775808+00", "outside the range"),
    ("numeric(10,2)", "NaN", "a decimal has no NaN"),
    ("_int4", "[0:1]={7,8}", "lower bound is not 1"),
    ("_int4", "{{1,2},{3,4}}", "multi-dimensional"),
    ("_timestamp", '{"2020-01-01 00:00:00",infinity}', "no infinity timestamp"),
])
def test_values_without_an_exact_form_name_table_column_value_and_override(type_name, text, reason):
    kwargs = {}
    if type_name.startswith("numeric"):
        type_name, kwargs = "numeric", {"formatted": type_name}
    if type_name.startswith("_"):
        kwargs = {"element_type": type_name[1:]}
    with pytest.raises(UnrepresentableValue) as caught:
        parse(type_name, ["2020-01-01" if type_name == "date" else None, text], **kwargs)
    message = str(caught.value)
    assert "table public.t, column c" in message and reason in message
    assert repr(text) in message or repr(text.split(",")[-1].rstrip("}")) in message
    assert "type_overrides={'public.t.c': 'string'}" in message
    assert caught.value.fix == "type_overrides={'public.t.c': 'string'}" and caught.value.permanent


def test_overrides_mark_manifest_columns_and_typos_are_errors():
    columns = [{"name": "a", "type": "timestamp"}, {"name": "b", "type": "int4"}]
    marked = apply_overrides("public.t", columns, {"public.t.a": "string", "public.other.x": "string"}, strict=True)
    assert [c.get("override") for c in marked] == ["string", None]
    assert map_column(marked[0]).arrow == pa.string() and map_column(marked[1]).arrow == pa.int32()
    with pytest.raises(TypeOverrideError, match="public.t.nope"):
        apply_overrides("public.t", columns, {"public.t.nope": "string"}, strict=True)
    with pytest.raises(TypeOverrideError, match="supported are 'string'"):
        apply_overrides("public.t", columns, {"public.t.a": "double"})
    with pytest.raises(TypeOverrideError, match="schema.table.column"):
        apply_overrides("public.t", columns, {"a": "string"})


def test_row_chunks_keep_rows_whole_whatever_their_size():
    rows = [b"1\tsmall\n", b"2\t" + b"x" * 5000 + b"\n", b"3\tsmall\n", b"4\t" + b"y" * 300 + b"\n"] * 3
    stream = b"".join(rows)
    chunks = [c.to_pybytes() for c in copy_text.row_chunks(io.BytesIO(stream), 64)]
    assert b"".join(chunks) == stream
    assert all(c.endswith(b"\n") for c in chunks)
    # memory follows the largest row: a chunk holds at most twice (largest row + block)
    assert max(len(c) for c in chunks) <= 2 * (5003 + 64)
    assert [len(c) for c in copy_text.row_chunks(io.BytesIO(b"1\n" * 100), 64)] == [64, 64, 64, 8]


def test_a_chunk_with_special_values_is_read_again_as_text():
    mapping = {"d": map_type("date"), "n": map_type("numeric", formatted="numeric(5,1)"), "s": map_type("text")}
    types, strings = values.copy_read_types(mapping)
    chunk = pa.py_buffer(b"2020-01-01\t1.5\ta\n0044-03-15 BC\t\\N\tb\n")
    data, as_text = copy_text.parse_chunk(chunk, mapping, types)
    assert as_text == ["d", "n"] and strings == ["s"]
    assert data["d"].type == pa.string() and data["d"].to_pylist() == ["2020-01-01", "0044-03-15 BC"]
    plain, none = copy_text.parse_chunk(pa.py_buffer(b"2020-01-01\t1.5\ta\n"), mapping, types)
    assert none == [] and plain["d"].type == pa.date32()


def test_copy_chunks_keep_empty_rows_and_a_leading_byte_order_mark():
    # COPY writes a row whose only column holds '' as an empty line; a CSV reader skips those, and
    # drops a byte order mark at the start of its input (here: of a value, at a chunk's start).
    mapping = {"v": map_type("text")}
    types, _ = values.copy_read_types(mapping)
    bom = "\ufeff".encode()
    stream = bom + b"first\n\n\\N\n" + bom + bom + b"\n\nlast\n"
    for block in (1, 4, 64):  # chunks of one row each, a few rows, or all of them
        texts = []
        for chunk in copy_text.row_chunks(io.BytesIO(stream), block):
            data, _ = copy_text.parse_chunk(chunk, mapping, types)
            texts += data["v"].to_pylist()
        assert texts == ["\ufefffirst", "", None, "\ufeff\ufeff", "", "last"], block


def test_a_numeric_nan_in_a_copy_chunk_names_the_override():
    mapping = {"id": map_type("int4"), "n": map_type("numeric", formatted="numeric(10,2)")}
    types, _ = values.copy_read_types(mapping)
    data, as_text = copy_text.parse_chunk(pa.py_buffer(b"1\t1.50\n2\tNaN\n"), mapping, types)
    assert as_text == ["id", "n"]
    with pytest.raises(UnrepresentableValue, match=r"value 'NaN' .* type_overrides=\{'public.t.n': 'string'\}"):
        values.text_to_arrow(data["n"].combine_chunks(), mapping["n"], "n", "public.t")


def test_unquoted_array_elements_keep_what_postgresql_does_not_call_white_space():
    assert values.parse_array_literal('{\x1cfs\x1f,\xa0nb\u2028,"  q ",NULL,"NULL"}') == [
        "\x1cfs\x1f", "\xa0nb\u2028", "  q ", None, "NULL"]
