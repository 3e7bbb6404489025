"""The quota reads of the workload controllers' fake ops (pipelines, serving groups).

No Queue by default: quotas are off until a test sets `queue_objs`.
"""

from __future__ import annotations

from typing import Any


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
