"""COPY text format into Arrow: row-aligned chunks of any size, parsed by pyarrow's CSV reader.

The snapshot streams ``COPY … TO STDOUT`` through a pipe; this module cuts the stream at row ends
(a row larger than a chunk gets a chunk of its own size, so memory follows the largest row) and
parses each chunk with the column types of the staging type map.

The CSV reader is not a COPY reader, so two of its conveniences are turned off: it skips empty
lines (in COPY, a row whose only column holds ``''``) and drops a UTF-8 byte order mark at the
start of its input (in COPY, the first character of a value that begins with U+FEFF).
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pcsv

from airflow_provider_pglogical.staging import values
from airflow_provider_pglogical.staging.typemap import MappedType


def widen_pipe(fd: int) -> None:
    """Give the pipe 1 MiB instead of Linux's 64 KiB, so copy and parse hand over fewer, larger chunks."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):
        pass  # not Linux, or above /proc/sys/fs/pipe-max-size: the default pipe works too


def row_chunks(source, block_size: int) -> Iterator[pa.Buffer]:
    """Whole rows of a COPY text stream, about ``block_size`` bytes at a time; a row larger than
    that comes in a chunk of its own size (COPY text format escapes newlines inside values).

    Each chunk is a fresh buffer that ``source.readinto`` fills and Arrow then owns: the only copies
    are the pipe's and the few bytes of the row cut at the chunk's end.
    """
    carry = b""  # the start of a row cut at the previous chunk's end (holds no newline)
    eof = False
    while not eof:
        buf = bytearray(len(carry) + block_size)
        buf[: len(carry)] = carry
        filled, searched = len(carry), len(carry)
        while True:
            with memoryview(buf) as view:
                while filled < len(buf):
                    n = source.readinto(view[filled:])
                    if not n:
                        eof = True
                        break
                    filled += n
            cut = buf.rfind(b"\n", searched, filled)
            if cut >= 0 or eof:
                break
            searched = filled  # a row larger than the buffer: grow it
            buf.extend(bytes(max(block_size, len(buf))))
        cut = filled - 1 if eof else cut
        if cut >= 0:
            yield pa.py_buffer(memoryview(buf)[: cut + 1])
        carry = bytes(buf[cut + 1 : filled])


_PARSE = pcsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False, escape_char=False,
                           ignore_empty_lines=False)
_BOM = b"\xef\xbb\xbf"


def _read_chunk(chunk: pa.Buffer, names: list[str], types: dict[str, pa.DataType]) -> pa.Table:
    """pyarrow's CSV reader over whole rows of COPY text format: tabs, no quotes, ``\\N`` is NULL,
    an empty line is a row."""
    if chunk.size >= len(_BOM) and chunk[: len(_BOM)].to_pybytes() == _BOM:
        # The reader skips one byte order mark at the start of its input: give it one to skip
        # (a copy, but only of chunks whose first value starts with U+FEFF).
        chunk = pa.py_buffer(_BOM + chunk.to_pybytes())
    return pcsv.read_csv(
        pa.BufferReader(chunk),
        read_options=pcsv.ReadOptions(column_names=names, block_size=chunk.size + 1, use_threads=False),
        parse_options=_PARSE,
        convert_options=pcsv.ConvertOptions(
            column_types=types, null_values=["\\N"], strings_can_be_null=True,
            true_values=["t"], false_values=["f"],
        ),
    )


def parse_chunk(chunk: pa.Buffer, mapping: dict[str, MappedType], types: dict[str, pa.DataType]
                 ) -> tuple[pa.Table, list[str]]:
    """Parse a chunk with the reader's own conversions; when a value defeats them (a BC date,
    ``infinity``, a ``numeric`` NaN), parse the chunk again with those columns as text and return
    their names too: ``values.text_to_arrow`` converts them exactly, or names the value."""
    try:
        return _read_chunk(chunk, list(mapping), types), []
    except pa.ArrowInvalid:
        pass  # the reader's messages differ by type ("not a valid decimal128 number"): read as text
    as_text = [name for name, m in mapping.items() if m.parser in values.COPY_NATIVE]
    return _read_chunk(chunk, list(mapping), {**types, **dict.fromkeys(as_text, pa.string())}), as_text
