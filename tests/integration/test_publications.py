"""Publications, reproduced from the PostgreSQL 15 docs' row-filter and column-list chapters."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.exceptions import ColumnListConflict, PublicationError
from airflow_provider_pglogical.management.publications import PublishedTable

ROW_FILTER_TABLES = """
CREATE TABLE t1(a int, b int, c text, PRIMARY KEY(a,c));
CREATE TABLE t2(d int, e int, f int, PRIMARY KEY(d));
CREATE TABLE t3(g int, h int, i int, PRIMARY KEY(g));
"""


@pytest.fixture
def row_filter_example(publisher, publisher_hook):
    """p1, p2 and p3 of the row-filter chapter, created through the hook."""
    publisher.execute(ROW_FILTER_TABLES)
    publisher_hook.create_publication("p1", [PublishedTable("t1", where="a > 5 AND c = 'NSW'")])
    publisher_hook.create_publication("p2", [PublishedTable("t1"), PublishedTable("t2", where="e = 99")])
    publisher_hook.create_publication(
        "p3", [PublishedTable("t2", where="d = 10"), PublishedTable("t3", where="g = 10")]
    )
    return publisher_hook


def test_describe_matches_psql_dRp_plus(row_filter_example):
    described = {name: row_filter_example.describe_publication(name) for name in ("p1", "p2", "p3")}
    for info in described.values():
        assert (info.owner, info.all_tables, info.inserts, info.updates, info.deletes, info.truncates,
                info.via_root) == ("postgres", False, True, True, True, True, False)
    assert [t.psql_line() for t in described["p1"].tables] == [
        "\"public.t1\" WHERE ((a > 5) AND (c = 'NSW'::text))"
    ]
    assert [t.psql_line() for t in described["p2"].tables] == ['"public.t1"', '"public.t2" WHERE (e = 99)']
    assert [t.psql_line() for t in described["p3"].tables] == [
        '"public.t2" WHERE (d = 10)', '"public.t3" WHERE (g = 10)'
    ]


def test_published_tables_combine_filters_by_postgres_rules(row_filter_example):
    resolved = {t.name: t for t in row_filter_example.published_tables(["p1", "p2", "p3"])}
    # t1: p2 publishes it without a filter, which makes p1's filter redundant.
    assert resolved["t1"].row_filter is None
    # t2: the filters of p2 and p3 are OR-ed.
    assert resolved["t2"].row_filter == "((e = 99)) OR ((d = 10))"
    assert resolved["t3"].row_filter == "(g = 10)"
    assert resolved["t1"].key == ["a", "c"]
    assert resolved["t1"].column_names == ["a", "b", "c"]
    only_p1 = row_filter_example.published_tables(["p1"])
    assert [(t.name, t.row_filter) for t in only_p1] == [("t1", "((a > 5) AND (c = 'NSW'::text))")]


def test_column_list_example(publisher, publisher_hook):
    publisher.execute("CREATE TABLE t1(id int, a text, b text, c text, d text, e text, PRIMARY KEY(id))")
    publisher_hook.create_publication("p1", [PublishedTable("t1", columns=["id", "b", "a", "d"])])
    info = publisher_hook.describe_publication("p1")
    assert [t.psql_line() for t in info.tables] == ['"public.t1" (id, a, b, d)']
    (table,) = publisher_hook.published_tables(["p1"])
    assert table.column_names == ["id", "a", "b", "d"]
    assert table.has_column_list


def test_differing_column_lists_are_an_error(publisher, publisher_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY, a text, b text)")
    publisher_hook.create_publication("pa", [PublishedTable("t", columns=["id", "a"])])
    publisher_hook.create_publication("pb", [PublishedTable("t", columns=["id", "b"])])
    publisher_hook.create_publication("pall", [PublishedTable("t", columns=["id", "a", "b"])])
    publisher_hook.create_publication("pnone", [PublishedTable("t")])
    with pytest.raises(ColumnListConflict, match=r"public\.t .*pa: \(id, a\); pb: \(id, b\)"):
        publisher_hook.published_tables(["pa", "pb"])
    # A list naming every column is the same as no list.
    (table,) = publisher_hook.published_tables(["pall", "pnone"])
    assert table.column_names == ["id", "a", "b"] and not table.has_column_list


def test_partitioned_example_via_root_true_and_false(publisher, publisher_hook):
    publisher.execute(
        "CREATE TABLE parent(a int PRIMARY KEY) PARTITION BY RANGE(a);"
        "CREATE TABLE child PARTITION OF parent DEFAULT;"
    )
    publisher_hook.create_publication(
        "p4", [PublishedTable("parent", where="a < 5"), PublishedTable("child", where="a >= 5")],
        publish_via_partition_root=True,
    )
    assert [(t.name, t.row_filter) for t in publisher_hook.published_tables(["p4"])] == [("parent", "(a < 5)")]
    assert publisher_hook.describe_publication("p4").via_root
    publisher_hook.drop_publication("p4")
    publisher_hook.create_publication(
        "p4", [PublishedTable("parent"), PublishedTable("child", where="a >= 5")], publish_via_partition_root=False
    )
    assert [(t.name, t.row_filter) for t in publisher_hook.published_tables(["p4"])] == [("child", "(a >= 5)")]


def test_all_tables_and_schema_publications_are_unfiltered(publisher, publisher_hook):
    publisher.execute("CREATE SCHEMA sales; CREATE TABLE sales.orders(id int PRIMARY KEY, region text);"
                      "CREATE TABLE other(id int PRIMARY KEY)")
    publisher_hook.create_publication("filtered", [PublishedTable("sales.orders", where="region = 'EU'")])
    publisher_hook.create_publication("by_schema", schemas=["sales"])
    publisher_hook.create_publication("everything", all_tables=True)
    assert [(t.qualified_name, t.row_filter) for t in publisher_hook.published_tables(["filtered"])] == [
        ("sales.orders", "(region = 'EU'::text)")
    ]
    assert [(t.qualified_name, t.row_filter) for t in publisher_hook.published_tables(["filtered", "by_schema"])] == [
        ("sales.orders", None)
    ]
    assert [t.qualified_name for t in publisher_hook.published_tables(["everything"])] == ["public.other", "sales.orders"]
    info = publisher_hook.describe_publication("by_schema")
    assert info.schemas == ["sales"] and info.tables == []


def test_create_and_drop_are_idempotent(publisher, publisher_hook):
    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    assert publisher_hook.create_publication("p", [PublishedTable("t")]) is True
    assert publisher_hook.create_publication("p", [PublishedTable("t")]) is False
    publisher_hook.drop_publication("p")
    publisher_hook.drop_publication("p")
    assert publisher_hook.describe_publication("p") is None


def test_add_set_drop_tables_and_options(publisher, publisher_hook):
    publisher.execute("CREATE TABLE a(id int PRIMARY KEY, x int); CREATE TABLE b(id int PRIMARY KEY)")
    publisher_hook.create_publication("p", [PublishedTable("a")])
    publisher_hook.add_publication_tables("p", [PublishedTable("a"), PublishedTable("b", where="id > 1")])
    assert [t.psql_line() for t in publisher_hook.describe_publication("p").tables] == [
        '"public.a"', '"public.b" WHERE (id > 1)'
    ]
    publisher_hook.set_publication_tables("p", [PublishedTable("a", columns=["id"])])
    assert [t.psql_line() for t in publisher_hook.describe_publication("p").tables] == ['"public.a" (id)']
    publisher_hook.drop_publication_tables("p", ["a", "b"])
    assert publisher_hook.describe_publication("p").tables == []
    publisher_hook.set_publication_options("p", publish=["insert"], publish_via_partition_root=True)
    info = publisher_hook.describe_publication("p")
    assert info.publish == ("insert",) and info.via_root


def test_row_filter_is_validated_by_postgres(publisher, publisher_hook):
    import psycopg2

    publisher.execute("CREATE TABLE t(id int PRIMARY KEY)")
    with pytest.raises(psycopg2.Error, match="functions"):
        publisher_hook.create_publication("p", [PublishedTable("t", where="id > random()")])
    assert publisher_hook.describe_publication("p") is None


WEIRD_NAMES = ['Mixed Case', 'with "quotes"', "ünïcødé ✓", "semi; DROP TABLE victim; --"]


@pytest.mark.parametrize("name", WEIRD_NAMES)
def test_weird_identifiers_work_and_injection_is_inert(publisher, publisher_hook, name):
    publisher.execute("CREATE TABLE victim(id int PRIMARY KEY)")
    conn = publisher.connect()
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        cur.execute(sql.SQL("CREATE TABLE {} ({} int PRIMARY KEY, v text)").format(
            sql.Identifier(name, name), sql.Identifier(name)))
    conn.close()
    table = PublishedTable.of(name, name, columns=[name], where=None)
    assert publisher_hook.create_publication(name, [table])
    (resolved,) = publisher_hook.published_tables([name])
    assert (resolved.schema, resolved.name, resolved.column_names) == (name, name, [name])
    publisher_hook.drop_publication(name)
    assert publisher.query("SELECT count(*) FROM victim") == [(0,)]
    assert publisher.query("SELECT to_regclass('public.victim') IS NOT NULL") == [(True,)]


def test_unknown_publication_is_a_clear_error(publisher_hook):
    with pytest.raises(PublicationError, match="nope do not exist"):
        publisher_hook.published_tables(["nope"])
