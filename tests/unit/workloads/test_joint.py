"""Joint CP-SAT arbitration between TrainingJobs that could each start now (TetriSched)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import NodeCapacity
from chronotope.workloads.joint import Contender, arbitrate, options_for
from chronotope.workloads.training import Action, decide

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CLUSTER = [
    NodeCapacity("h100-0", "H100", 8, 8, True, memory_mib=81920),
    NodeCapacity("v100-0", "V100", 8, 8, True, memory_mib=32768),
]


def spec(types: list[tuple[str, float]], **over: Any) -> TrainingJobSpec:
    base: dict[str, Any] = {
        "replicas": 1,
        "gpu": {"count": 8},
        "gpuTypes": [{"name": t, "relativeSpeed": s} for t, s in types],
        "estimate": {"referenceGpuType": types[0][0], "durationSeconds": 3600},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return TrainingJobSpec.model_validate(base | over)


def contender(key: str, s: TrainingJobSpec, capacity: list[NodeCapacity]) -> Contender:
    best = decide(s, capacity, NOW)
    assert best.action is Action.START
    per_type = [best] + [
        decide(s.model_copy(update={"gpu_types": [t]}), capacity, NOW)
        for t in s.gpu_types
        if t.name != best.gpu_type
    ]
    return Contender(key, s, options_for(per_type))


def test_flexible_job_takes_the_slower_type_so_a_deadline_job_gets_the_fast_one() -> None:
    flexible = spec([("H100", 2.0), ("V100", 1.0)])  # alone it would take the H100s
    deadline = (NOW + timedelta(minutes=45)).isoformat()
    urgent = spec([("H100", 2.0)], utility={"function": "Step", "deadline": deadline})
    assert decide(flexible, CLUSTER, NOW).gpu_type == "H100"
    both = [contender("ns/flexible", flexible, CLUSTER), contender("ns/urgent", urgent, CLUSTER)]
    a = arbitrate("ns/flexible", both, CLUSTER, NOW)
    b = arbitrate("ns/urgent", both, CLUSTER, NOW)
    assert (a.starts, a.gpu_type) == (True, "V100")
    assert (b.starts, b.gpu_type) == (True, "H100")
    assert "beside ns/urgent" in a.reason
    # the plan's node and GPUs for each member reach the outcome (then the worker pods)
    assert a.placements == (("v100-0", tuple(range(8))),)
    assert b.placements == (("h100-0", tuple(range(8))),)


def test_the_plan_uses_the_real_free_gpus() -> None:
    half = [NodeCapacity("h100-0", "H100", 8, 4, True, free_gpus=(1, 3, 5, 7))]
    s = spec([("H100", 1.0)], gpu={"count": 2})  # two jobs of 2 GPUs on the 4 free ones
    both = [contender("ns/a", s, half), contender("ns/b", s, half)]
    a, b = arbitrate("ns/a", both, half, NOW), arbitrate("ns/b", both, half, NOW)
    assert a.starts
    assert b.starts
    gpus = [g for outcome in (a, b) for _, held in outcome.placements for g in held]
    assert sorted(gpus) == [1, 3, 5, 7]


def test_the_more_valuable_job_wins_when_only_one_fits() -> None:
    only_h100 = CLUSTER[:1]
    low = spec([("H100", 1.0)])
    high = spec([("H100", 1.0)], utility={"function": "Constant", "value": 5})
    both = [contender("ns/low", low, only_h100), contender("ns/high", high, only_h100)]
    lost = arbitrate("ns/low", both, only_h100, NOW)
    won = arbitrate("ns/high", both, only_h100, NOW)
    assert not lost.starts
    assert "gives the GPUs to ns/high" in lost.reason
    assert won.starts
    assert won.gpu_type == "H100"


def test_without_deadlines_each_job_gets_its_faster_type_when_both_fit() -> None:
    two = [
        NodeCapacity("h100-0", "H100", 8, 8, True),
        NodeCapacity("v100-0", "V100", 8, 8, True),
    ]
    h_fast = spec([("H100", 2.0), ("V100", 1.0)])
    v_fast = spec([("H100", 1.0), ("V100", 3.0)])
    both = [contender("ns/h", h_fast, two), contender("ns/v", v_fast, two)]
    assert arbitrate("ns/h", both, two, NOW).gpu_type == "H100"
    assert arbitrate("ns/v", both, two, NOW).gpu_type == "V100"
