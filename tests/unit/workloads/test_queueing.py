"""Within a queue, jobs start in policy order (priority, deadline, age), with backfilling."""

from __future__ import annotations

from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.queueing import blocking_job, queue_key


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


def test_a_startable_job_ahead_blocks_the_one_behind() -> None:
    me, ahead = job("me"), job("ahead", priority=5)
    assert blocking_job(me, spec_of(me), [me, ahead], always) == "ns/ahead"


def test_backfill_when_the_job_ahead_cannot_start() -> None:
    me, ahead = job("me"), job("big", priority=5, gpus=8)
    assert blocking_job(me, spec_of(me), [me, ahead], lambda _job, s: s.gpu.count == 1) is None


def test_other_queues_running_jobs_and_other_gpu_types_do_not_block() -> None:
    me = job("me")
    others = [
        job("other-queue", priority=5, queue="research"),
        job("running", priority=5, phase="Running"),
        job("other-type", priority=5, gpu="T4"),
        job("behind", priority=-1),
    ]
    assert blocking_job(me, spec_of(me), [me, *others], always) is None
