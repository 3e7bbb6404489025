"""Kernel streams that stand for a declared profile in co-location tests (`Colocation.trace`).

Shared by the solver's and the extender's co-location tests, so both test the
rules on the same streams.
"""

from __future__ import annotations

from chronotope.api.v1alpha1.common import WorkloadProfile
from chronotope.planners.interference import Kernel, KernelKind, KernelTrace

_KIND = {
    WorkloadProfile.COMPUTE_BOUND: KernelKind.COMPUTE,
    WorkloadProfile.MEMORY_BOUND: KernelKind.MEMORY,
}


def greedy(profile: WorkloadProfile) -> KernelTrace:
    """A stream whose kernels want every SM: the MPS cap of its co-runner decides."""
    return KernelTrace(profile.value, (Kernel(_KIND.get(profile, KernelKind.UNKNOWN), 80, 1000.0),))


def long_request(profile: WorkloadProfile) -> KernelTrace:
    """Compute-bound: High requests of 20 full-GPU kernels; others: one kernel as long as one.

    A static MPS cap cannot keep such a request within 1.10x beside a full-GPU
    best-effort kernel; an Orion-style runtime, which holds best-effort
    kernels back while a request is served, can.
    """
    kind = _KIND.get(profile, KernelKind.UNKNOWN)
    if profile is WorkloadProfile.COMPUTE_BOUND:
        return KernelTrace("hp", (Kernel(kind, 80, 1000.0),) * 20)
    return KernelTrace("be", (Kernel(kind, 80, 1000.0),))
