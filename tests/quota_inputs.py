"""The quota reads of the workload controllers' fake ops (pipelines, serving groups).

No Queue by default: quotas are off until a test sets `queue_objs`.
"""

from __future__ import annotations

from typing import Any


def serving_pod(
    name: str, gpu_type: str, *, namespace: str, pipeline: str, gpus: int = 1
) -> dict[str, Any]:
    """A running pod of InferencePipeline `pipeline` (LocalQueue `default`) holding whole GPUs."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"chronotope.dev/pipeline": pipeline, "chronotope.dev/queue": "default"},
        },
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": gpu_type},
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def training_job(
    name: str, namespace: str, gpu_type: str, *, workers: int = 1, gpus: int = 1
) -> dict[str, Any]:
    """A running TrainingJob of `workers` x `gpus` GPUs of `gpu_type` (LocalQueue `default`)."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": "2030-01-01T00:00:00Z",
        },
        "spec": {
            "replicas": workers,
            "gpu": {"count": gpus},
            "gpuTypes": [{"name": gpu_type, "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": gpu_type, "durationSeconds": 3600},
            "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}},
        },
        "status": {"phase": "Running", "plan": {"gpuType": gpu_type, "workers": workers}},
    }


def training_borrows(
    ops: QuotaInputs, policy: str, gpu_type: str, *, workers: int = 1, gpus: int = 1
) -> None:
    """The first Queue (reclaim `policy`) lends to TrainingJob t/big of Queue train.

    Both Queues join cohort ml; train has no quota of `gpu_type` of its own, so
    t/big (`workers` x `gpus` of `gpu_type`, running) borrows all it holds.
    """
    ops.queue_objs[0]["spec"] |= {"cohort": "ml", "reclaim": {"policy": policy}}
    ops.queue_objs.append(
        {
            "metadata": {"name": "train"},
            "spec": {"cohort": "ml", "quotas": [{"gpuType": gpu_type, "gpus": 0}]},
        }
    )
    ops.local_queue_objs.append(
        {"metadata": {"name": "default", "namespace": "t"}, "spec": {"queue": "train"}}
    )
    ops.jobs = [training_job("big", "t", gpu_type, workers=workers, gpus=gpus)]


class QuotaInputs:
    """TrainingJobs, Queues and LocalQueues in memory, as `KubeReads` would read them."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self.queue_objs: list[dict[str, Any]] = []
        self.local_queue_objs: list[dict[str, Any]] = []
        self.namespace_objs: list[dict[str, Any]] = []

    def training_jobs(self) -> list[dict[str, Any]]:
        return self.jobs

    def queues(self) -> list[dict[str, Any]]:
        return self.queue_objs

    def local_queues(self) -> list[dict[str, Any]]:
        return self.local_queue_objs

    def namespaces(self) -> list[dict[str, Any]]:
        return self.namespace_objs
