"""Kernel-level simulator of a high-priority inference beside best-effort training (pure).

One GPU, two kernel streams, replayed by `planners.kernel_replay` (the same
replay the co-location decision uses as its estimator, on arrivals of its
own): the high-priority (HP) inference serves Poisson requests FIFO, the
best-effort (BE) training always has its next kernel ready, and overlapping
kernels slow each other by `planners.interference.kernel_slowdown`. The HP
slowdown is the P99 request latency against the same arrivals on a dedicated
GPU; BE progress is the BE work done (in time alone) per unit of time.

Policies:

- `exclusive`: no sharing; the BE job gets its own GPU (2 GPUs per pair);
- `packing`: both on one GPU, no limits (memory and compute percent only,
  the KAI/HAMi way);
- `orion`: Orion's runtime with its fixed threshold and no placement
  decision: the HP kernels on a high-priority stream, and a BE kernel starts
  when no HP request is in service, or when its class differs from the HP
  kernel's and it wants at most the SM threshold (`kernel_replay.orion_gate`);
- `chronotope`: the cluster-level decision for nodes without a kernel-level
  runtime (`best_effort_share`, the code the policy runs by default):
  co-locate with the BE job capped at the MPS percentage the model allows
  under the budget, or not at all (like `exclusive`) when none fits;
- `chronotope-gated`: the cluster-level decision for nodes with an
  Orion-style runtime (`kernel_replay.gated_share`, the code the policy runs
  with `--colocation-runtime gated`): the same runtime, with the BE's MPS
  percent chosen per pair so the predicted HP P99 fits the budget, or not at
  all when no percent fits with the BE doing at least half its work alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from chronotope.planners.interference import (
    DEFAULT,
    Contention,
    KernelTrace,
    best_effort_share,
    parse_kernels,
)
from chronotope.planners.kernel_replay import (
    Estimator,
    OrionThresholds,
    arrivals,
    gated_share,
    orion_gate,
    replay,
)

__all__ = [
    "COLOCATION_POLICIES",
    "ClusterPlacement",
    "OrionThresholds",
    "PairRun",
    "PairSetup",
    "load_profiles",
    "place_cluster",
    "simulate_pair",
]

COLOCATION_POLICIES = ("exclusive", "packing", "orion", "chronotope", "chronotope-gated")


def load_profiles(directory: Path) -> tuple[list[KernelTrace], list[KernelTrace], list[str]]:
    """Orion's profiles in `directory`, in file-name order.

    Returns the HP inference profiles (`*_fwd`), the BE training ones (`*_fb*`)
    and, for each file that could not be used, `name: reason`.
    """
    hps: list[KernelTrace] = []
    bes: list[KernelTrace] = []
    skipped: list[str] = []
    for path in sorted(directory.iterdir()):
        parsed = parse_kernels(path.name, path.read_text())
        if not isinstance(parsed, KernelTrace):
            skipped.append(f"{path.name}: {parsed.message}")
        elif path.name.endswith("_fwd"):
            hps.append(parsed)
        elif "_fb" in path.name:
            bes.append(parsed)
    return hps, bes, skipped


@dataclass(frozen=True)
class PairSetup:
    """The HP load, how many HP requests to serve, the budget and the model."""

    hp_load: float = 0.1
    requests: int = 200
    seed: int = 0
    budget: float = 1.10
    contention: Contention = DEFAULT
    orion: OrionThresholds = field(default_factory=OrionThresholds)

    def estimator(self) -> Estimator:
        """The decision's planning replay at this setup's load (its own seed, never `seed`)."""
        return Estimator(load=self.hp_load, thresholds=self.orion)


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


@functools.lru_cache(maxsize=4096)
def _share_for(
    policy: str, hp: KernelTrace, be: KernelTrace, setup: PairSetup
) -> tuple[int, float] | None:
    """The decision's (MPS percent, predicted slowdown) for a pair, None when it refuses."""
    c = setup.contention
    if policy == "chronotope":
        got = best_effort_share(hp, be, setup.budget, c)
        return got if isinstance(got, tuple) else None
    plan = gated_share(hp, be, setup.budget, c, est=setup.estimator())
    return None if plan is None else (plan.percent, plan.slowdown)


def simulate_pair(policy: str, hp: KernelTrace, be: KernelTrace, setup: PairSetup) -> PairRun:
    """Serve the HP requests beside the BE stream under `policy`; see the module docstring."""
    if policy not in COLOCATION_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(COLOCATION_POLICIES)}")
    c = setup.contention
    arr = arrivals(hp, setup.hp_load, setup.requests, setup.seed)
    alone, _ = replay(hp, None, arr, c, be_cap=c.sms, gate=None)
    dedicated = float(np.percentile(alone, 99))
    mps: int | None = None
    predicted: float | None = None
    latencies, progress, gpus = alone, 1.0, 2  # exclusive, and a refused pair
    if policy == "packing":
        latencies, progress = replay(hp, be, arr, c, be_cap=c.sms, gate=None)
        gpus = 1
    elif policy == "orion":
        gate = orion_gate(setup.orion)
        latencies, progress = replay(hp, be, arr, c, be_cap=c.sms, gate=gate, priority=True)
        gpus = 1
    elif policy.startswith("chronotope") and (share := _share_for(policy, hp, be, setup)):
        mps, predicted = share
        runtime = policy == "chronotope-gated"
        latencies, progress = replay(
            hp,
            be,
            arr,
            c,
            be_cap=c.sms * mps / 100,
            gate=orion_gate(setup.orion) if runtime else None,
            priority=runtime,
        )
        gpus = 1
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
    if not policy.startswith("chronotope"):
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(COLOCATION_POLICIES)}")
    fits: dict[tuple[int, int], float] = {}
    for i, h in enumerate(hps):
        for j, b in enumerate(bes):
            if (share := _share_for(policy, h, b, setup)) is not None:  # memoised
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
