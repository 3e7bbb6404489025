"""Kernel-level simulator of a high-priority inference beside best-effort training (pure).

One GPU, two kernel streams: the high-priority (HP) inference serves
requests FIFO as they arrive (Poisson, seeded, at a given share of the GPU's
time when alone), each request one pass over its `*_fwd` kernels; the
best-effort (BE) training always has its next `*_fb*` kernel ready. While two
kernels overlap, each runs at the rate `planners.interference.kernel_slowdown`
gives (a fluid model: the time to the next kernel boundary is computed, both
streams advance, and the rates are re-evaluated); a BE kernel under an MPS
active thread percentage also runs stretched when it wants more SMs than
that share. The HP slowdown is the P99 request latency against the same
arrivals on a dedicated GPU; BE progress is the BE work done (in time alone)
per unit of time.

Policies:

- `exclusive`: no sharing; the BE job gets its own GPU (2 GPUs per pair);
- `packing`: both on one GPU, no limits (memory and compute percent only,
  the KAI/HAMi way);
- `orion`: Orion's kernel admission (eth-easl/orion
  `src/scheduler/scheduler_eval.cpp`): a BE kernel starts when no HP request
  is in service, or when its class differs from the HP kernel's (an unknown
  class on either side counts as different), the SMs both want fit the
  threshold (80, the V100's SMs, with inference as HP) and the BE work in
  flight stays under the duration threshold (the artifact's 160 us for
  ResNet50, about 2.5 % of the HP request; here one BE kernel is in flight);
- `chronotope`: the cluster-level decision (`best_effort_share`, the code
  the policy runs): co-locate with the BE job capped at the MPS percentage
  the model allows under the budget, or not at all (like `exclusive`) when
  none fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from chronotope.planners.interference import (
    DEFAULT,
    Contention,
    Kernel,
    KernelKind,
    KernelTrace,
    best_effort_share,
    kernel_slowdown,
)

__all__ = [
    "COLOCATION_POLICIES",
    "ClusterPlacement",
    "OrionThresholds",
    "PairRun",
    "PairSetup",
    "place_cluster",
    "simulate_pair",
]

COLOCATION_POLICIES = ("exclusive", "packing", "orion", "chronotope")


@dataclass(frozen=True)
class OrionThresholds:
    """Orion's admission thresholds for a BE kernel."""

    sm_threshold: int = 80
    """A BE kernel may want at most this many SMs (the GPU's SMs by default)."""
    duration_share: float = 0.025
    """A BE kernel may last at most this share of the HP request's time alone."""


@dataclass(frozen=True)
class PairSetup:
    """The HP load, how many HP requests to serve, the budget and the model."""

    hp_load: float = 0.1
    requests: int = 200
    seed: int = 0
    budget: float = 1.10
    contention: Contention = DEFAULT
    orion: OrionThresholds = OrionThresholds()


@dataclass(frozen=True)
class PairRun:
    """One policy on one (HP, BE) pair."""

    policy: str
    hp: str
    be: str
    hp_p99_ms: float
    dedicated_p99_ms: float
    hp_p99_slowdown: float
    be_progress: float
    """BE work done per unit of time, relative to running alone."""
    gpus: int
    mps_percent: int | None
    predicted_slowdown: float | None = None

    @property
    def be_throughput_norm(self) -> float:
        """BE work per GPU used, relative to running alone on one GPU."""
        return self.be_progress / self.gpus


Gate = Callable[[Kernel, Kernel | None, bool], bool]
"""(BE kernel, HP kernel running or None, HP request in service) -> may the BE kernel start."""


def _orion_gate(hp: KernelTrace, th: OrionThresholds) -> Gate:
    limit = th.duration_share * hp.total_ns

    def gate(be: Kernel, hp_kernel: Kernel | None, busy: bool) -> bool:
        if not busy or hp_kernel is None:
            return True
        unknown = KernelKind.UNKNOWN in (be.kind, hp_kernel.kind)
        compatible = unknown or be.kind is not hp_kernel.kind
        fits = min(be.sm, th.sm_threshold) + min(hp_kernel.sm, th.sm_threshold) <= th.sm_threshold
        return compatible and fits and be.duration_ns < limit

    return gate


def _arrivals(hp: KernelTrace, setup: PairSetup) -> np.ndarray:
    rng = np.random.default_rng(setup.seed)
    mean_gap = hp.total_ns / max(setup.hp_load, 1e-9)
    return np.cumsum(rng.exponential(mean_gap, size=setup.requests))


EPS_NS = 1e-6
"""Remaining work below this (ns) is done."""


@dataclass
class _Pair:
    """The two streams' state during a replay (see `_replay`)."""

    hp: tuple[Kernel, ...]
    be: tuple[Kernel, ...]
    c: Contention
    be_cap: float
    gate: Gate | None
    t: float = 0.0
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
        """Slowdowns of the HP and BE kernels running now."""
        if b is None:
            return 1.0, 1.0
        want = min(b.sm, self.c.sms)
        s_b = max(1.0, want / max(1.0, min(want, self.be_cap)))  # a capped BE kernel alone
        if h is None:
            return 1.0, s_b
        cap_sm = min(b.sm, self.be_cap)
        s_h = kernel_slowdown(h.kind, h.sm, b.kind, cap_sm, self.c)
        return s_h, max(s_b, kernel_slowdown(b.kind, cap_sm, h.kind, h.sm, self.c))

    def be_step(self, dt: float, s_b: float) -> None:
        done = dt / s_b
        self.b_rem -= done
        self.be_work += done
        if self.b_rem <= EPS_NS:
            self.bj = (self.bj + 1) % len(self.be)
            self.b_rem = self.be[self.bj].duration_ns
            self.b_on = self.gate is None

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
        if self.gate is not None and self.be and not self.b_on:
            self.b_on = self.gate(self.be[self.bj], self.hp_kernel(), self.req_start >= 0)
        return latency


def _replay(
    hp: KernelTrace,
    be: KernelTrace | None,
    arrivals: Sequence[float],
    c: Contention,
    *,
    be_cap: float,
    gate: Gate | None,
) -> tuple[list[float], float]:
    """HP request latencies (ns) and BE progress (work alone per unit of time)."""
    st = _Pair(hp.kernels, be.kernels if be is not None else (), c, be_cap, gate)
    if st.be:
        st.b_rem, st.b_on = st.be[0].duration_ns, True
    n, nxt = len(arrivals), 0
    latencies: list[float] = []
    while len(latencies) < n:
        if st.req_start < 0 and nxt < n and arrivals[nxt] <= st.t:
            st.req_start, st.hi, st.h_rem = float(arrivals[nxt]), 0, st.hp[0].duration_ns
            nxt += 1
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
        if not math.isfinite(dt):
            break
        st.t += dt
        if b is not None:
            st.be_step(dt, s_b)
        if h is not None and (latency := st.hp_step(dt, s_h)) is not None:
            latencies.append(latency)
    return latencies, (st.be_work / st.t if st.t > 0 and st.be else 0.0)


def simulate_pair(policy: str, hp: KernelTrace, be: KernelTrace, setup: PairSetup) -> PairRun:
    """Serve the HP requests beside the BE stream under `policy`; see the module docstring."""
    c = setup.contention
    arrivals = [float(x) for x in _arrivals(hp, setup)]
    alone, _ = _replay(hp, None, arrivals, c, be_cap=c.sms, gate=None)
    dedicated = float(np.percentile(alone, 99))
    mps: int | None = None
    predicted: float | None = None
    if policy == "exclusive":
        latencies, progress, gpus = alone, 1.0, 2
    elif policy == "packing":
        latencies, progress = _replay(hp, be, arrivals, c, be_cap=c.sms, gate=None)
        gpus = 1
    elif policy == "orion":
        latencies, progress = _replay(
            hp, be, arrivals, c, be_cap=c.sms, gate=_orion_gate(hp, setup.orion)
        )
        gpus = 1
    elif policy == "chronotope":
        share = best_effort_share(hp, be, setup.budget, c)
        if isinstance(share, tuple):
            mps, predicted = share
            latencies, progress = _replay(hp, be, arrivals, c, be_cap=c.sms * mps / 100, gate=None)
            gpus = 1
        else:
            latencies, progress, gpus = alone, 1.0, 2
    else:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(COLOCATION_POLICIES)}")
    p99 = float(np.percentile(latencies, 99))
    return PairRun(
        policy,
        hp.name,
        be.name,
        round(p99 / 1e6, 3),
        round(dedicated / 1e6, 3),
        round(p99 / dedicated, 4),
        round(progress, 4),
        gpus,
        mps,
        round(predicted, 4) if predicted is not None else None,
    )


@dataclass(frozen=True)
class ClusterPlacement:
    """The cluster scenario: how many GPUs a policy uses for the pods, and its pairs."""

    policy: str
    gpus: int
    pairs: tuple[tuple[str, str], ...]


def place_cluster(
    policy: str, hps: Sequence[KernelTrace], bes: Sequence[KernelTrace], setup: PairSetup
) -> ClusterPlacement:
    """GPUs used for HP inference pods `hps` and BE training pods `bes` under `policy`.

    `exclusive`: one GPU per pod. `packing`: two pods per GPU in arrival order
    (HP first), whatever they are, as memory and compute percent allow.
    `orion`: one HP per GPU (its runtime serves one HP client), each with a BE
    beside it while there are any. `chronotope`: the most sensitive HP first
    (the highest best predicted slowdown), each with the BE of the lowest
    predicted slowdown whose MPS share fits the budget; the rest alone.
    """
    if policy == "exclusive":
        return ClusterPlacement(policy, len(hps) + len(bes), ())
    if policy == "packing":
        pods = [*hps, *bes]
        pairs = tuple((pods[i].name, pods[i + 1].name) for i in range(0, len(pods) - 1, 2))
        return ClusterPlacement(policy, math.ceil(len(pods) / 2), pairs)
    if policy == "orion":
        pairs = tuple((h.name, b.name) for h, b in zip(hps, bes, strict=False))
        return ClusterPlacement(policy, max(len(hps), len(bes)), pairs)
    if policy != "chronotope":
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(COLOCATION_POLICIES)}")
    c = setup.contention
    fits: dict[tuple[int, int], float] = {}
    for i, h in enumerate(hps):
        for j, b in enumerate(bes):
            share = best_effort_share(h, b, setup.budget, c)
            if isinstance(share, tuple):
                fits[(i, j)] = share[1]
    order = sorted(
        range(len(hps)), key=lambda i: -min((v for (a, _), v in fits.items() if a == i), default=9)
    )
    taken: set[int] = set()
    chosen: list[tuple[str, str]] = []
    for i in order:
        options = [(v, j) for (a, j), v in fits.items() if a == i and j not in taken]
        if options:
            _, j = min(options)
            taken.add(j)
            chosen.append((hps[i].name, bes[j].name))
    return ClusterPlacement(policy, len(hps) + len(bes) - len(chosen), tuple(chosen))
