"""Any text survives COPY's text format and our reader of it, whatever the chunk boundaries.

A property test: Hypothesis draws rows of text (empty strings, byte order marks, control
characters, backslashes, tabs and newlines, any Unicode but NUL and surrogates), writes them as
``COPY … TO STDOUT (FORMAT text)`` does, streams them through :func:`copy_text.row_chunks` with a
drawn block size (so any row can start a chunk) and reads them back as the snapshot does.
"""

from __future__ import annotations

import io

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.capture import copy_text
from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.staging.typemap import map_type

# What COPY TO's text format escapes (CopyAttributeOutText): backslash, the delimiter, and these.
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def copy_line(row: tuple[str | None, ...]) -> bytes:
    """One row as PostgreSQL's COPY text format writes it (UTF8 client encoding)."""
    fields = ["\\N" if v is None else "".join(_ESCAPES.get(ch, ch) for ch in v) for v in row]
    return ("\t".join(fields) + "\n").encode()


TEXT = st.text(st.one_of(st.sampled_from(["\ufeff", "\\", "\t", "\n", "\r", "\b", "\f", "\v", "N", "\x01", "\x1c",
                                          "\xa0", " "]),
                         st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")), max_size=8)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(data=st.data(), width=st.integers(1, 3), block=st.integers(1, 64))
def test_any_text_survives_copy_text_format_and_chunking(data, width, block):
    rows = data.draw(st.lists(st.tuples(*[st.one_of(st.none(), TEXT)] * width), max_size=12))
    mapping = {f"c{i}": map_type("text") for i in range(width)}
    types, strings = values.copy_read_types(mapping)
    types = {name: pa.binary() for name in types}  # as the snapshot reads string columns
    stream = b"".join(copy_line(row) for row in rows)
    read: list[tuple] = []
    for chunk in copy_text.row_chunks(io.BytesIO(stream), block):
        table, _ = copy_text.parse_chunk(chunk, mapping, types)
        columns = [values.unescape_copy_text(table[name].combine_chunks().cast(pa.string())).to_pylist()
                   for name in strings]
        read += zip(*columns)
    assert read == rows
