"""A pipeline planned within its queue's quota and on the GPUs free now (`plan_pipeline`).

Three GPU types, X cheapest, Z dearest; one stage that meets its SLO on any of them.
The quota and the free GPUs each rule types out; the plan takes the cheapest type
both leave, as Kueue's default flavour fungibility tries the next flavour before
preempting; when none is left, the plan within the quota alone (its queue may
reclaim lent GPUs for it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec
from chronotope.workloads.capacity import FreeGpus
from chronotope.workloads.pipeline import (
    WITHIN_FREE,
    WITHIN_QUOTA,
    WITHIN_QUOTA_AND_FREE,
    PipelinePlan,
    plan_pipeline,
)

TYPES = ("X", "Y", "Z")
ARRIVALS = [i * 0.02 for i in range(1500)]  # 50 queries/s


def _spec() -> InferencePipelineSpec:
    profile = [{"batchSize": 1, "latencyMs": 10, "throughputQPS": 100}]
    return InferencePipelineSpec.model_validate(
        {
            "stages": [
                {
                    "name": "s",
                    "model": {"image": "registry.example/m:1"},
                    "profiles": [{"gpuType": t, "batches": profile} for t in TYPES],
                }
            ],
            "slo": {"p99LatencyMs": 100},
            "traffic": {"trace": {"configMap": "c", "key": "k"}},
            "costs": [{"gpuType": t, "perHour": k + 1.0} for k, t in enumerate(TYPES)],
        }
    )


class _Room:
    """A queue that admits `admits` whole GPUs of each type now (its pool is the type)."""

    queue = "q"

    def __init__(self, admits: Mapping[str, int]) -> None:
        self.admits = admits

    def holds(
        self, gpu_type: str, limits: Mapping[str, str], annotations: Mapping[str, str]
    ) -> bool:
        return True

    def pod_quota(
        self, gpu_type: str, limits: Mapping[str, str], annotations: Mapping[str, str]
    ) -> tuple[Any, int] | None:
        return gpu_type, 1

    def excess(self, usage: Mapping[Any, int]) -> float:
        return float(sum(max(0, n - self.admits.get(p, 0)) for p, n in usage.items()))

    def rows(self) -> list[dict[str, Any]]:
        return []


def _plan(room: _Room | None, free: Mapping[str, tuple[int, ...]] | None) -> PipelinePlan:
    whole = None if free is None else {t: FreeGpus(f) for t, f in free.items()}
    plan = plan_pipeline(_spec(), ARRIVALS, set(TYPES), room, whole)
    assert isinstance(plan, PipelinePlan), plan
    return plan


def _where(plan: PipelinePlan) -> str:
    return plan.outcome.config[0].gpu_type


ALL_FREE = {t: (8,) for t in TYPES}


def test_the_plan_takes_the_cheapest_type_both_the_quota_and_the_free_gpus_leave() -> None:
    assert (_where(own := _plan(None, None)), own.reason) == ("X", "Planned")
    everything = _Room({t: 8 for t in TYPES})
    assert _plan(everything, ALL_FREE).reason == "Planned"
    # the quota admits no X now: cut to Y, whose GPUs are free
    no_x = _Room({"Y": 8, "Z": 8})
    cut = _plan(no_x, ALL_FREE)
    assert (_where(cut), cut.reason) == ("Y", WITHIN_QUOTA)
    # X's GPUs are held by other work, the quota admits X: moved to Y (before stop 56 a
    # pipeline in a queue was planned on X, and its pods waited for X's GPUs)
    busy_x = {"X": (0,), "Y": (8,), "Z": (8,)}
    moved = _plan(everything, busy_x)
    assert (_where(moved), moved.reason) == ("Y", WITHIN_FREE)
    # the quota rules out X and Y has no free GPU: Z, cut and moved, and it says both
    busy_y = {"X": (8,), "Y": (0,), "Z": (8,)}
    both = _plan(no_x, busy_y)
    assert (_where(both), both.reason) == ("Z", WITHIN_QUOTA_AND_FREE)
    assert "cut to fit what its queue's quota admits now, and moved to the GPUs free" in both.note
    # nothing the quota admits is free: the plan within the quota alone (its queue may
    # reclaim what it lent), its pods wait for Y's GPUs
    only_y = _Room({"Y": 8})
    waits = _plan(only_y, busy_y)
    assert (_where(waits), waits.reason) == ("Y", WITHIN_QUOTA)
