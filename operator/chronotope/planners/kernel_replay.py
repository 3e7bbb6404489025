"""Replay of a high-priority (HP) kernel stream beside a best-effort (BE) one on one GPU (pure).

The HP workload serves requests FIFO as they arrive (Poisson, seeded, at a
given share of the GPU's time when alone), each request one pass over its
kernels; the BE workload always has its next kernel ready. While two kernels
overlap, each runs at the rate `interference.kernel_slowdown` gives (a fluid
model: the time to the next kernel boundary is computed, both streams
advance, and the rates are re-evaluated); a BE kernel under an MPS active
thread percentage also runs stretched when it wants more SMs than that share.
A `Gate` stands for a kernel-level runtime (Orion's): it decides whether the
BE stream's next kernel may start.

This is both the co-location decision's estimator (`gated_slowdown` and
`gated_share`, on planning arrivals of their own) and the simulator's GPU
(`sim.colocation`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from chronotope.planners.interference import (
    Contention,
    Kernel,
    KernelKind,
    KernelTrace,
    kernel_slowdown,
)

__all__ = [
    "EPS_NS",
    "PLAN_SEED",
    "Estimator",
    "Gate",
    "GatedPlan",
    "OrionThresholds",
    "arrivals",
    "gated_share",
    "gated_slowdown",
    "orion_gate",
    "replay",
]


@dataclass(frozen=True)
class OrionThresholds:
    """Orion's admission threshold for a BE kernel while an HP request is in service."""

    sm_threshold: int = 80
    """A BE kernel may want at most this many SMs (`SM_THRESHOLD`: the GPU's SMs, a V100's 80,
    when the HP workload is inference)."""


Gate = Callable[[Kernel, Kernel | None, bool], bool]
"""(BE kernel, HP kernel running or None, HP request in service) -> may the BE kernel start."""


def orion_gate(th: OrionThresholds) -> Gate:
    """Orion's kernel admission (eth-easl/orion `src/scheduler/scheduler_eval.cpp`).

    A BE kernel starts when no HP request is in service, or when it wants at
    most the SM threshold and its class differs from the HP kernel's (an
    unknown class on either side counts as different). Orion's duration
    threshold drains the BE work already launched before more is launched;
    the replay keeps one BE kernel in flight, which is that drain at its
    tightest, so it has no separate term here.
    """

    def gate(be: Kernel, hp_kernel: Kernel | None, busy: bool) -> bool:
        if not busy or hp_kernel is None:
            return True
        unknown = KernelKind.UNKNOWN in (be.kind, hp_kernel.kind)
        compatible = unknown or be.kind is not hp_kernel.kind
        return compatible and be.sm <= th.sm_threshold

    return gate


def arrivals(hp: KernelTrace, load: float, count: int, seed: int) -> list[float]:
    """`count` Poisson arrival times (ns) at which `hp` is busy `load` of the time alone."""
    rng = np.random.default_rng(seed)
    mean_gap = hp.total_ns / max(load, 1e-9)
    return [float(x) for x in np.cumsum(rng.exponential(mean_gap, size=count))]


EPS_NS = 1e-6
"""Remaining work below this (ns) is done."""


@dataclass
class _Pair:
    """The two streams' state during a replay (see `replay`)."""

    hp: tuple[Kernel, ...]
    be: tuple[Kernel, ...]
    c: Contention
    be_cap: float
    gate: Gate | None
    priority: bool = False
    t: float = 0.0
    drain_until: float = -1.0  # the BE blocks resident when an HP kernel started leave by then
    be_held: float = 0.0  # the SMs those blocks hold
    req_start: float = -1.0  # arrival of the request in service; -1 when idle
    hi: int = 0
    h_rem: float = 0.0
    bj: int = 0
    b_rem: float = 0.0
    b_on: bool = False
    be_work: float = 0.0

    def hp_kernel(self) -> Kernel | None:
        return self.hp[self.hi] if self.req_start >= 0 else None

    def rates(self, h: Kernel | None, b: Kernel | None) -> tuple[float, float]:
        """Slowdowns of the HP and BE kernels running now (`math.inf`: the BE kernel waits)."""
        if b is None:
            return 1.0, 1.0
        sms = self.c.sms
        want = min(b.sm, sms)
        s_b = max(1.0, want / max(1.0, min(want, self.be_cap)))  # a capped BE kernel alone
        if h is None:
            return 1.0, s_b
        cap_sm = min(b.sm, self.be_cap)
        if not self.priority:
            s_h = kernel_slowdown(h.kind, h.sm, b.kind, cap_sm, self.c)
            return s_h, max(s_b, kernel_slowdown(b.kind, cap_sm, h.kind, h.sm, self.c))
        # the HP stream's blocks go first: the BE keeps the SMs its resident blocks hold
        # until they finish (the drain), then only what the HP kernel leaves
        bw_h = kernel_slowdown(h.kind, 0, b.kind, 0, self.c)
        bw_b = kernel_slowdown(b.kind, 0, h.kind, 0, self.c)
        hp_sms = min(h.sm, sms)
        if self.t < self.drain_until:
            held = self.be_held
            free = max(1.0, sms - held)
            return max(bw_h, hp_sms / free), max(bw_b, want / max(1.0, held))
        left = min(cap_sm, sms - hp_sms)
        if left <= 0:
            return 1.0, math.inf
        return bw_h, max(want / left, bw_b)

    def hp_kernel_starts(self, previous: Kernel | None = None) -> None:
        """With priority, the BE blocks already resident finish their wave before yielding.

        `previous`: the HP kernel that just ended (None at a request's start,
        when the BE ran alone); the BE holds what that kernel left it.
        """
        if not (self.priority and self.be and self.b_on):
            return
        b = self.be[self.bj]
        sms = self.c.sms
        want = min(b.sm, sms, self.be_cap)
        if previous is None:
            held = want
        elif self.t < self.drain_until:
            held = self.be_held
        else:
            held = max(0.0, min(want, sms - min(previous.sm, sms)))
        if held <= 0:
            return
        stretch = max(1.0, min(b.sm, sms) / held)
        block = b.duration_ns / max(1, -(-b.sm // sms))  # one wave of its blocks alone
        self.be_held = held
        self.drain_until = self.t + min(self.b_rem * stretch, block)

    def be_step(self, dt: float, s_b: float) -> None:
        done = dt / s_b
        self.b_rem -= done
        self.be_work += done
        if self.b_rem <= EPS_NS:
            self.bj = (self.bj + 1) % len(self.be)
            self.b_rem = self.be[self.bj].duration_ns
            self.b_on = self.gate is None
            self.drain_until = -1.0

    def hp_step(self, dt: float, s_h: float) -> float | None:
        """Advance the HP kernel; the request's latency when it finishes."""
        self.h_rem -= dt / s_h
        if self.h_rem > EPS_NS:
            return None
        self.hi += 1
        latency = None
        if self.hi == len(self.hp):
            latency = self.t - self.req_start
            self.req_start = -1.0
        else:
            self.h_rem = self.hp[self.hi].duration_ns
            self.hp_kernel_starts(self.hp[self.hi - 1])
        if self.gate is not None and self.be and not self.b_on:
            self.b_on = self.gate(self.be[self.bj], self.hp_kernel(), self.req_start >= 0)
        return latency


def replay(
    hp: KernelTrace,
    be: KernelTrace | None,
    arrivals: Sequence[float],
    c: Contention,
    *,
    be_cap: float,
    gate: Gate | None,
    priority: bool = False,
) -> tuple[list[float], float]:
    """HP request latencies (ns) and BE progress (work alone per unit of time).

    `priority`: the HP kernels run on a high-priority stream (Orion's runtime
    creates one, `create_streams` in `src/scheduler/utils_sched.cpp`): once
    the BE blocks resident when an HP kernel starts have finished their wave,
    the HP kernel holds the SMs it wants and the BE kernel runs on what is
    left (or waits), each slowed only by the bandwidth term.
    """
    st = _Pair(hp.kernels, be.kernels if be is not None else (), c, be_cap, gate, priority)
    if st.be:
        st.b_rem, st.b_on = st.be[0].duration_ns, True
    n, nxt = len(arrivals), 0
    latencies: list[float] = []
    while len(latencies) < n:
        if st.req_start < 0 and nxt < n and arrivals[nxt] <= st.t:
            st.req_start, st.hi, st.h_rem = float(arrivals[nxt]), 0, st.hp[0].duration_ns
            nxt += 1
            st.hp_kernel_starts()
        h = st.hp_kernel()
        if st.be and not st.b_on and (gate is None or gate(st.be[st.bj], h, h is not None)):
            st.b_on = True
        b = st.be[st.bj] if st.be and st.b_on else None
        s_h, s_b = st.rates(h, b)
        dt = (
            st.h_rem * s_h
            if h is not None
            else float(arrivals[nxt]) - st.t
            if nxt < n
            else math.inf
        )
        if b is not None:
            dt = min(dt, st.b_rem * s_b)
            if h is not None and st.t < st.drain_until:
                dt = min(dt, st.drain_until - st.t)
        if not math.isfinite(dt):
            break
        st.t += dt
        if b is not None:
            st.be_step(dt, s_b)
        if h is not None and (latency := st.hp_step(dt, s_h)) is not None:
            latencies.append(latency)
    return latencies, (st.be_work / st.t if st.t > 0 and st.be else 0.0)


# ---------------------------------------------------------------- the decision's estimator
PLAN_SEED = 7919
"""Seeds the planning arrivals; the simulator evaluates on arrivals of its own seed."""


@dataclass(frozen=True)
class GatedPlan:
    """What `gated_share` chose: the BE share's MPS percent and what the estimator predicts."""

    percent: int
    slowdown: float
    """Predicted HP P99 latency over a dedicated GPU's."""
    progress: float
    """Predicted BE progress (work alone per unit of time)."""


@dataclass(frozen=True)
class Estimator:
    """The planning replay: HP load, requests and windows, seed, the runtime's thresholds."""

    load: float = 0.1
    """The HP's busy share alone (Orion's artifact: ResNet50 bs4 at 15 rps, about 0.1)."""
    requests: int = 1000
    window: int = 100
    """A P99 is taken over this many consecutive requests; the prediction is the worst window's
    (a P99 over 100 requests swings widely, so one long run's P99 says little about it)."""
    seed: int = PLAN_SEED
    thresholds: OrionThresholds = OrionThresholds()
    min_progress: float = 0.5
    """Below this BE progress, a GPU of its own gives the BE more work per GPU than sharing."""


def _baseline(hp: KernelTrace, c: Contention, est: Estimator) -> tuple[list[float], list[float]]:
    """The estimator's planning arrivals and the HP's latencies on them alone."""
    arr = arrivals(hp, est.load, est.requests, est.seed)
    alone, _ = replay(hp, None, arr, c, be_cap=c.sms, gate=None)
    return arr, alone


def _predict(
    hp: KernelTrace,
    be: KernelTrace,
    percent: int,
    c: Contention,
    *,
    est: Estimator,
    baseline: tuple[list[float], list[float]],
) -> tuple[float, float]:
    """`gated_slowdown` on a baseline already replayed (`_baseline`)."""
    arr, alone = baseline
    lat, progress = replay(
        hp,
        be,
        arr,
        c,
        be_cap=c.sms * percent / 100,
        gate=orion_gate(est.thresholds),
        priority=True,
    )
    size = min(est.window, len(lat))
    worst = max(
        float(np.percentile(lat[i : i + size], 99) / np.percentile(alone[i : i + size], 99))
        for i in range(0, len(lat) - size + 1, size)
    )
    return worst, progress


def gated_slowdown(
    hp: KernelTrace,
    be: KernelTrace,
    percent: int,
    c: Contention,
    *,
    est: Estimator = Estimator(),
) -> tuple[float, float]:
    """Predicted (HP P99 slowdown, BE progress) beside `be` under an Orion-style runtime.

    The BE stream runs capped at `percent` of the SMs, its kernels admitted by
    `orion_gate`; the prediction is a replay on the estimator's own arrivals:
    the largest ratio of P99 latencies, beside the BE and alone, over each
    window of `est.window` consecutive requests, and the BE progress.
    """
    return _predict(hp, be, percent, c, est=est, baseline=_baseline(hp, c, est))


def gated_share(
    hp: KernelTrace,
    be: KernelTrace,
    budget: float,
    c: Contention,
    *,
    est: Estimator = Estimator(),
    step: int = 10,
) -> GatedPlan | None:
    """The largest MPS percent for `be` keeping `hp` within `budget` under an Orion-style runtime.

    The runtime gates BE kernels while an HP request is in service; what it
    cannot stop is a BE kernel already running when a request arrives, and a
    lower percent bounds what that kernel takes. Percents from 100 down in
    `step`s are predicted until one fits (the estimate is not monotone in the
    percent, so one over the budget does not end the search); the search
    gives up, with None, at the first percent whose predicted BE progress is
    under `est.min_progress` (progress falls with the percent).
    """
    baseline = _baseline(hp, c, est)  # the same for every percent
    for percent in range(100, 0, -step):
        slowdown, progress = _predict(hp, be, percent, c, est=est, baseline=baseline)
        if progress < est.min_progress:
            return None
        if slowdown <= budget:
            return GatedPlan(percent, slowdown, progress)
    return None
