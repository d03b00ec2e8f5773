"""The streaming windows' pure logic: when a pull or an apply round happens, what a window returns."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_pglogical.capture.pull_window import pull_window
from airflow_provider_pglogical.exceptions import InvalidInputError
from airflow_provider_pglogical.management.validation import check_seconds
from airflow_provider_pglogical.spark.common.errors import ApplyError
from airflow_provider_pglogical.spark.jobs.apply_window import Phases, first_commits, keep_applying, loaded, round_entry
from airflow_provider_pglogical.staging.seam.manifests import BatchManifest, TableManifest


class Clock:
    """A clock the code under test advances itself: each call of ``work`` or ``wait`` moves it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.waits.append(round(seconds, 3))
        self.now += seconds


def test_a_pull_window_pulls_every_poll_interval_until_it_ends_and_once_at_its_end():
    clock = Clock()
    results = iter([
        {"batch": "/s/p/A", "start_lsn": "0/10", "end_lsn": "0/20", "advanced_to": "0/20", "tables": {"t": 2},
         "transactions": 1, "changes": 2},
        {"batch": None, "start_lsn": "0/20", "end_lsn": "0/28", "advanced_to": "0/28", "tables": {}, "changes": 0},
        *[{"batch": f"/s/p/B{i}", "start_lsn": "0/28", "end_lsn": "0/30", "advanced_to": "0/30", "tables": {"t": 1},
           "transactions": 1, "changes": 1} for i in range(10)],
    ])
    seen = []

    def pull() -> dict:
        clock.now += 0.2  # a pull takes 0.2 s
        return next(results)

    summary = pull_window(pull, 2.0, 0.5, pulled=lambda result, seconds: seen.append(round(seconds, 3)),
                          clock=clock, wait=clock.wait)
    # a pull every 0.5 s: waits of 0.3 s after each 0.2 s pull, the last wait cut at the window's end
    assert clock.waits == [0.3, 0.3, 0.3, 0.3]
    assert summary["pulls"] == 5 and seen == [0.2] * 5
    assert summary["batches"] == 4 and summary["first_batch"] == "/s/p/A" and summary["batch"] == "/s/p/B2"
    assert summary["changes"] == 5 and summary["transactions"] == 4 and summary["tables"] == {"t": 5}
    assert (summary["start_lsn"], summary["end_lsn"], summary["advanced_to"]) == ("0/10", "0/30", "0/30")


def test_a_pull_that_took_longer_than_the_interval_is_followed_at_once():
    clock = Clock()

    def pull() -> dict:
        clock.now += 0.8  # a backlog: slower than the poll interval
        return {"batch": "/b", "changes": 10}

    summary = pull_window(pull, 2.0, 0.5, clock=clock, wait=clock.wait)
    assert clock.waits == [0.0, 0.0] and summary["pulls"] == 3


def test_an_apply_window_applies_a_round_only_when_a_new_batch_is_committed():
    clock = Clock()
    listings = iter([["a"], ["a"], ["a", "b"], ["a", "b"], ["a", "b", "c"], ["a", "b", "c"]])
    rounds, recorded = [], []

    def apply_round() -> dict:
        clock.now += 1.0
        seen = ["a"] if not rounds else (["a", "b"] if len(rounds) == 1 else ["a", "b", "c"])
        rounds.append(seen)
        return {"pipeline": "p", "batches": len(seen), "seen": seen, "steps": [{"rows": len(rounds)}],
                "targets": {"t": f"m{len(rounds)}"}, "end_lsn": f"0/{len(rounds)}", "first_commits": {},
                "retention": {"removed": 1}}

    summary = keep_applying(apply_round, lambda: next(listings), 5.0, 0.5, record=recorded.append,
                            clock=clock, wait=clock.wait)
    # the first round at once; then listings every 0.5 s; a round only for "b" and for "c"
    assert rounds == [["a"], ["a", "b"], ["a", "b", "c"]]
    assert [entry["round"] for entry in recorded] == [1, 2, 3]
    assert [entry["end_lsn"] for entry in recorded] == ["0/1", "0/2", "0/3"]
    assert summary["steps"] == [{"rows": 1}, {"rows": 2}, {"rows": 3}]
    assert summary["seen"] == ["a", "b", "c"] and summary["targets"] == {"t": "m3"}
    assert summary["retention"] == {"removed": 3}
    assert summary["window"]["rounds"] == 3 and summary["window"]["polls"] >= 3
    assert clock.now >= 105.0  # ran to the window's end


def test_an_apply_window_ends_with_a_last_listing_after_its_deadline():
    clock = Clock()
    listings = []

    def committed() -> list[str]:
        listings.append(clock.now)
        return ["a", "late"] if clock.now >= 101.0 else ["a"]

    rounds = []

    def apply_round() -> dict:
        rounds.append(clock.now)
        return {"seen": ["a"] if len(rounds) == 1 else ["a", "late"], "steps": []}

    keep_applying(apply_round, committed, 1.0, 0.4, clock=clock, wait=clock.wait)
    assert listings[-1] >= 101.0 and len(rounds) == 2  # the batch committed at the end still applied


def test_an_initial_loads_window_ends_after_the_round_that_applied_the_snapshot():
    clock = Clock()
    listings = iter([[], [], ["S"], ["S", "C1"]])  # the sync commits its snapshot while the window waits
    rounds = []

    def apply_round() -> dict:
        clock.now += 1.0
        rounds.append(clock.now)
        snapshot = len(rounds) > 1
        return {"seen": ["S"] if snapshot else [], "steps": [{"kind": "snapshot"}] if snapshot else [],
                "targets": {"t": "m1"} if snapshot else {}}

    summary = keep_applying(apply_round, lambda: next(listings), 3600.0, 0.5, until=loaded,
                            clock=clock, wait=clock.wait)
    # the first round (nothing committed yet) at once, two empty listings, then the snapshot's round: the end
    assert rounds == [101.0, 103.5] and clock.waits == [0.5, 0.5, 0.5]
    assert summary["steps"] == [{"kind": "snapshot"}] and summary["window"]["rounds"] == 2
    assert next(listings) == ["S", "C1"]  # not listed again after the snapshot's round


def test_a_window_whose_first_round_applied_nothing_warms_up_once_while_it_waits():
    clock = Clock()
    listings = iter([[], ["S"], ["S"], ["S", "C1"]])
    listed: list[list[str]] = [[]]
    warm_ups, rounds = [], []

    def committed() -> list[str]:
        listed.append(next(listings, listed[-1]))
        return listed[-1]

    def apply_round() -> dict:
        clock.now += 1.0
        rounds.append(clock.now)
        return {"seen": listed[-1], "steps": [{"kind": "changes"}] if listed[-1] else []}

    summary = keep_applying(apply_round, committed, 10.0, 0.5, idle=lambda: warm_ups.append(len(rounds)) or 0.25,
                            clock=clock, wait=clock.wait)
    # once (in a thread of its own, joined at the window's end), after the empty first round
    assert warm_ups == [1] and len(rounds) == 3
    assert summary["window"]["warm_up_seconds"] == 0.25
    busy = keep_applying(lambda: {"seen": ["S"], "steps": [{"kind": "changes"}]}, lambda: ["S"], 1.0, 0.5,
                         idle=lambda: warm_ups.append("busy") or 0.25, clock=clock, wait=clock.wait)
    assert warm_ups == [1] and busy["window"]["warm_up_seconds"] is None  # its first round had work: no warm-up


def test_an_initial_loads_window_on_a_loaded_pipeline_ends_after_its_first_round():
    clock = Clock()
    summary = keep_applying(lambda: {"seen": [], "steps": [], "targets": {"t": "m7"}}, lambda: [], 3600.0, 0.5,
                            until=loaded, clock=clock, wait=clock.wait)
    assert summary["window"]["rounds"] == 1 and clock.waits == [] and clock.now == 100.0


def test_an_initial_loads_window_without_a_snapshot_fails_at_its_end_naming_the_sync():
    clock = Clock()
    with pytest.raises(ApplyError, match=r"no snapshot batch was committed in the 2 s .*initial sync .*failed"):
        keep_applying(lambda: {"seen": [], "steps": [], "targets": {}}, lambda: [], 2.0, 0.5, until=loaded,
                      clock=clock, wait=clock.wait)
    assert clock.now == 102.0


@pytest.mark.parametrize("targets, expected", [
    ({}, False), ({"t": None}, False), ({"t": "m1", "u": None}, False), ({"t": "m1", "u": "m2"}, True),
])
def test_a_pipeline_is_loaded_when_every_table_it_knows_is_in_the_lakehouse(targets, expected):
    assert loaded({"targets": targets, "seen": []}) is expected


@pytest.mark.parametrize("seconds, interval", [(0, 0.5), (-1, 0.5), (10, 0)])
def test_an_apply_window_refuses_a_window_or_interval_that_is_not_positive(seconds, interval):
    with pytest.raises(ApplyError, match="must be a positive number of seconds"):
        keep_applying(lambda: {}, lambda: [], seconds, interval)


def test_a_round_entry_says_how_fresh_each_table_is_and_where_the_round_ended():
    now = dt.datetime(2026, 1, 1, 12, 0, 10, tzinfo=dt.timezone.utc)
    steps = [{"kind": "changes", "table": "public.t", "batch": "B1", "rows": 3},
             {"kind": "changes", "table": "public.t", "batch": "B2", "rows": 1},
             {"kind": "snapshot", "table": "public.u", "batch": "S", "rows": 9}]
    facts = {"details": {"change_facts": {"first_commit_ts": "2026-01-01T12:00:07+00:00"}}}
    manifests = {"B1": {"tables": {"public.t": {"details": {"change_facts": {
        "first_commit_ts": "2026-01-01T12:00:04+00:00"}}}}}, "B2": {"tables": {"public.t": facts}}}
    firsts = first_commits(steps, {name: BatchManifest.from_dict(raw) for name, raw in manifests.items()})
    assert firsts == {"public.t": "2026-01-01T12:00:04+00:00"}
    phases = {"state_read": 0.1, "steps": 0.5, "state_commits": 0.1}
    entry = round_entry({"steps": steps, "first_commits": firsts, "end_lsn": "0/5", "round_seconds": 0.7,
                         "round_phases": phases, "compactions": [{"target": "public__t"}]}, 4, now)
    assert entry == {"at": "2026-01-01T12:00:10.000+00:00", "seconds": 0.7, "rows": 13, "steps": 3, "round": 4,
                     "end_lsn": "0/5", "freshness_seconds": 6.0, "tables": {"public.t": 6.0}, "phases": phases,
                     "compactions": 1}


def test_a_rounds_phases_leave_out_the_wait_before_it():
    ticks = iter([1.0, 5.0, 5.5, 6.25])
    phases = Phases(0.0, clock=lambda: next(ticks))
    phases.end("lease")
    before = phases.restart()  # at 5.0: the window's wait since 1.0 is no phase's
    phases.end("steps")
    phases.end("state_commits")
    assert phases.since(before) == {"steps": 0.5, "state_commits": 0.75}
    assert phases.seconds == {"lease": 1.0, "steps": 0.5, "state_commits": 0.75}


@pytest.mark.parametrize("value, expected", [
    (None, None), (0, None), ("", None), (dt.timedelta(minutes=5), 300.0), (90, 90.0), ("2.5", 2.5),
])
def test_a_window_is_a_timedelta_or_seconds_and_none_or_zero_is_off(value, expected):
    assert check_seconds(value, "keep_running", optional=True) == expected


@pytest.mark.parametrize("value", [-1, "five minutes", True, dt.timedelta(seconds=-3), float("inf")])
def test_a_window_that_is_not_a_positive_duration_is_refused_naming_the_argument(value):
    with pytest.raises(InvalidInputError, match=r"keep_running must be a positive duration.*unset \(or 0\)"):
        check_seconds(value, "keep_running", optional=True)
    with pytest.raises(InvalidInputError, match="poll_interval must be a positive duration"):
        check_seconds(0, "poll_interval")


def test_an_apply_windows_length_counts_from_the_end_of_its_first_round():
    clock = Clock()
    listings = []

    def apply_round() -> dict:
        clock.now += 10.0  # a long first round (a backlog, a cold JVM)
        return {"seen": [], "steps": []}

    keep_applying(apply_round, lambda: listings.append(clock.now) or [], 1.0, 0.5, clock=clock, wait=clock.wait)
    assert listings == [110.5, 111.0]


def test_a_pull_window_skips_pulls_while_the_apply_is_behind_but_never_more_than_ten_in_a_row():
    from airflow_provider_pglogical.capture.pull_window import MAX_SKIPS, unapplied_batches
    from airflow_provider_pglogical.lsn import Lsn

    committed = [("s", Lsn(10), Lsn(10), "snapshot"), ("a", Lsn(10), Lsn(20), "changes"),
                 ("b", Lsn(20), Lsn(30), "changes")]
    assert unapplied_batches(committed, Lsn(10)) == 2 and unapplied_batches(committed, Lsn(30)) == 0
    assert unapplied_batches(committed, None) == 0  # no apply round recorded: no pacing
    clock = Clock()
    behind = iter([2, 0, 3, *[5] * 30])
    pulls = []
    summary = pull_window(lambda: pulls.append(clock.now) or {"batch": "/b", "changes": 1}, 15.0, 0.5,
                          unapplied=lambda: next(behind), max_unapplied=2, clock=clock, wait=clock.wait)
    # skipped at 100.0 (2 behind), pulled at 100.5 (0), skipped from 101.0 on, at most ten in a row
    assert pulls[:2] == [100.5, 101.0 + 0.5 * MAX_SKIPS]
    assert summary["skipped"] >= 1 + MAX_SKIPS and summary["pulls"] == len(pulls)


def test_a_window_that_waited_for_the_handover_counts_the_wait_as_part_of_its_window():
    from airflow_provider_pglogical.spark.jobs.apply_window import window_after_handover

    # runs start every 600 s and last 660: a window that waited 50 s for the previous one keeps 610
    assert window_after_handover(660.0, 0.0, 0.5) == 660.0
    assert window_after_handover(660.0, 50.0, 0.5) == 610.0
    assert window_after_handover(660.0, 700.0, 0.5) == 0.5  # waited past its own window: one poll


def test_the_next_window_waits_for_a_windows_lease_until_its_promised_end_plus_a_margin_only():
    from airflow_provider_pglogical.spark.apply.lease import HANDOVER_MARGIN_SECONDS, handover_deadline

    now = 1_000.0
    assert handover_deadline({"window_until": now + 5}, now) == now + 5 + HANDOVER_MARGIN_SECONDS
    # just past its end: still handing over (its last round runs)
    assert handover_deadline({"window_until": now - 10}, now) == now - 10 + HANDOVER_MARGIN_SECONDS
    # a window stuck past its end and the margin, a single apply, an initial load's window: as before
    assert handover_deadline({"window_until": now - HANDOVER_MARGIN_SECONDS - 1}, now) is None
    assert handover_deadline({"expires_at": now + 100}, now) is None
    assert handover_deadline({"window_until": True}, now) is None
    assert handover_deadline(None, now) is None


def test_a_window_says_its_deadline_once_and_runs_a_round_that_met_another_commit_again():
    from airflow_provider_pglogical.spark.jobs.apply_window import MAX_CONFLICTS

    class Conflict(Exception):
        pass

    clock = Clock()
    promised, outcomes = [], iter(["ok", Conflict("a compaction replaced a file"), "ok"])

    def apply_round() -> dict:
        clock.now += 1.0
        outcome = next(outcomes, "ok")
        if isinstance(outcome, Exception):
            raise outcome
        return {"seen": ["a", "b"] if clock.now > 101.5 else ["a"], "steps": []}

    listings = iter([["a", "b"]])
    summary = keep_applying(apply_round, lambda: next(listings, ["a", "b"]), 3.0, 0.5, promise=promised.append,
                            conflict=lambda error: isinstance(error, Conflict), clock=clock, wait=clock.wait)
    assert promised == [3.0]  # once, after the first round
    assert summary["window"]["rounds"] == 2 and summary["window"]["conflicts"] == 1
    # an error that is no conflict, or conflicts without end, fail the window
    failing = iter([ValueError("broken")])
    with pytest.raises(ValueError, match="broken"):
        keep_applying(lambda: (_ for _ in ()).throw(next(failing)), lambda: [], 3.0, 0.5,
                      conflict=lambda error: isinstance(error, Conflict), clock=Clock(), wait=Clock().wait)
    attempts = []

    def always_conflicting() -> dict:
        attempts.append(1)
        raise Conflict("again")

    other = Clock()
    with pytest.raises(Conflict):
        keep_applying(always_conflicting, lambda: [], 3.0, 0.5, conflict=lambda error: isinstance(error, Conflict),
                      clock=other, wait=other.wait)
    assert len(attempts) == MAX_CONFLICTS + 1
