"""Cluster specs: the YAML that describes a local cluster's simulated GPU nodes.

Pure: a spec goes in, Node manifests (plain dicts) come out. The same spec
format describes the small demo cluster and the 1,213-node openb cluster, so
tests, demos and benchmarks all build nodes the same way.

Format (see docs/cluster-spec.md)::

    kind: ClusterSpec
    name: demo
    pools:
      - name: a100
        count: 2
        gpu: {model: A100-SXM4-80GB, perNode: 8, memoryMiB: 81920}
        cpu: "96"
        memory: 1Ti
        zone: zone-a
        racks: 1              # nodes are spread round-robin over racks
        nvlinkDomainSize: 1   # nodes per NVLink domain (1: each node its own)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chronotope.sharing.labels import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    NVLINK_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
)

__all__ = [
    "GPU_COUNT_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "GPU_RESOURCE",
    "KWOK_ANNOTATION",
    "NVLINK_LABEL",
    "POOL_LABEL",
    "RACK_LABEL",
    "ZONE_LABEL",
    "ClusterSpec",
    "GpuSpec",
    "NodePool",
    "load_spec",
    "node_manifests",
]

POOL_LABEL = "chronotope.dev/pool"
# kwok only manages nodes that carry this annotation (see devcluster.components).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class GpuSpec(BaseModel):
    """The GPUs every node of a pool carries."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    model: str = Field(description="GPU product name, e.g. A100-SXM4-80GB", min_length=1)
    per_node: int = Field(alias="perNode", ge=0, le=64, description="GPUs per node")
    memory_mib: int = Field(alias="memoryMiB", gt=0, description="memory of one GPU in MiB")


class NodePool(BaseModel):
    """A group of identical simulated nodes."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(pattern=_DNS_LABEL, max_length=40)
    count: int = Field(ge=1, le=10_000)
    gpu: GpuSpec | None = None
    cpu: str = Field(default="32", description="CPU capacity as a Kubernetes quantity")
    memory: str = Field(default="256Gi", description="memory capacity as a Kubernetes quantity")
    max_pods: int = Field(default=110, alias="maxPods", ge=1)
    zone: str = Field(default="zone-a", pattern=_DNS_LABEL)
    racks: int = Field(default=1, ge=1, description="nodes are spread round-robin over racks")
    nvlink_domain_size: int = Field(
        default=1, alias="nvlinkDomainSize", ge=1, description="consecutive nodes per NVLink domain"
    )
    labels: dict[str, str] = Field(default_factory=dict)
    names: list[str] | None = Field(
        default=None, description="explicit node names (length == count); default <pool>-NNN"
    )

    @model_validator(mode="after")
    def _names_match_count(self) -> NodePool:
        if self.names is not None and len(self.names) != self.count:
            raise ValueError(
                f"pool {self.name}: {len(self.names)} names given for count {self.count}"
            )
        return self

    def node_names(self) -> list[str]:
        """The pool's node names: `names` when given, else `<pool>-000`, `<pool>-001`, ..."""
        if self.names is not None:
            return list(self.names)
        return [f"{self.name}-{i:03d}" for i in range(self.count)]


class ClusterSpec(BaseModel):
    """A whole simulated cluster."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    kind: Literal["ClusterSpec"] = "ClusterSpec"
    name: str = Field(pattern=_DNS_LABEL)
    pools: list[NodePool] = Field(min_length=1)

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, pools: list[NodePool]) -> list[NodePool]:
        seen: set[str] = set()
        for pool in pools:
            if pool.name in seen:
                raise ValueError(f"duplicate pool name {pool.name!r}")
            seen.add(pool.name)
        return pools

    @model_validator(mode="after")
    def _unique_node_names(self) -> ClusterSpec:
        names = [n for p in self.pools for n in p.node_names()]
        if len(set(names)) != len(names):
            raise ValueError("node names are not unique across pools")
        return self

    @property
    def node_count(self) -> int:
        """Nodes over all pools."""
        return sum(p.count for p in self.pools)

    @property
    def gpu_count(self) -> int:
        """GPUs over all pools."""
        return sum(p.count * (p.gpu.per_node if p.gpu else 0) for p in self.pools)


def load_spec(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster spec; errors name the offending field."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a cluster spec must be a YAML mapping")
    return ClusterSpec.model_validate(data)


def _node_manifest(pool: NodePool, index: int, name: str) -> dict[str, Any]:
    rack = f"{pool.name}-rack-{index % pool.racks}"
    nvlink = (
        name
        if pool.nvlink_domain_size == 1
        else (f"{pool.name}-nvl-{index // pool.nvlink_domain_size}")
    )
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node-role.kubernetes.io/agent": "",
        ZONE_LABEL: pool.zone,
        RACK_LABEL: rack,
        NVLINK_LABEL: nvlink,
        POOL_LABEL: pool.name,
    }
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.max_pods)}
    if pool.gpu is not None and pool.gpu.per_node > 0:
        labels |= {
            GPU_PRODUCT_LABEL: pool.gpu.model,
            GPU_MEMORY_LABEL: str(pool.gpu.memory_mib),
            GPU_COUNT_LABEL: str(pool.gpu.per_node),
            "nvidia.com/gpu.present": "true",
        }
        resources[GPU_RESOURCE] = str(pool.gpu.per_node)
    labels |= pool.labels
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "allocatable": dict(resources),
            "capacity": dict(resources),
            "phase": "Running",
        },
    }


def node_manifests(spec: ClusterSpec) -> list[dict[str, Any]]:
    """Node objects for every node of the spec, in pool order."""
    return [
        _node_manifest(pool, i, name)
        for pool in spec.pools
        for i, name in enumerate(pool.node_names())
    ]
