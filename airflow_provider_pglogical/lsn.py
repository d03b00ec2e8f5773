"""PostgreSQL log sequence numbers as a value type.

LSNs are 64-bit positions in the WAL. PostgreSQL prints them as ``X/Y`` (two hex halves without
leading zeros), which does not sort as text; staging names use 16 fixed hex digits, which does.
"""

from __future__ import annotations

import functools
import re

_TEXT = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_HEX16 = re.compile(r"^[0-9A-Fa-f]{16}$")


@functools.total_ordering
class Lsn:
    """An immutable, comparable WAL position."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        if not 0 <= value < 1 << 64:
            raise ValueError(f"LSN out of range: {value!r}")
        object.__setattr__(self, "value", int(value))

    def __setattr__(self, name, value):  # pragma: no cover - immutability guard
        raise AttributeError("Lsn is immutable")

    @classmethod
    def parse(cls, text: "str | int | Lsn") -> "Lsn":
        """Accept ``X/Y`` text, 16 hex digits, an int or an Lsn."""
        if isinstance(text, Lsn):
            return text
        if isinstance(text, int):
            return cls(text)
        match = _TEXT.match(text.strip())
        if match:
            return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))
        if _HEX16.match(text.strip()):
            return cls(int(text, 16))
        raise ValueError(f"not an LSN: {text!r} (expected 'X/Y' or 16 hex digits)")

    @property
    def hex16(self) -> str:
        """16 zero-padded hex digits: sorts lexicographically in LSN order."""
        return f"{self.value:016X}"

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"

    def __int__(self) -> int:
        return self.value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Lsn):
            return self.value == other.value
        return NotImplemented

    def __lt__(self, other: "Lsn") -> bool:
        if isinstance(other, Lsn):
            return self.value < other.value
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __sub__(self, other: "Lsn") -> int:
        return self.value - other.value

