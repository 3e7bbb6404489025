"""The operator decides a job once per critical section (queue, fleet and joint gates share it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.controllers.trainingjob import ClusterOps, _decide
from chronotope.workloads.capacity import NodeCapacity

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SPEC = TrainingJobSpec.model_validate(
    {
        "replicas": 2,
        "gpu": {"count": 4},
        "gpuTypes": [{"name": "H100", "relativeSpeed": 2.0}],
        "estimate": {"referenceGpuType": "H100", "durationSeconds": 7200},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
)


def _capacity() -> list[NodeCapacity]:
    return [NodeCapacity(f"h-{i}", "H100", 8, 8, True) for i in range(2)]


def test_one_critical_section_decides_a_job_once() -> None:
    ops = ClusterOps(api=None)
    cap: list[Any] = _capacity()
    first, again = _decide(ops, "ns", SPEC, cap, NOW), _decide(ops, "ns", SPEC, cap, NOW)
    assert first == again and first is not again  # no memo outside the section
    with ops.memo_decisions():
        assert ops.decide_lock.locked()
        a = _decide(ops, "ns", SPEC, cap, NOW)
        assert _decide(ops, "ns", SPEC, cap, NOW) is a
        assert a == first
        # another capacity (even with equal content), another amount of work left,
        # another namespace or spec: decided afresh
        assert _decide(ops, "ns", SPEC, _capacity(), NOW) is not a
        assert _decide(ops, "ns", SPEC, cap, NOW, remaining=0.5) is not a
        assert _decide(ops, "other", SPEC, cap, NOW) is not a
        assert _decide(ops, "ns", SPEC.model_copy(update={"replicas": 1}), cap, NOW) is not a
    assert ops.decisions is None and not ops.decide_lock.locked()
