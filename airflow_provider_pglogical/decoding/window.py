"""What decoding one peek window yields, whichever decoder did it, and the manifest records it holds.

Both decoders (:mod:`.columnar` and the message-by-message :mod:`.assembler`) return a
:class:`DecodedWindow`; the records of logical messages and schema changes are made here only, so
the two paths cannot stage them differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from airflow_provider_pglogical.decoding.messages import LogicalMessage, Relation
from airflow_provider_pglogical.lsn import Lsn


class StagedTable(Protocol):
    """One table's changes in a window, built into its staged Arrow table on demand."""

    @property
    def versions(self) -> list[Relation]: ...
    @property
    def truncated(self) -> bool: ...
    @property
    def key(self) -> list[str]: ...
    @property
    def keyless(self) -> bool: ...
    @property
    def qualified_name(self) -> str: ...
    def build(self, types: Mapping, type_overrides: Mapping[str, str] | None = None) -> pa.Table: ...


@dataclass
class DecodedWindow:
    """A decoded window: tables ready to build, and what the manifest records besides rows."""

    tables: dict[int, StagedTable]
    transaction_count: int
    #: end LSN of the last transaction in the window (where the slot may advance to)
    last_end_lsn: int | None
    messages: list[dict]
    schema_changes: list[dict]
    rows: int
    bytes: int
    #: True when upto_nchanges / max_bytes cut the window short: more may be waiting before upto
    limited: bool = False
    #: True when transactions were held back before an unresolved PREPARE (two-phase slots)
    held_back: bool = False
    #: True when a streamed transaction was still open where the window ended
    open_streams: bool = False


def message_record(msg: LogicalMessage, transactional: bool, commit_lsn: int | None = None) -> dict:
    """The manifest's record of a ``pg_logical_emit_message``: text when it is UTF-8, else hex."""
    content = bytes(msg.content)
    try:
        text: str | None = content.decode()
    except UnicodeDecodeError:
        text = None
    return {
        "lsn": str(Lsn(msg.lsn)), "prefix": msg.prefix, "transactional": transactional,
        "content": text, "content_hex": None if text is not None else content.hex(),
        "commit_lsn": str(Lsn(commit_lsn)) if commit_lsn is not None else None,
    }


def schema_change_record(new: Relation, previous: Relation, lsn: int | None) -> dict:
    """The manifest's record of a table's columns changing inside a batch."""
    return {"table": new.qualified_name, "lsn": str(Lsn(lsn)) if lsn else None,
            "columns": list(new.column_names), "previous_columns": list(previous.column_names)}


def empty_window() -> DecodedWindow:
    return DecodedWindow({}, 0, None, [], [], 0, 0)

