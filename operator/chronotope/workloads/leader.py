"""Leader election on a Lease: who may run the controllers. Pure: no API calls.

Two operator replicas must never both write. They agree through one
coordination.k8s.io/v1 Lease with client-go's leaderelection protocol: the
holder renews `renewTime` every retry period; a candidate takes the Lease only
when it is free (no Lease, or `holderIdentity` cleared by a release) or when
the holder has not renewed for `leaseDurationSeconds`. As in client-go, that
duration is measured on the candidate's own monotonic clock from the moment
it first saw the current record, never by comparing the holder's `renewTime`
with the local wall clock, so clock skew between nodes cannot cut a Lease
short. Every write carries the `resourceVersion` that was read, so of two
candidates racing for an expired Lease exactly one update succeeds.

`decide` is the whole decision; `Elector` keeps the little state it needs
(what was seen when, whether this process leads, its last renewal) and says
when a leader has gone `renew_deadline_s` without renewing and must stop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = ["Decision", "Elector", "LeaseRecord", "LeaseTiming", "Verdict", "decide"]


@dataclass(frozen=True)
class LeaseTiming:
    """The election's durations (controller-runtime's defaults).

    Attributes:
        lease_s: how long a Lease holds without renewal (`leaseDurationSeconds`).
        renew_deadline_s: a leader that has not renewed for this long stops leading;
            shorter than `lease_s`, so it stops before any candidate may take over.
        retry_s: how often candidates try to acquire and the leader renews.
    """

    lease_s: int = 15
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0

    def __post_init__(self) -> None:
        """Refuse durations that would let a candidate take over before the leader stops."""
        if self.lease_s < 1:
            raise ValueError(f"lease duration must be >= 1 s, not {self.lease_s}")
        if not 0 < self.retry_s < self.renew_deadline_s < self.lease_s:
            raise ValueError(
                "need 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_s} s, {self.renew_deadline_s} s, {self.lease_s} s"
            )


@dataclass(frozen=True)
class LeaseRecord:
    """The election fields of a Lease's spec, plus the `resourceVersion` that was read.

    Attributes:
        holder: `holderIdentity`; empty when nobody holds it (released).
        duration_s: `leaseDurationSeconds` the holder promised.
        acquire_time: `acquireTime`, when the current holder took it.
        renew_time: `renewTime`, the holder's latest renewal.
        transitions: `leaseTransitions`, how often the holder changed.
        version: the object's `resourceVersion` (empty for a record not yet written).
    """

    holder: str
    duration_s: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    version: str = ""

    def content(self) -> tuple[object, ...]:
        """What identifies one renewal of the record (everything but `version`)."""
        return (self.holder, self.duration_s, self.acquire_time, self.renew_time, self.transitions)


class Verdict(StrEnum):
    """What this process should do with the Lease now."""

    ACQUIRE = "acquire"
    """Free or expired (or absent): write it with this process as holder."""
    RENEW = "renew"
    """Held by this process: write a fresh `renewTime`."""
    WAIT = "wait"
    """Held by another process that is still renewing: try again later."""
    LOST = "lost"
    """This process led, but the Lease now names another holder: stop writing at once."""


@dataclass(frozen=True)
class Decision:
    """A verdict, the record to write for ACQUIRE and RENEW, and why (for the logs).

    `create` says the record must be created (no Lease exists); else it is an
    update of the version that was read.
    """

    verdict: Verdict
    write: LeaseRecord | None
    reason: str
    create: bool = False


def decide(
    current: LeaseRecord | None,
    *,
    me: str,
    leading: bool,
    expired: bool,
    now: datetime,
    timing: LeaseTiming,
) -> Decision:
    """The verdict for `me` on the Lease as read (`current`, None when there is none). Pure.

    Args:
        current: the Lease as just read, or None if it does not exist.
        me: this process's identity.
        leading: whether this process believes it holds the Lease.
        expired: whether `current` has gone unchanged for its duration on this
            process's clock (see `Elector.expired`).
        now: the wall time to write as `acquireTime` / `renewTime`.
        timing: the durations; `lease_s` is written as `leaseDurationSeconds`.
    """
    if current is None:
        fresh = LeaseRecord(me, timing.lease_s, now, now, 0)
        verdict = Verdict.RENEW if leading else Verdict.ACQUIRE
        return Decision(verdict, fresh, "no Lease exists", create=True)
    if current.holder == me:
        renewed = dataclasses.replace(
            current,
            duration_s=timing.lease_s,
            acquire_time=current.acquire_time or now,
            renew_time=now,
        )
        return Decision(Verdict.RENEW, renewed, "held by me")
    if leading:
        who = current.holder or "nobody"
        return Decision(Verdict.LOST, None, f"the Lease names {who}, not me")
    if current.holder and not expired:
        return Decision(Verdict.WAIT, None, f"held by {current.holder}")
    why = "released" if not current.holder else f"{current.holder} stopped renewing"
    taken = dataclasses.replace(
        current,
        holder=me,
        duration_s=timing.lease_s,
        acquire_time=now,
        renew_time=now,
        transitions=current.transitions + 1,
    )
    return Decision(Verdict.ACQUIRE, taken, why)


@dataclass
class Elector:
    """One process's view of the election: call `step` per attempt, `wrote` after the write.

    Times passed in as `mono` are seconds on a monotonic clock; `wall` is what
    goes into the record. The class does no I/O: the caller reads the Lease,
    calls `step`, writes what the decision says, and reports the result.
    """

    me: str
    timing: LeaseTiming = dataclasses.field(default_factory=LeaseTiming)
    leading: bool = False
    seen: tuple[object, ...] | None = None
    seen_at: float = 0.0
    renewed_at: float | None = None

    def expired(self, current: LeaseRecord, mono: float) -> bool:
        """Whether `current` has gone unchanged for its `leaseDurationSeconds` on my clock."""
        return mono >= self.seen_at + current.duration_s

    def step(self, current: LeaseRecord | None, mono: float, wall: datetime) -> Decision:
        """Note what was read (a changed record restarts its clock) and decide."""
        if current is not None and current.content() != self.seen:
            self.seen, self.seen_at = current.content(), mono
        expired = current is not None and self.expired(current, mono)
        decision = decide(
            current, me=self.me, leading=self.leading, expired=expired, now=wall, timing=self.timing
        )
        if decision.verdict is Verdict.LOST:
            self.leading = False
        return decision

    def wrote(self, decision: Decision, ok: bool, mono: float) -> None:
        """Record the outcome of writing `decision.write` (False: a conflict or an error).

        A failed write leaves a candidate a candidate and a leader a leader until
        its renew deadline passes (`deadline_passed`).
        """
        if not ok or decision.write is None:
            return
        self.leading = True
        self.renewed_at = mono
        self.seen, self.seen_at = decision.write.content(), mono

    def deadline_passed(self, mono: float) -> bool:
        """Whether this leader has gone `renew_deadline_s` without a successful renewal."""
        if not self.leading or self.renewed_at is None:
            return False
        return mono - self.renewed_at >= self.timing.renew_deadline_s

    def released(self, current: LeaseRecord, wall: datetime) -> LeaseRecord | None:
        """The record that hands the Lease back (client-go's release), or None if not mine.

        The holder is cleared and the duration set to 1 s, so a candidate takes it at
        its next attempt; `leaseTransitions` is kept.
        """
        self.leading = False
        if current.holder != self.me:
            return None
        return dataclasses.replace(
            current, holder="", duration_s=1, acquire_time=wall, renew_time=wall
        )
