"""The election loop against an in-memory Lease with the API server's optimistic concurrency."""

from __future__ import annotations

import dataclasses
import threading
import urllib.request
from datetime import UTC, datetime

import pytest

from chronotope.controllers.leader import LeaderElection, run_elected, serve_standby_health
from chronotope.devcluster.process import free_port
from chronotope.workloads.leader import LeaseRecord, LeaseTiming, Verdict

FAST = LeaseTiming(lease_s=1, renew_deadline_s=0.2, retry_s=0.01)


class FakeLease:
    """One Lease: create fails if it exists, update fails unless the version matches."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.fail_reads = False
        self.lock = threading.Lock()

    def get(self) -> LeaseRecord | None:
        if self.fail_reads:
            raise ConnectionError("apiserver unreachable")
        with self.lock:
            return self.record

    def create(self, record: LeaseRecord) -> bool:
        with self.lock:
            if self.record is not None:
                return False
            self._store(record)
            return True

    def update(self, record: LeaseRecord) -> bool:
        with self.lock:
            if self.record is None or record.version != self.record.version:
                return False
            self._store(record)
            return True

    def steal(self, holder: str) -> None:
        with self.lock:
            assert self.record is not None
            self._store(dataclasses.replace(self.record, holder=holder))

    def _store(self, record: LeaseRecord) -> None:
        self.version += 1
        self.record = dataclasses.replace(record, version=str(self.version))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def election(lease: FakeLease, me: str, clock: Clock, **kw: object) -> LeaderElection:
    return LeaderElection(
        lease,
        me,
        LeaseTiming(),
        mono=clock,
        wall=lambda: datetime(2025, 1, 1, tzinfo=UTC),
        **kw,  # type: ignore[arg-type]
    )


def test_one_of_two_leads_the_other_takes_over_after_a_full_lease() -> None:
    lease, clock = FakeLease(), Clock()
    a, b = election(lease, "a", clock), election(lease, "b", clock)
    assert a.attempt() is not None
    assert a.leading
    decision = b.attempt()
    assert decision is not None
    assert decision.verdict is Verdict.WAIT
    assert not b.leading
    clock.now = 14.9  # a died right after acquiring: b waits out the lease on its clock
    b.attempt()
    assert not b.leading
    clock.now = 15.0
    b.attempt()
    assert lease.record is not None
    # one comparison: mypy keeps `b.leading` narrowed to False across the attempt that sets it
    assert (b.leading, lease.record.holder, lease.record.transitions) == (True, "b", 1)


def test_release_hands_over_at_the_next_attempt() -> None:
    lease, clock = FakeLease(), Clock()
    heard: list[bool] = []
    a = election(lease, "a", clock, on_leading=heard.append)
    b = election(lease, "b", clock)
    assert a.acquire(threading.Event())
    b.attempt()
    assert a.release()
    assert heard == [True, False]
    assert lease.record is not None
    assert lease.record.holder == ""
    b.attempt()  # no time passed: a released it
    assert b.leading
    assert not a.release()  # not the holder any more: nothing to hand back


def test_a_leader_whose_lease_is_taken_stops_at_once() -> None:
    lease, lost = FakeLease(), threading.Event()
    reasons: list[str] = []
    heard: list[bool] = []

    def on_lost(reason: str) -> None:
        reasons.append(reason)
        lost.set()

    a = LeaderElection(lease, "a", FAST, on_lost=on_lost, on_leading=heard.append)
    assert a.acquire(threading.Event())
    a.start_renewing()
    lease.steal("intruder")
    assert lost.wait(10)
    assert "intruder" in reasons[0]
    assert heard == [True, False]
    a.stop_renewing()


def test_a_leader_that_cannot_renew_within_the_deadline_stops() -> None:
    lease, lost = FakeLease(), threading.Event()
    reasons: list[str] = []

    def on_lost(reason: str) -> None:
        reasons.append(reason)
        lost.set()

    a = LeaderElection(lease, "a", FAST, on_lost=on_lost)
    assert a.acquire(threading.Event())
    a.start_renewing()
    lease.fail_reads = True  # the apiserver is gone
    assert lost.wait(10)
    assert reasons == ["no renewal for 0.2 s"]
    assert lease.record is not None
    assert lease.record.holder == "a"  # nobody else could take it before the lease ran out
    a.stop_renewing()


def test_acquire_returns_when_stopped_while_standing_by() -> None:
    lease, clock = FakeLease(), Clock()
    election(lease, "a", clock).attempt()
    stop = threading.Event()
    stop.set()
    assert not election(lease, "b", clock).acquire(stop)


def test_run_elected_runs_the_controllers_only_when_leading_and_releases() -> None:
    lease = FakeLease()
    ran: list[str] = []

    def run(stop: threading.Event) -> None:
        assert lease.record is not None
        ran.append(lease.record.holder)

    a = LeaderElection(lease, "a", FAST, on_lost=lambda _: pytest.fail("lost"))
    assert run_elected(a, run) == 0
    assert ran == ["a"]
    assert lease.record is not None
    assert lease.record.holder == ""


def test_standby_health_answers_and_frees_its_port() -> None:
    port = free_port()
    stop = serve_standby_health("127.0.0.1", port)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        assert resp.status == 200
        assert resp.read() == b"standby\n"
    stop()
    stop_again = serve_standby_health("127.0.0.1", port)  # kopf binds it next
    stop_again()
