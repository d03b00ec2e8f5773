"""One registry of PostgreSQL types (``staging/seam/pg_types.py``): each entry's Arrow type is what
Spark reads as its Spark type, the flags the apply paths ask are the entry's, and type text is taken
apart there only (the scan at the end)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_pglogical.spark.apply.adoption import adoptable_type
from airflow_provider_pglogical.spark.apply.lakehouse_tables import widens
from airflow_provider_pglogical.spark.row_delta.row_deltas import lookup_type
from airflow_provider_pglogical.staging.seam.pg_types import REGISTRY, TEXT, SparkType, column_pg_type, pg_type

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_pglogical"
REGISTRY_MODULE = PACKAGE / "staging" / "seam" / "pg_types.py"
ENTRIES = [*REGISTRY.values(), TEXT, pg_type("numeric", formatted="numeric(12,2)"), pg_type("numeric"),
           pg_type("_int4", "int4"), pg_type("_numeric", "numeric"), pg_type("_timestamptz", "timestamptz"),
           pg_type("_uuid", "uuid"), pg_type("mood")]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.name}:{e.spark.sql}")
def test_an_entry_stages_what_spark_reads_as_its_spark_type(entry):
    from pyspark.sql.pandas.types import from_arrow_type

    assert from_arrow_type(entry.arrow.build(pa), prefer_timestamp_ntz=True).simpleString() == entry.spark.sql
    assert SparkType.parse(entry.spark.sql) == entry.spark  # the text round-trips
    assert (entry.adoptable, entry.lookup_safe) == (entry.spark.adoptable, entry.spark.lookup_safe)
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.parser = "text"  # type: ignore[misc]


@pytest.mark.parametrize("kind, adoptable, lookup_safe", [
    ("int", True, True), ("bigint", True, True), ("string", True, True), ("date", True, True),
    ("decimal(12,2)", True, True), ("decimal(38, 0)", True, True), ("boolean", True, False), ("double", True, False),
    ("binary", True, False), ("timestamp", True, False), ("timestamp_ntz", True, False), ("smallint", False, False),
    ("array<int>", True, False), ("array<decimal(5,2)>", True, False), ("array<array<int>>", False, False),
    ("struct<a:int>", False, False),
])
def test_what_the_apply_paths_ask_of_a_spark_type(kind, adoptable, lookup_safe):
    assert adoptable_type(kind) is adoptable and lookup_type(kind) is lookup_safe


def test_spark_types_as_values():
    assert SparkType.parse("array<decimal(12, 2)>") == SparkType("array", element=SparkType("decimal", 12, 2))
    assert SparkType.parse("array<array<int>>").element.element == SparkType("int")
    assert widens("int", "bigint") and widens("float", "double") and widens("decimal(10,2)", "decimal(12,2)")
    assert not widens("decimal(10,2)", "decimal(12,3)") and not widens("bigint", "int") and not widens("int", "string")
    assert pg_type("numeric", formatted="numeric(39,2)") is TEXT  # no exact Spark decimal: text
    assert column_pg_type({"name": "c", "type": "int4", "override": "string"}) is TEXT
    assert pg_type("_int4", "int4").parser == "array:int" and pg_type("int2").spark == SparkType("int")


# --- type text is parsed in the registry only -----------------------------------------------------

#: what counts as parsing type text: a prefix test, a length or a search of Spark's or PostgreSQL's
#: type text (``kind.startswith("array<")``, ``len("array<")``, ``kind.find("decimal(")``); a regular
#: expression over it (``re.compile(r"decimal\(...")``); a split of it at ``<`` or ``(``. Writing
#: type text (``.cast("decimal(20,0)")``, DDL) is not parsing it.
TYPE_TEXT = ("array<", "decimal(", "numeric(", "struct<", "map<", "varchar(", "character varying(", "timestamp(")
REGEX_TEXT = ("array<", r"decimal\(", r"numeric\(", "struct<", "map<", r"varchar\(")
PREFIX_CALLS = ("startswith", "endswith", "removeprefix", "removesuffix", "len", "index", "find")
REGEX_CALLS = ("compile", "match", "fullmatch", "search", "sub", "findall")
SPLIT_CALLS = ("split", "partition", "rpartition")


def type_text_parsing(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        texts = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        texts += [element.value for arg in node.args if isinstance(arg, ast.Tuple) for element in arg.elts
                  if isinstance(element, ast.Constant) and isinstance(element.value, str)]
        if ((name in PREFIX_CALLS and any(text.startswith(TYPE_TEXT) for text in texts))
                or (name in REGEX_CALLS and any(part in text for text in texts for part in REGEX_TEXT))
                or (name in SPLIT_CALLS and any(text in ("<", "(") for text in texts))):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_catches_the_parsing_done_before():
    before = '''
_DECIMAL = re.compile(r"^decimal\\((\\d+),(\\d+)\\)$")
if kind.startswith("array<") and kind.endswith(">"):
    kind = kind[len("array<"):-1]
ok = kind in SIMPLE or kind.startswith("decimal(")
'''
    assert len(type_text_parsing(before)) == 4
    assert type_text_parsing('F.col("x").cast("decimal(20,0)")') == []  # writing a type is not parsing it


def test_type_text_is_parsed_in_the_registry_only():
    found = {str(path.relative_to(PACKAGE)): hits for path in sorted(PACKAGE.rglob("*.py"))
             if path != REGISTRY_MODULE and (hits := type_text_parsing(path.read_text()))}
    assert found == {}, ("take type text apart in staging/seam/pg_types.py only (SparkType.parse, pg_type, "
                         f"decimal_of) and ask the values: {found}")
    assert type_text_parsing(REGISTRY_MODULE.read_text())  # the scan sees the registry's own parsing
