"""Cluster specs become kwok nodes with GPU capacity, GPU labels and topology labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from chronotope.sim.clusterspec import (
    GPU_RESOURCE,
    KWOK_ANNOTATION,
    NVLINK_LABEL,
    RACK_LABEL,
    ClusterSpec,
    load_spec,
    node_manifests,
)

ROOT = Path(__file__).resolve().parents[3]


def _spec(**pool: object) -> ClusterSpec:
    base = {"name": "p", "count": 4, "gpu": {"model": "A100", "perNode": 8, "memoryMiB": 81920}}
    return ClusterSpec.model_validate({"name": "c", "pools": [base | pool]})


def test_demo_spec_is_heterogeneous() -> None:
    spec = load_spec(ROOT / "manifests/clusters/demo.yaml")
    models = {p.gpu.model for p in spec.pools if p.gpu}
    assert len(models) >= 3
    assert spec.gpu_count == 60


def test_openb_spec_matches_the_trace() -> None:
    spec = load_spec(ROOT / "manifests/clusters/openb.yaml")
    assert spec.node_count == 1213
    assert spec.gpu_count == 6212
    assert "openb-node-0000" in {m["metadata"]["name"] for m in node_manifests(spec)}


def test_nodes_carry_capacity_labels_and_kwok_annotation() -> None:
    nodes = node_manifests(_spec(racks=2, nvlinkDomainSize=2))
    assert [n["metadata"]["name"] for n in nodes] == ["p-000", "p-001", "p-002", "p-003"]
    first = nodes[0]
    assert first["status"]["capacity"][GPU_RESOURCE] == "8"
    assert first["status"]["allocatable"] == first["status"]["capacity"]
    assert first["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"
    labels = first["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "A100"
    assert labels["nvidia.com/gpu.memory"] == "81920"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert [n["metadata"]["labels"][RACK_LABEL] for n in nodes] == [
        "p-rack-0",
        "p-rack-1",
        "p-rack-0",
        "p-rack-1",
    ]
    assert [n["metadata"]["labels"][NVLINK_LABEL] for n in nodes] == [
        "p-nvl-0",
        "p-nvl-0",
        "p-nvl-1",
        "p-nvl-1",
    ]


def test_cpu_only_pool_has_no_gpu_resource() -> None:
    spec = ClusterSpec.model_validate({"name": "c", "pools": [{"name": "cpu", "count": 1}]})
    node = node_manifests(spec)[0]
    assert GPU_RESOURCE not in node["status"]["capacity"]
    assert "nvidia.com/gpu.product" not in node["metadata"]["labels"]


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        ({"count": 0}, "count"),
        ({"name": "Bad_Name"}, "name"),
        ({"gpu": {"model": "A100", "perNode": -1, "memoryMiB": 1}}, "perNode"),
        ({"names": ["a"]}, "names"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_specs_name_the_field(pool: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        _spec(**pool)
    assert field in str(err.value)


def test_duplicate_pools_are_rejected() -> None:
    pool = {"name": "p", "count": 1}
    with pytest.raises(ValidationError, match="duplicate pool"):
        ClusterSpec.model_validate({"name": "c", "pools": [pool, pool]})
