"""A pod's CPU and memory requests as kube-scheduler's NodeResourcesFit sums them.

`k8s.io/component-helpers/resource.PodRequests`: containers add up, sidecars (init
containers with `restartPolicy: Always`) add to them, another init container runs
beside the sidecars started before it, and the pod's `overhead` is added. Before, a
sidecar counted only as an init container running alone and the overhead not at
all, so a node's free CPU looked larger than kube-scheduler's.
"""

from __future__ import annotations

from typing import Any

import pytest

from chronotope.workloads.capacity import cluster_capacity
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.podreq import PodRequestError, pod_resources
from chronotope.workloads.training import decide
from tests.unit.workloads.test_backfill import node
from tests.unit.workloads.test_node_fit import A100, NOW, V100
from tests.unit.workloads.test_pod_anti_affinity import _job, _pod


def _c(cpu: str, memory: str = "0", **extra: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


@pytest.mark.parametrize(
    ("spec", "cpu", "memory"),
    [
        ({"containers": [_c("1", "1Gi"), _c("500m", "512Mi")]}, 1500, 1536),
        # an init container runs alone: the larger of it and the containers
        ({"containers": [_c("1")], "initContainers": [_c("3")]}, 3000, 0),
        # a sidecar runs with the containers; the init container after it beside it
        (
            {
                "containers": [_c("1")],
                "initContainers": [_c("250m", restartPolicy="Always"), _c("2")],
            },
            2250,
            0,
        ),
        ({"containers": [_c("1")], "initContainers": [_c("1", restartPolicy="Always")]}, 2000, 0),
        # the pod's overhead (its RuntimeClass's) on top
        (
            {"containers": [_c("1", "1Gi")], "overhead": {"cpu": "250m", "memory": "160Mi"}},
            1250,
            1184,
        ),
    ],
)
def test_requests_add_up_as_kube_scheduler_adds_them(
    spec: dict[str, Any], cpu: int, memory: int
) -> None:
    assert pod_resources({"spec": spec}) == (cpu, memory)


def test_a_malformed_quantity_names_where_it_is() -> None:
    with pytest.raises(PodRequestError, match=r"initContainers\[c\]\.resources"):
        pod_resources({"spec": {"initContainers": [_c("lots")]}})
    with pytest.raises(PodRequestError, match="overhead"):
        pod_resources({"spec": {"overhead": {"cpu": "lots"}}})


def test_a_node_whose_pod_capacity_is_used_up_holds_no_worker() -> None:
    # NodeResourcesFit also counts pods: a node running its allocatable `pods` admits
    # no more ("Too many pods"). Before stop 61 the plan counted its free GPUs, and a
    # gang planned there waited for the stuck rule
    full = node("a", A100, 8)
    full["status"]["allocatable"]["pods"] = "2"
    nodes = [full, node("v", V100, 8)]
    pods = [_pod("p", "a", {"app": "x"}), _pod("q", "a", {"app": "y"})]
    capacity = cluster_capacity(nodes, pods)
    assert sorted((n.name, n.free) for n in capacity) == [("a", 0), ("v", 8)]
    assert decide(job_spec(_job("j")), capacity, NOW).gpu_type == V100
    # one slot left: its GPUs count
    assert [n.free for n in cluster_capacity(nodes, pods[:1])] == [8, 8]
