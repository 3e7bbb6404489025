"""Interference between co-located GPU workloads, from per-kernel profiles (pure).

A workload is a stream of kernels (Orion's profile format:
`Name,Profile,Memory_footprint,SM_usage,Duration`; Profile 1 compute-bound,
0 memory-bound, -1 unknown; SM_usage the SMs a kernel wants; Duration in ns
on the profiling GPU, a V100 with 80 SMs). Two kernels running at once on one
GPU slow each other down by the larger of two terms:

- **SMs:** when the two want more SMs than the GPU has, the block scheduler
  shares them in proportion to what each wants, so each runs at its share:
  slowdown `(sm_a + sm_b) / SMs` (a best-effort kernel under an MPS active
  thread percentage wants at most that share of the SMs);
- **memory and issue bandwidth:** a memory-bound kernel beside another
  memory-bound one gets about half the DRAM bandwidth (`1 + mm`); beside a
  compute-bound one, or a compute-bound one beside a memory-bound one, a
  small loss (`1 + mixed`); two compute-bound kernels that fit in the SMs
  lose `1 + cc` to shared caches and issue slots. Unknown kernels count as
  whichever is worse.

`kernel_slowdown` is that rule; the kernel-level simulator
(`sim.colocation`) applies it to every overlapping pair of kernels.
`predict_slowdown` is its expectation for a high-priority (HP) workload
beside a best-effort (BE) one that always has a kernel ready, weighting each
HP kernel by its time and each BE kernel by its share of the BE stream's
time; `best_effort_share` picks the largest MPS percentage for the BE
workload whose predicted HP slowdown fits a budget. The constants are
calibrated against Orion's published figures (docs/colocation.md).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from enum import IntEnum

from chronotope.solver.model import Reason

__all__ = [
    "Contention",
    "Kernel",
    "KernelKind",
    "KernelTrace",
    "best_effort_share",
    "class_trace",
    "kernel_slowdown",
    "parse_kernels",
    "predict_slowdown",
]


class KernelKind(IntEnum):
    """Orion's profile classes."""

    MEMORY = 0
    COMPUTE = 1
    UNKNOWN = -1


@dataclass(frozen=True)
class Kernel:
    """One kernel: its class, the SMs it wants and its time alone (ns)."""

    kind: KernelKind
    sm: int
    duration_ns: float


@dataclass(frozen=True)
class KernelTrace:
    """A workload's kernel stream (one request, or one training iteration)."""

    name: str
    kernels: tuple[Kernel, ...]

    @property
    def total_ns(self) -> float:
        """Time of the stream alone."""
        return sum(k.duration_ns for k in self.kernels)

    def mix(self, sms: int, buckets: int = 8) -> dict[tuple[KernelKind, int], float]:
        """Time shares by (class, SMs wanted rounded up to `sms / buckets`), for expectations."""
        total = self.total_ns or 1.0
        step = max(1, sms // buckets)
        out: dict[tuple[KernelKind, int], float] = {}
        for k in self.kernels:
            sm = min(sms, max(step, -(-min(k.sm, sms) // step) * step))
            out[(k.kind, sm)] = out.get((k.kind, sm), 0.0) + k.duration_ns / total
        return out


@dataclass(frozen=True)
class Contention:
    """The contention model's constants (docs/colocation.md says how they were set)."""

    sms: int = 80
    """SMs of the GPU the profiles were taken on (V100)."""
    mm: float = 0.7
    """Extra time of a memory-bound kernel beside another memory-bound one."""
    mixed: float = 0.03
    """Extra time of a kernel beside one of the other class."""
    cc: float = 0.05
    """Extra time of a compute-bound kernel beside another compute-bound one."""


DEFAULT = Contention()


def kernel_slowdown(
    a_kind: KernelKind, a_sm: float, b_kind: KernelKind, b_sm: float, c: Contention = DEFAULT
) -> float:
    """How much slower kernel `a` runs while kernel `b` runs beside it (>= 1)."""
    a_sm, b_sm = min(a_sm, c.sms), min(b_sm, c.sms)
    sm_term = max(1.0, (a_sm + b_sm) / c.sms)
    kinds_a = (KernelKind.MEMORY, KernelKind.COMPUTE) if a_kind < 0 else (a_kind,)
    kinds_b = (KernelKind.MEMORY, KernelKind.COMPUTE) if b_kind < 0 else (b_kind,)
    bw = 1.0
    for ka in kinds_a:
        for kb in kinds_b:
            if ka is KernelKind.MEMORY and kb is KernelKind.MEMORY:
                extra = c.mm
            elif ka is KernelKind.COMPUTE and kb is KernelKind.COMPUTE:
                extra = c.cc
            else:
                extra = c.mixed
            bw = max(bw, 1.0 + extra)
    return max(sm_term, bw)


def predict_slowdown(
    hp: KernelTrace, be: KernelTrace, be_sm_share: float = 1.0, c: Contention = DEFAULT
) -> float:
    """Expected slowdown of `hp` beside a BE stream capped at `be_sm_share` of the SMs."""
    cap = max(1.0, be_sm_share * c.sms)
    be_mix = be.mix(c.sms)
    total = 0.0
    for (kind, sm), weight in hp.mix(c.sms).items():
        total += weight * sum(
            w * kernel_slowdown(kind, sm, bk, min(bsm, cap), c) for (bk, bsm), w in be_mix.items()
        )
    return total


def best_effort_share(
    hp: KernelTrace, be: KernelTrace, budget: float, c: Contention = DEFAULT, step: int = 10
) -> tuple[int, float] | Reason:
    """The largest MPS active thread percentage for `be` keeping `hp` within `budget`.

    Returns (percent, predicted slowdown), or why no percentage fits.
    """
    if budget < 1.0:
        return Reason(
            code="ImpossibleBudget",
            message=f"a slowdown budget of {budget:g}x is below 1x: nothing can share a GPU",
            unresolvable=True,
        )
    worst = 0.0
    for percent in range(100, 0, -step):
        predicted = predict_slowdown(hp, be, percent / 100, c)
        worst = worst or predicted
        if predicted <= budget:
            return percent, predicted
    floor = predict_slowdown(hp, be, step / 100, c)
    return Reason(
        code="InterferenceOverBudget",
        message=f"{hp.name} beside {be.name}: predicted high-priority slowdown "
        f"{floor:.2f}x even at {step}% of the SMs ({worst:.2f}x at 100%), "
        f"over the {budget:g}x budget",
    )


def parse_kernels(name: str, text: str) -> KernelTrace | Reason:
    """A kernel trace from Orion's CSV; a reason when it is unreadable or has no timings."""
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
        kernels = tuple(
            Kernel(KernelKind(int(r["Profile"])), int(float(r["SM_usage"])), float(r["Duration"]))
            for r in rows
        )
    except (KeyError, TypeError, ValueError) as exc:
        return Reason(code="ProfileUnreadable", message=f"kernel profile {name}: {exc}")
    known = [k for k in kernels if k.kind is not KernelKind.UNKNOWN]
    if not kernels or sum(k.duration_ns for k in kernels) <= 0 or not known:
        return Reason(
            code="ProfileEmpty",
            message=f"kernel profile {name} has no classified kernels with timings",
        )
    return KernelTrace(name, kernels)


def class_trace(name: str, profile: str, c: Contention = DEFAULT) -> KernelTrace:
    """A stand-in for a workload without kernel profiles, from its declared class.

    ComputeBound: compute-bound kernels only; MemoryBound: memory-bound only;
    anything else: half and half. (A declared class says which resource the
    workload is bound by; mixing in the other class would make two
    compute-bound workloads look better together than complementary ones.)
    Every kernel wants half the GPU's SMs, so two such workloads fill the GPU
    without the SM term deciding, and the class is what the prediction turns on.
    """
    share = {"ComputeBound": 1.0, "MemoryBound": 0.0}.get(profile, 0.5)
    kernels = (
        Kernel(KernelKind.COMPUTE, c.sms // 2, 1000.0 * share),
        Kernel(KernelKind.MEMORY, c.sms // 2, 1000.0 * (1 - share)),
    )
    return KernelTrace(name, tuple(k for k in kernels if k.duration_ns > 0))
