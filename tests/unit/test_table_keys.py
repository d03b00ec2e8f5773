"""Every key of a source table is unambiguous (DESIGN invariant 11): manifests, ``table_map``,
``type_overrides`` and default Iceberg names never let two tables share one."""

from __future__ import annotations

import itertools

import pytest

from airflow_provider_pglogical.exceptions import TypeOverrideError
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.apply.plan import TableState
from airflow_provider_pglogical.spark.apply.table_identity import (
    adopt_legacy_keys,
    check_targets,
    normal_table_map,
    same_owner,
)
from airflow_provider_pglogical.staging import contract
from airflow_provider_pglogical.staging.typemap import apply_overrides, check_overrides

TRICKY = [("public", "foo"), ("public", "Foo"), ("public", "a-b"), ("public", "a_b"), ("x.y", "z"), ("x", "y.z"),
          ("x", "y_z"), ("x_y", "z"), ("a_", "b"), ("a", "_b"), ("public", "Order Items"), ('q"s', "t"),
          ("public", "x.y.z"), ("sales", "orders"), ("a", "__b")]


def test_keys_and_default_targets_are_injective_and_parse_back():
    keys = [contract.table_key(s, t) for s, t in TRICKY]
    assert len(set(keys)) == len(keys)
    assert [contract.parse_table_key(k) for k in keys] == TRICKY
    targets = [contract.default_target_name(k) for k in keys]
    assert len({t.lower() for t in targets}) == len(targets), targets
    assert contract.table_key("public", "orders") == "public.orders"  # plain names keep their key and target
    assert contract.default_target_name("public.orders") == "public__orders"
    assert contract.table_key("x.y", "z") == '"x.y"."z"' and contract.table_key("x", "y.z") == '"x"."y.z"'


def test_user_keys_accept_quotes_and_refuse_ambiguity():
    assert contract.normal_table_key('"x.y".z') == '"x.y"."z"'
    assert contract.normal_table_key('x."y.z"') == '"x"."y.z"'
    assert contract.normal_table_key("public.Foo") == "public.Foo"
    with pytest.raises(ValueError, match=r"'x.y.z' is 3 dot-separated names, not 2: .*double quotes"):
        contract.parse_table_key("x.y.z")
    with pytest.raises(ApplyError, match=r"table_map: table name 'x.y.z' is 3 .*Nothing was applied"):
        normal_table_map({"x.y.z": "t"})
    assert normal_table_map({'"x.y".z': "a", "public.t": "b"}) == {'"x.y"."z"': "a", "public.t": "b"}


def test_type_overrides_keys_are_parsed_per_table():
    overrides = {'"x.y".z.c': "string", 'x."y.z".c': "string", 'public.t."a.b"': "string"}
    columns = [{"name": "c"}, {"name": "a.b"}]
    assert apply_overrides('"x.y"."z"', columns, overrides)[0]["override"] == "string"
    assert "override" not in apply_overrides('"x.y"."z"', columns, overrides)[1]
    assert apply_overrides("public.t", columns, overrides)[1]["override"] == "string"
    assert "override" not in apply_overrides("public.t", columns, overrides)[0]
    with pytest.raises(TypeOverrideError, match="'x.y.z.c' is 4 dot-separated names, not 3"):
        check_overrides({"x.y.z.c": "string"})


def test_legacy_state_keys_are_taken_over_or_refused():
    states = {"x.y.z": TableState("x_y__z"), "public.t": TableState("public__t")}
    adopt_legacy_keys(states, {'"x.y"."z"', "public.t"})
    assert set(states) == {'"x.y"."z"', "public.t"} and states['"x.y"."z"'].target == "x_y__z"
    both = {"x.y.z": TableState("x_y__z")}
    with pytest.raises(ApplyError, match=r'"x"."y.z" and "x.y"."z" were both recorded as \'x.y.z\''):
        adopt_legacy_keys(both, {'"x.y"."z"', '"x"."y.z"'})


def test_two_sources_one_target_is_refused():
    with pytest.raises(ApplyError, match=r"source tables public.Foo and public.foo both map to Iceberg table "
                                         r"FOO / foo \(one name to a case-insensitive catalog\): give each source its own target with table_map"):
        check_targets({"public.Foo": TableState("FOO"), "public.foo": TableState("foo")})
    check_targets({"public.a": TableState("a"), "public.b": TableState("b")})


def test_owners_compare_pipeline_table_and_database_when_known():
    mine = {"pipeline": "p", "source": {"system_identifier": "1", "database": "d", "database_oid": 5}, "table": "s.t"}
    assert same_owner(mine, mine) and same_owner({**mine, "source": None}, mine)
    for key, other in itertools.product(["pipeline", "table"], ["q"]):
        assert not same_owner({**mine, key: other}, mine)
    assert not same_owner({**mine, "source": {**mine["source"], "system_identifier": "2"}}, mine)


def test_reserved_and_case_colliding_columns_name_the_fix():
    problems = contract.column_name_problems("public.t", ["id", "_pos", "ID", "_file", "v"])
    assert any("'_pos'" in p for p in problems) and any("'_file'" in p for p in problems)
    assert any("'id' and 'ID' differ only in case" in p for p in problems)
    assert problems[-1].startswith("fix for public.t: rename the column")
    assert contract.column_name_problems("public.t", ["id", "_op", "pos", "_position"]) == []
    assert contract.column_name_problems("public.t", ["_pglogical_occurrence"], multiset=True)
