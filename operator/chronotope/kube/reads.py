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
from typing import Any, TypeVar, cast

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

_T = TypeVar("_T")

_LISTS: dict[str, Callable[[client.ApiClient], list[dict[str, Any]]]] = {
    "claims": kw.list_claims,
    "volumes": kw.list_volumes,
    "storage_classes": kw.list_storage_classes,
    "csi_drivers": kw.list_csi_drivers,
    "csi_capacities": kw.list_csi_capacities,
    "csi_nodes": kw.list_csi_nodes,
    "volume_attachments": kw.list_volume_attachments,
}
"""Each watch cache store `KubeReads._from` reads, as the API lists it without a cache."""


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
        self._derived: dict[Callable[..., Any], tuple[tuple[int, ...], Any]] = {}
        """What `_from` last worked out with each function, and its stores' `changes` then."""

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
        return self._from(
            volume_rules,
            ("claims", "volumes", "storage_classes", "csi_drivers", "csi_capacities"),
        )

    def volume_limits(self) -> VolumeLimits:
        """How many CSI volumes each node may attach (`node_fit.volume_limits`)."""
        return self._from(volume_limits, ("csi_nodes", "volume_attachments", "volumes"))

    def _from(self, make: Callable[..., _T], stores: tuple[str, ...]) -> _T:
        """`make` of the lists of the watch cache's `stores` (by name), or of the API's.

        From the cache, worked out again only when one of them changed (every pass
        asks; parsing every claim each time cost 120-135 ms at 10,000).
        """
        cache = self.cache
        if cache is None:
            return make(*(_LISTS[name](self.api) for name in stores))
        held = tuple(getattr(cache, name) for name in stores)
        seen = tuple(s.changes for s in held)  # read before the lists: never stale
        kept = self._derived.get(make)
        if kept is not None and kept[0] == seen:
            return cast("_T", kept[1])
        out = make(*(s.list() for s in held))
        self._derived[make] = (seen, out)
        return out

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
