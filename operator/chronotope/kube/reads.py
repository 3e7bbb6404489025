"""What the workload controllers' Kubernetes ops read alike (watch cache first).

Nodes, pods, TrainingJobs, InferencePipelines, ModelVariants, Queues and
LocalQueues, ConfigMaps, Prometheus.

`KubeReads` holds the API client, the operator's watch cache (when there is
one) and the default Prometheus address; `trainingjob_ops.KubeClusterOps`,
`pipeline_ops.KubePipelineOps` and `variant_ops.KubeVariantOps` extend it with
their own reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client

from chronotope.kube import workloads as kw
from chronotope.kube.prometheus import DEFAULT_PROMETHEUS, instant_query
from chronotope.kube.store import OperatorCache, Store
from chronotope.workloads.node_fit import (
    RuntimeRule,
    VolumeLimits,
    VolumeRule,
    runtime_rules,
    volume_limits,
    volume_rules,
)

__all__ = ["LOCALQUEUES", "MODELVARIANTS", "PIPELINES", "QUEUES", "TRAININGJOBS", "KubeReads"]

TRAININGJOBS = ("chronotope.dev", "v1alpha1", "trainingjobs")
PIPELINES = ("chronotope.dev", "v1alpha1", "inferencepipelines")
MODELVARIANTS = ("chronotope.dev", "v1alpha1", "modelvariants")
QUEUES = ("chronotope.dev", "v1alpha1", "queues")
LOCALQUEUES = ("chronotope.dev", "v1alpha1", "localqueues")


class KubeReads:
    """Nodes, pods and the queueing objects (watch cache first), ConfigMaps, Prometheus."""

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
        self._volume_rules: tuple[tuple[int, ...], dict[str, VolumeRule]] | None = None
        """`volume_rules` as last worked out, and the stores' `changes` then."""
        self._volume_limits: tuple[tuple[int, ...], VolumeLimits] | None = None
        """`volume_limits` likewise."""

    def nodes(self) -> list[dict[str, Any]]:
        """All nodes, from the watch cache when there is one."""
        if self.cache is not None:
            return self.cache.nodes.list()
        return kw.list_nodes(self.api)

    def pods_matching(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """The pods in `namespace` (all namespaces if None) matching the label `selector`."""
        if self.cache is not None:
            return self.cache.pods.list(namespace, selector)
        return kw.list_pods(self.api, namespace, selector)

    def training_jobs(self) -> list[dict[str, Any]]:
        """All TrainingJobs, as API dicts."""
        return self._custom(lambda cache: cache.training_jobs, TRAININGJOBS)

    def inference_pipelines(self) -> list[dict[str, Any]]:
        """All InferencePipelines, as API dicts."""
        return self._custom(lambda cache: cache.pipelines, PIPELINES)

    def model_variants(self) -> list[dict[str, Any]]:
        """All ModelVariants, as API dicts."""
        return self._custom(lambda cache: cache.variants, MODELVARIANTS)

    def queues(self) -> list[dict[str, Any]]:
        """All Queues (cluster-scoped), as API dicts."""
        return self._custom(lambda cache: cache.queues, QUEUES)

    def local_queues(self) -> list[dict[str, Any]]:
        """All LocalQueues, as API dicts."""
        return self._custom(lambda cache: cache.local_queues, LOCALQUEUES)

    def namespaces(self) -> list[dict[str, Any]]:
        """All Namespaces (their labels: Queues' namespaceSelector), as API dicts."""
        if self.cache is not None:
            return self.cache.namespaces.list()
        return kw.list_namespaces(self.api)

    def volume_rules(self) -> dict[str, VolumeRule]:
        """Where each PersistentVolumeClaim may be used (`node_fit.volume_rules`)."""
        cache = self.cache
        if cache is not None:
            stores = (
                cache.claims,
                cache.volumes,
                cache.storage_classes,
                cache.csi_drivers,
                cache.csi_capacities,
            )
            seen = tuple(s.changes for s in stores)  # read before the lists: never stale
            kept = self._volume_rules
            if kept is not None and kept[0] == seen:
                return kept[1]
            rules = volume_rules(*(s.list() for s in stores))
            self._volume_rules = (seen, rules)
            return rules
        api = self.api
        return volume_rules(
            kw.list_claims(api),
            kw.list_volumes(api),
            kw.list_storage_classes(api),
            kw.list_csi_drivers(api),
            kw.list_csi_capacities(api),
        )

    def volume_limits(self) -> VolumeLimits:
        """How many CSI volumes each node may attach (`node_fit.volume_limits`)."""
        cache = self.cache
        if cache is not None:
            stores = (cache.csi_nodes, cache.volume_attachments, cache.volumes)
            seen = tuple(s.changes for s in stores)  # read before the lists: never stale
            kept = self._volume_limits
            if kept is not None and kept[0] == seen:
                return kept[1]
            limits = volume_limits(*(s.list() for s in stores))
            self._volume_limits = (seen, limits)
            return limits
        api = self.api
        return volume_limits(
            kw.list_csi_nodes(api), kw.list_volume_attachments(api), kw.list_volumes(api)
        )

    def runtime_rules(self) -> dict[str, RuntimeRule]:
        """What each RuntimeClass adds to its pods (`node_fit.runtime_rules`)."""
        if self.cache is not None:
            return runtime_rules(self.cache.runtime_classes.list())
        return runtime_rules(kw.list_runtime_classes(self.api))

    def _custom(
        self, store: Callable[[OperatorCache], Store], resource: tuple[str, str, str]
    ) -> list[dict[str, Any]]:
        """Every object of custom `resource` (group, version, plural): its `store` first."""
        if self.cache is not None:
            return store(self.cache).list()
        return kw.list_custom(self.api, *resource)

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None."""
        return kw.read_config_map(self.api, namespace, name)

    def query_rate(self, address: str | None, query: str) -> float | str:
        """A PromQL instant query's first value, or why it could not be read."""
        return instant_query(address or self.prometheus, query, self.timeout_s)
