"""The one registry of PostgreSQL types: per type, its Arrow type in staging, its Spark type in the
lakehouse, the parser of its text form, and whether a staged file of it can be adopted as it is and
whether its values can be looked up by (a key the row deltas find rows by).

The only place type text is taken apart: PostgreSQL's ``format_type`` text (``numeric(12,2)``) and
Spark SQL's (``decimal(12,2)``, ``array<int>``, as an Iceberg table's schema prints them), both into
:class:`SparkType` values; everything else asks these values (``tests/unit/test_type_registry.py``
fails on type text parsed elsewhere). Standard library only: the Spark jobs ship it
(``spark/launch.py``); the Arrow type is a small description (:class:`ArrowType`) that
``staging/typemap.py`` builds with pyarrow. Adding a PostgreSQL type is an entry of :data:`REGISTRY`
(docs/architecture.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

MAX_DECIMAL_PRECISION = 38
#: Spark type kinds -> (adoptable: Iceberg reads the staged Parquet as the same values; lookup-safe:
#: read back from Spark equal to the staged value, no time zone, hashable; plain: written by the
#: driver exactly as staged, no cast)
_KINDS: dict[str, tuple[bool, bool, bool]] = {
    "boolean": (True, False, True), "smallint": (False, False, False), "int": (True, True, True),
    "bigint": (True, True, True), "float": (True, False, True), "double": (True, False, True),
    "string": (True, True, True), "binary": (True, False, True), "date": (True, True, True),
    "timestamp": (True, False, True), "timestamp_ntz": (True, False, True), "decimal": (True, True, True),
}
_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")
_ARRAY = re.compile(r"^array<(.+)>$")
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")


@dataclass(frozen=True)
class SparkType:
    """A Spark SQL type as a value: ``kind`` (``int``, ``decimal``, ``array``, ...), a decimal's
    precision and scale, an array's element."""

    kind: str
    precision: int | None = None
    scale: int | None = None
    element: "SparkType | None" = None

    @property
    def sql(self) -> str:
        """Its Spark SQL text (``decimal(12,2)``, ``array<int>``)."""
        if self.kind == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.kind == "array":
            return f"array<{self.element.sql}>"
        return self.kind

    @classmethod
    def parse(cls, text: str) -> "SparkType":
        """The type of Spark SQL type text (an Iceberg table's schema as Spark prints it)."""
        text = text.strip()
        if (array := _ARRAY.match(text)) is not None:
            return cls("array", element=cls.parse(array.group(1)))
        if (decimal := _DECIMAL.match(text.replace(" ", ""))) is not None:
            return cls("decimal", int(decimal.group(1)), int(decimal.group(2)))
        return cls(text)

    @property
    def is_array(self) -> bool:
        return self.kind == "array"

    @property
    def is_float(self) -> bool:
        return self.kind in ("float", "double")

    @property
    def is_timestamp(self) -> bool:
        return self.kind in ("timestamp", "timestamp_ntz")

    def _flags(self) -> tuple[bool, bool, bool]:
        if self.kind == "decimal" and self.precision is None:  # "decimal" alone: Spark's SQL decides it
            return False, False, False
        return _KINDS.get(self.kind, (False, False, False))

    @property
    def adoptable(self) -> bool:
        """A staged file's column of it is adopted as it is (an array of an adoptable type too)."""
        return self.element.adoptable and not self.element.is_array if self.is_array else self._flags()[0]

    @property
    def lookup_safe(self) -> bool:
        """Its values read back from Spark equal the staged ones: a key rows are looked up by."""
        return not self.is_array and self._flags()[1]

    @property
    def plain(self) -> bool:
        """The driver writes it exactly as staged (a simple type, a decimal, an array of one)."""
        return self.element.plain and not self.element.is_array if self.is_array else self._flags()[2]

    def widens_to(self, other: "SparkType") -> bool:
        """Iceberg's in-place type promotions: int -> bigint, float -> double, wider decimal precision."""
        if (self.kind, other.kind) in {("int", "bigint"), ("float", "double")}:
            return True
        return (self.kind == other.kind == "decimal" and self.scale == other.scale
                and other.precision > self.precision)


@dataclass(frozen=True)
class ArrowType:
    """An Arrow type as a description (the Spark jobs have no pyarrow): a ``pyarrow`` factory, its
    arguments, a list's element."""

    factory: str
    args: tuple = ()
    element: "ArrowType | None" = None

    def build(self, pa: Any) -> Any:
        """The ``pyarrow.DataType`` (``pa``: the pyarrow module)."""
        if self.element is not None:
            return getattr(pa, self.factory)(self.element.build(pa))
        return getattr(pa, self.factory)(*self.args)


@dataclass(frozen=True)
class PgType:
    """How one PostgreSQL type travels: staged as ``arrow`` (its text parsed by ``parser``,
    ``staging/values.py``), kept in Iceberg as ``spark``."""

    name: str
    spark: SparkType
    arrow: ArrowType
    parser: str
    adoptable: bool = field(init=False)
    lookup_safe: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "adoptable", self.spark.adoptable)
        object.__setattr__(self, "lookup_safe", self.spark.lookup_safe)


def _entry(name: str, spark: str, arrow: str, parser: str, *args: Any) -> PgType:
    return PgType(name, SparkType(spark), ArrowType(arrow, args), parser)


#: PostgreSQL base type (``pg_type.typname``) -> its entry; numeric and arrays are built by
#: :func:`pg_type`, any type not listed travels as its text (json, uuid, interval, time, inet, ...:
#: Spark has no TIME, Iceberg no interval, Spark cannot write Iceberg's uuid)
REGISTRY: dict[str, PgType] = {entry.name: entry for entry in (
    _entry("bool", "boolean", "bool_", "bool"),
    # Iceberg has no 16-bit integer: int2 widens to int
    _entry("int2", "int", "int32", "int"),
    _entry("int4", "int", "int32", "int"),
    _entry("int8", "bigint", "int64", "int"),
    _entry("oid", "bigint", "int64", "int"),
    _entry("float4", "float", "float32", "float"),
    _entry("float8", "double", "float64", "float"),
    _entry("bytea", "binary", "binary", "bytea"),
    _entry("date", "date", "date32", "date"),
    _entry("timestamp", "timestamp_ntz", "timestamp", "timestamp", "us"),
    _entry("timestamptz", "timestamp", "timestamp", "timestamptz", "us", "UTC"),
)}
TEXT = _entry("text", "string", "string", "text")
#: lakehouse types a column can be overridden to (``type_overrides``), each lossless for any type
OVERRIDES: dict[str, PgType] = {"string": TEXT}


def decimal_of(formatted: str | None) -> tuple[int, int] | None:
    """``(precision, scale)`` of ``numeric(p,s)`` that a Spark decimal holds; None otherwise."""
    match = _NUMERIC.match((formatted or "").replace(" ", ""))
    if match and int(match.group(1)) <= MAX_DECIMAL_PRECISION:
        return int(match.group(1)), int(match.group(2))
    return None


def pg_type(type_name: str, element_type: str | None = None, formatted: str | None = None) -> PgType:
    """The entry of a PostgreSQL type; anything unknown is text.

    :param element_type: an array's element ``typname`` (``_int4`` -> ``int4``).
    :param formatted: ``format_type(oid, typmod)``: numeric needs it, unconstrained numeric (or a
        precision over 38) has no exact Spark decimal and stays text.
    """
    if type_name == "numeric":
        decimal = decimal_of(formatted)
        if decimal is None:
            return TEXT
        return PgType(type_name, SparkType("decimal", *decimal), ArrowType("decimal128", decimal), "decimal")
    if element_type is not None:
        element = pg_type(element_type)
        return PgType(type_name, SparkType("array", element=element.spark), ArrowType("list_", element=element.arrow),
                      f"array:{element.parser}")
    return REGISTRY.get(type_name, TEXT)


def column_pg_type(column: Any) -> PgType:
    """The entry of a manifest column (``Column`` or its dict), honouring its ``override``; a
    ValueError names an unknown override."""
    get = column.get if isinstance(column, Mapping) else lambda name, default=None: getattr(column, name, default)
    override = get("override")
    if override is None:
        return pg_type(get("type", "text"), get("element_type"), get("formatted"))
    if override not in OVERRIDES:
        raise ValueError(f"column {get('name')}: unknown type override {override!r}; "
                         f"supported are {', '.join(map(repr, OVERRIDES))}")
    return OVERRIDES[override]
