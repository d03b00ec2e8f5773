"""The driver's memory of what its last row delta of a table wrote (``spark/kept_values.py``)."""

from __future__ import annotations

from airflow_provider_pglogical.spark.kept_values import ABSENT, KeptValues, kept_values


def test_a_commit_answers_for_its_own_snapshot_only():
    kept = KeptValues()
    assert kept.lookup("lake.n.t", 10, ["doc"], [1]) == {}
    kept.committed("lake.n.t", 10, 9, ("doc", "note"), {1: ("d1", "n1"), 2: ("d2", None)}, [3])
    assert kept.lookup("lake.n.t", 10, ["note", "doc"], [1, 2, 3, 4]) == {1: ("n1", "d1"), 2: (None, "d2"), 3: ABSENT}
    assert kept.lookup("lake.n.t", 11, ["doc"], [1]) == {}  # another commit came after it
    assert kept.lookup("lake.n.t", None, ["doc"], [1]) == {}
    assert kept.lookup("lake.n.t", 10, ["doc", "other"], [1]) == {}  # a column it did not keep
    assert kept.lookup("lake.n.u", 10, ["doc"], [1]) == {}


def test_the_next_commit_carries_what_its_parent_held():
    kept = KeptValues()
    kept.committed("t", 10, 9, ("doc",), {1: ("a",), 2: ("b",)}, [])
    kept.committed("t", 11, 10, ("doc",), {2: ("B",)}, [1])
    assert kept.lookup("t", 11, ["doc"], [1, 2]) == {1: ABSENT, 2: ("B",)}
    # a commit on top of another writer's snapshot: only what it wrote itself is known
    kept.committed("t", 13, 12, ("doc",), {5: ("e",)}, [])
    assert kept.lookup("t", 13, ["doc"], [2, 5]) == {5: ("e",)}
    # other columns: the rows kept before do not hold them
    kept.committed("t", 14, 13, ("doc", "note"), {6: ("f", "g")}, [])
    assert kept.lookup("t", 14, ["doc"], [5, 6]) == {6: ("f",)}
    kept.forget("t")
    assert kept.lookup("t", 14, ["doc"], [6]) == {} and kept.columns("t") == ()


def test_the_budget_keeps_the_newest_tables():
    kept = KeptValues(budget_bytes=1000)
    kept.committed("old", 1, None, ("doc",), {1: ("x" * 300,)}, [])
    kept.committed("new", 1, None, ("doc",), {1: ("y" * 300,)}, [])
    assert kept.lookup("old", 1, ["doc"], [1]) and kept.lookup("new", 1, ["doc"], [1])
    kept.committed("newest", 1, None, ("doc",), {1: ("z" * 300,)}, [])
    assert kept.lookup("old", 1, ["doc"], [1]) == {}  # evicted, oldest first
    assert kept.lookup("newest", 1, ["doc"], [1]) == {1: ("z" * 300,)}
    kept.committed("huge", 1, None, ("doc",), {1: ("h" * 2000,)}, [])  # over the budget alone
    assert kept.lookup("huge", 1, ["doc"], [1]) == {} and kept.lookup("new", 1, ["doc"], [1])
    # a key written again counts once
    for snapshot in range(2, 20):
        kept.committed("new", snapshot, snapshot - 1, ("doc",), {1: ("y" * 300,)}, [])
    assert kept.lookup("new", 19, ["doc"], [1]) and kept.lookup("newest", 1, ["doc"], [1])


def test_one_memory_per_session():
    class Session:
        pass

    first, second = Session(), Session()
    assert kept_values(first) is kept_values(first)
    assert kept_values(first) is not kept_values(second)
