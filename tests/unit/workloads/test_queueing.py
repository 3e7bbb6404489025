"""The policy order (priority, deadline, age); the pass that uses it is in test_backfill."""

from __future__ import annotations

from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.queueing import queue_key


def job(
    name: str,
    *,
    priority: int = 0,
    queue: str = "default",
    gpu: str = "H100",
    deadline: str | None = None,
    phase: str = "Waiting",
    created: str = "2030-01-01T00:00:00Z",
    gpus: int = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 1,
        "gpu": {"count": gpus},
        "priority": priority,
        "queue": queue,
        "gpuTypes": [{"name": gpu, "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": gpu, "durationSeconds": 60},
        "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}},
    }
    if deadline:
        spec["utility"] = {"function": "Step", "deadline": deadline}
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "spec": spec,
        "status": {"phase": phase},
    }


def spec_of(j: dict[str, Any]) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate(j["spec"])


def always(_job: object, _spec: TrainingJobSpec) -> bool:
    return True


def test_policy_order_is_priority_then_deadline_then_age() -> None:
    jobs = [
        job("old", created="2030-01-01T00:00:00Z"),
        job("young", created="2030-01-02T00:00:00Z"),
        job("urgent", deadline="2030-01-05T00:00:00Z", created="2030-01-03T00:00:00Z"),
        job("vip", priority=10, created="2030-01-04T00:00:00Z"),
    ]
    assert [j["metadata"]["name"] for j in sorted(jobs, key=queue_key)] == [
        "vip",
        "urgent",
        "old",
        "young",
    ]
