"""What the workload controllers read from the cluster alike (`kube.reads.KubeReads`).

Each controller's ops Protocol extends these with its own reads and writes, so
the shared reads are declared once, as `KubeReads` implements them once.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["QuotaReads", "Reads", "ServingReads"]


class QuotaReads(Protocol):
    """Nodes and what quota admission reads: TrainingJobs, Queues, LocalQueues, Namespaces."""

    def nodes(self) -> list[dict[str, Any]]:
        """All nodes, as API dicts."""
        ...

    def training_jobs(self) -> list[dict[str, Any]]:
        """All TrainingJobs, as API dicts (what holds and waits for quota)."""
        ...

    def queues(self) -> list[dict[str, Any]]:
        """All Queues (cluster-scoped), as API dicts."""
        ...

    def local_queues(self) -> list[dict[str, Any]]:
        """All LocalQueues, as API dicts."""
        ...

    def namespaces(self) -> list[dict[str, Any]]:
        """All Namespaces (their labels: Queues' namespaceSelector), as API dicts."""
        ...


class ServingReads(Protocol):
    """The serving workloads' objects, which quota admission also reads while they wait."""

    def inference_pipelines(self) -> list[dict[str, Any]]:
        """All InferencePipelines, as API dicts."""
        ...

    def model_variants(self) -> list[dict[str, Any]]:
        """All ModelVariants, as API dicts."""
        ...


class Reads(QuotaReads, Protocol):
    """`QuotaReads`, pods by label, ConfigMaps and Prometheus: all `KubeReads` offers."""

    def pods_matching(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods in `namespace` (all if None) matching the label `selector`."""
        ...

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None."""
        ...

    def query_rate(self, address: str | None, query: str) -> float | str:
        """A Prometheus instant query's first value (a rate, a latency), or why not read."""
        ...
