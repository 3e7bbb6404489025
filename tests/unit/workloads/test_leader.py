"""The Lease election's decision table and the elector's clock (client-go's protocol)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from chronotope.workloads.leader import (
    Decision,
    Elector,
    LeaseRecord,
    LeaseTiming,
    Verdict,
    decide,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(seconds=30)
TIMING = LeaseTiming()


def held(holder: str, transitions: int = 3) -> LeaseRecord:
    return LeaseRecord(holder, 15, T0, T0 + timedelta(seconds=20), transitions, version="41")


@pytest.mark.parametrize(
    ("current", "leading", "expired", "want"),
    [
        pytest.param(None, False, False, (Verdict.ACQUIRE, "me", 0, True), id="no-lease"),
        pytest.param(None, True, False, (Verdict.RENEW, "me", 0, True), id="deleted-under-leader"),
        pytest.param(held("me"), True, False, (Verdict.RENEW, "me", 3, False), id="renewed-by-me"),
        pytest.param(held("me"), False, False, (Verdict.RENEW, "me", 3, False), id="restarted-me"),
        pytest.param(held("other"), False, False, (Verdict.WAIT, None, None, False), id="held"),
        pytest.param(held("other"), False, True, (Verdict.ACQUIRE, "me", 4, False), id="expired"),
        pytest.param(held(""), False, False, (Verdict.ACQUIRE, "me", 4, False), id="released"),
        pytest.param(held("other"), True, False, (Verdict.LOST, None, None, False), id="taken"),
        pytest.param(held("other"), True, True, (Verdict.LOST, None, None, False), id="taken-old"),
        pytest.param(held(""), True, False, (Verdict.LOST, None, None, False), id="released-away"),
    ],
)
def test_decision_table(
    current: LeaseRecord | None,
    leading: bool,
    expired: bool,
    want: tuple[Verdict, str | None, int | None, bool],
) -> None:
    verdict, holder, transitions, create = want
    d = decide(current, me="me", leading=leading, expired=expired, now=NOW, timing=TIMING)
    assert d.verdict is verdict
    assert d.create is create
    if holder is None:
        assert d.write is None
        return
    assert d.write is not None
    assert (d.write.holder, d.write.transitions) == (holder, transitions)
    assert d.write.renew_time == NOW
    assert d.write.duration_s == TIMING.lease_s
    if current is not None:
        assert d.write.version == current.version  # the update is conditional on what was read
    taken_over = verdict is Verdict.ACQUIRE
    assert d.write.acquire_time == (NOW if taken_over else (current or d.write).acquire_time)


def test_a_candidate_waits_a_full_lease_on_its_own_clock_from_the_last_change() -> None:
    e = Elector("me", TIMING)
    record = held("other")
    # the holder's renewTime is long past on this wall clock: skew must not matter
    late_wall = T0 + timedelta(hours=5)
    assert e.step(record, 100.0, late_wall).verdict is Verdict.WAIT
    assert e.step(record, 114.9, late_wall).verdict is Verdict.WAIT
    renewed = LeaseRecord("other", 15, T0, T0 + timedelta(seconds=22), 3, version="42")
    assert e.step(renewed, 114.95, late_wall).verdict is Verdict.WAIT  # a renewal restarts it
    assert e.step(renewed, 129.9, late_wall).verdict is Verdict.WAIT
    d = e.step(renewed, 129.95, late_wall)
    assert d.verdict is Verdict.ACQUIRE
    assert d.write is not None
    assert (d.write.holder, d.write.transitions, d.write.version) == ("me", 4, "42")


def test_the_record_duration_counts_not_mine() -> None:
    e = Elector("me", TIMING)
    short = LeaseRecord("other", 3, T0, T0, 0, version="1")
    assert e.step(short, 10.0, NOW).verdict is Verdict.WAIT
    assert e.step(short, 13.0, NOW).verdict is Verdict.ACQUIRE


def test_only_a_successful_write_makes_a_leader() -> None:
    e = Elector("me", TIMING)
    d = e.step(None, 0.0, NOW)
    e.wrote(d, ok=False, mono=0.0)  # another candidate created it first (409)
    assert not e.leading
    d = e.step(held("me"), 2.0, NOW)
    e.wrote(d, ok=True, mono=2.0)
    # one comparison: mypy keeps `e.leading` narrowed to False across the write that sets it
    assert (e.leading, e.renewed_at) == (True, 2.0)


def test_conflicting_renewals_keep_leading_until_the_renew_deadline() -> None:
    e = Elector("me", TIMING)
    e.wrote(e.step(held("me"), 0.0, NOW), ok=True, mono=0.0)
    for t in (2.0, 4.0, 6.0, 8.0):
        d = e.step(held("me"), t, NOW)
        assert d.verdict is Verdict.RENEW
        e.wrote(d, ok=False, mono=t)  # 409: someone wrote in between
        assert e.leading
        assert not e.deadline_passed(t)
    assert e.deadline_passed(10.0)
    # a successful renewal in time resets the deadline
    e.wrote(e.step(held("me"), 9.0, NOW), ok=True, mono=9.0)
    assert not e.deadline_passed(18.9)


def test_a_leader_that_reads_another_holder_has_lost() -> None:
    e = Elector("me", TIMING)
    e.wrote(e.step(held("me"), 0.0, NOW), ok=True, mono=0.0)
    d = e.step(held("intruder"), 2.0, NOW)
    assert d.verdict is Verdict.LOST
    assert "intruder" in d.reason
    assert not e.leading


def test_two_candidates_racing_for_an_expired_lease_write_the_same_version() -> None:
    a, b = Elector("a", TIMING), Elector("b", TIMING)
    record = held("dead")
    for e in (a, b):
        e.step(record, 0.0, NOW)
    da, db = a.step(record, 15.0, NOW), b.step(record, 15.0, NOW)
    assert da.verdict is db.verdict is Verdict.ACQUIRE
    # both updates are conditional on version 41: the API server lets exactly one through
    assert da.write is not None
    assert db.write is not None
    assert da.write.version == db.write.version == "41"


def test_release_clears_the_holder_and_keeps_transitions() -> None:
    e = Elector("me", TIMING)
    e.wrote(e.step(held("me"), 0.0, NOW), ok=True, mono=0.0)
    out = e.released(held("me"), NOW)
    assert out is not None
    assert (out.holder, out.duration_s, out.transitions, out.version) == ("", 1, 3, "41")
    assert not e.leading
    assert Elector("me", TIMING).released(held("other"), NOW) is None


@pytest.mark.parametrize(
    ("lease", "deadline", "retry"),
    [(15, 15.0, 2.0), (15, 10.0, 0.0), (15, 2.0, 2.0), (0, 10.0, 2.0)],
)
def test_durations_that_would_let_two_lead_are_refused(
    lease: int, deadline: float, retry: float
) -> None:
    with pytest.raises(ValueError, match=r"lease duration|retry period"):
        LeaseTiming(lease_s=lease, renew_deadline_s=deadline, retry_s=retry)


def test_decision_names_what_it_saw() -> None:
    d: Decision = decide(held("x"), me="me", leading=False, expired=True, now=NOW, timing=TIMING)
    assert d.reason == "x stopped renewing"
