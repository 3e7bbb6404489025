"""What the workload controllers' Kubernetes ops read alike: nodes, ConfigMaps, Prometheus.

`KubeReads` holds the API client, the operator's watch cache (when there is
one) and the default Prometheus address; `pipeline_ops.KubePipelineOps` and
`variant_ops.KubeVariantOps` extend it with their own reads and writes.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from chronotope.kube import workloads as kw
from chronotope.kube.prometheus import DEFAULT_PROMETHEUS, instant_query
from chronotope.kube.store import OperatorCache

__all__ = ["KubeReads"]


class KubeReads:
    """Nodes (watch cache first), ConfigMaps and a Prometheus instant query."""

    def __init__(
        self,
        api: client.ApiClient,
        cache: OperatorCache | None = None,
        *,
        prometheus: str = DEFAULT_PROMETHEUS,
        timeout_s: float = 3.0,
    ) -> None:
        """Read through `api`; nodes from `cache`; `prometheus` if a spec names none."""
        self.api = api
        self.cache = cache
        self.prometheus = prometheus
        self.timeout_s = timeout_s

    def nodes(self) -> list[dict[str, Any]]:
        """All nodes, from the watch cache when there is one."""
        if self.cache is not None:
            return self.cache.nodes.list()
        return kw.list_nodes(self.api)

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None."""
        return kw.read_config_map(self.api, namespace, name)

    def query_rate(self, address: str | None, query: str) -> float | str:
        """A PromQL instant query's first value, or why it could not be read."""
        return instant_query(address or self.prometheus, query, self.timeout_s)
