"""A pod's requests as kube-scheduler's NodeResourcesFit sums them, and what nodes have free.

`k8s.io/component-helpers/resource.PodRequests`: containers add up, sidecars (init
containers with `restartPolicy: Always`) add to them, another init container runs
beside the sidecars started before it, and the pod's `overhead` is added. Before, a
sidecar counted only as an init container running alone and the overhead not at
all, so a node's free CPU looked larger than kube-scheduler's.
"""

from __future__ import annotations

from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy
from chronotope.workloads.capacity import cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import job_rules
from chronotope.workloads.podreq import (
    PodRequestError,
    extra_requests,
    pod_requests,
    pod_resources,
)
from chronotope.workloads.training import Action, decide
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
    # a job only that node's type suits says why it waits (stop 62)
    pinned = _asking({})
    pinned["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    wait = decide(job_spec(pinned), capacity, NOW)
    assert "(1 node(s) have idle GPUs but no pod slot left: Too many pods)" in wait.reason
    # one slot left: its GPUs count
    assert [n.free for n in cluster_capacity(nodes, pods[:1])] == [8, 8]


def _asking(requests: dict[str, str], **job: Any) -> dict[str, Any]:
    """A waiting job (A100 twice as fast as V100) whose worker requests `requests`."""
    container = {"name": "w", "image": "x", "resources": {"limits": requests}}
    out = _job("j", spec={"containers": [container]})
    out["spec"].update(job)
    return out


def _with(n: dict[str, Any], **allocatable: str) -> dict[str, Any]:
    n["status"]["allocatable"].update(allocatable)
    n["status"]["capacity"].update(allocatable)
    return n


def _user(name: str, node_name: str, requests: dict[str, str]) -> dict[str, Any]:
    pod = _pod(name, node_name, {"app": name})
    pod["spec"]["containers"][0]["resources"] = {"limits": requests}
    return pod


def test_every_resource_adds_up_as_cpu_and_memory_do() -> None:
    # extended resources, ephemeral-storage and hugepages follow the same rules (each in
    # its base unit, rounded up); GPUs and CPU/memory are kept apart (`extra_requests`)
    spec = {
        "containers": [
            {"name": "a", "resources": {"limits": {"example.com/nic": "1", "cpu": "1"}}},
            {"name": "b", "resources": {"requests": {"ephemeral-storage": "1Gi"}}},
        ],
        "initContainers": [
            {"name": "i", "resources": {"requests": {"ephemeral-storage": "3Gi"}}},
            {
                "name": "s",
                "restartPolicy": "Always",
                "resources": {"limits": {"hugepages-2Mi": "4Mi"}},
            },
        ],
    }
    asked = pod_requests({"spec": spec})
    assert asked == {
        "cpu": 1000,
        "example.com/nic": 1,
        "ephemeral-storage": 3 << 30,
        "hugepages-2Mi": 4 << 20,
    }
    assert extra_requests(asked) == (
        ("ephemeral-storage", 3 << 30),
        ("example.com/nic", 1),
        ("hugepages-2Mi", 4 << 20),
    )
    assert extra_requests({"nvidia.com/gpu": 1, "memory": 5}) == ()


def test_a_resource_a_node_does_not_list_refuses_it_for_good() -> None:
    # NodeResourcesFit: a node lacking a resource the workers request has none of it
    # ("Insufficient example.com/nic"). Before stop 62 the plan read only CPU, memory and
    # GPUs: the job was planned on the faster A100 and the stuck rule moved it after 45 s
    nodes = [node("a", A100, 8), _with(node("v", V100, 8), **{"example.com/nic": "2"})]
    capacity = cluster_capacity(nodes, [])
    assert [(n.name, n.others) for n in capacity] == [("a", ()), ("v", (("example.com/nic", 2),))]
    got = decide(job_spec(_asking({"example.com/nic": "1"})), capacity, NOW)
    assert got.gpu_type == V100
    wants_three = decide(job_spec(_asking({"example.com/nic": "3"})), capacity, NOW)
    assert wants_three.action is not Action.START
    assert "allocatable example.com/nic below one worker's request (3 example.com/nic)" in (
        wants_three.reason
    )


def test_what_bound_pods_request_of_a_resource_is_not_free() -> None:
    # the V100 node has 2 NICs, a pod there holds one: one worker of a NIC each fits
    nodes = [node("a", A100, 8), _with(node("v", V100, 8), **{"example.com/nic": "2"})]
    capacity = cluster_capacity(nodes, [_user("holder", "v", {"example.com/nic": "1"})])
    assert capacity[1].others_free == (("example.com/nic", 1),)
    two = decide(job_spec(_asking({"example.com/nic": "1"}, replicas=2)), capacity, NOW)
    assert two.action is not Action.START
    assert (
        "1 node(s) have free GPUs but too little free example.com/nic for a worker: "
        "1 example.com/nic" in two.reason
    ), two.reason
    one = job_spec(_asking({"example.com/nic": "1"}))
    assert decide(one, capacity, NOW).gpu_type == V100
    # a start takes the NIC: the next job decided on what is left finds none
    after, placed = take(capacity, V100, 1, 1, rules=job_rules(one))
    assert placed == (("v", (0,)),)
    assert after[1].others_free == (("example.com/nic", 0),)
    assert decide(one, after, NOW).action is not Action.START


def test_ephemeral_storage_is_read_in_bytes_and_said_in_gib() -> None:
    nodes = [
        _with(node("a", A100, 8), **{"ephemeral-storage": "20Gi"}),
        _with(node("v", V100, 8), **{"ephemeral-storage": "100Gi"}),
    ]
    capacity = cluster_capacity(nodes, [_user("big", "a", {"ephemeral-storage": "15Gi"})])
    got = decide(job_spec(_asking({"ephemeral-storage": "10Gi"})), capacity, NOW)
    assert got.gpu_type == V100
    pinned = _asking({"ephemeral-storage": "10Gi"})
    pinned["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    wait = decide(job_spec(pinned), capacity, NOW)
    assert "too little free ephemeral-storage for a worker: 10Gi ephemeral-storage" in (
        wait.reason
    ), wait.reason


def test_a_node_with_fewer_pod_slots_than_free_gpus_holds_that_many_workers() -> None:
    # 8 free GPUs but room for 2 more pods: a gang of 4 one-GPU workers does not fit
    # there (before stop 62 only a full node was cut; the gang's third worker stayed
    # Pending with "Too many pods" until the stuck rule moved it)
    crowded = node("a", A100, 8)
    crowded["status"]["allocatable"]["pods"] = "3"
    nodes = [crowded, node("v", V100, 8)]
    capacity = cluster_capacity(nodes, [_pod("p", "a", {"app": "x"})])
    assert (capacity[0].name, capacity[0].free, capacity[0].pods_free) == ("a", 8, 2)
    gang = job_spec(_asking({}, replicas=4))
    got = decide(gang, capacity, NOW)
    assert got.gpu_type == V100
    pinned = _asking({}, replicas=4)
    pinned["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    wait = decide(job_spec(pinned), capacity, NOW)
    assert "too little free pod slots for its workers (a takes 2 more pod(s))" in wait.reason
    # two workers fit, and take both slots: the node is full after
    pair = job_spec(_asking({}, replicas=2))
    assert decide(pair, capacity, NOW).gpu_type == A100
    after, placed = take(
        capacity, A100, 2, 1, strategy=PlacementStrategy.PACK, rules=job_rules(pair)
    )
    assert [p[0] for p in placed] == ["a", "a"]
    assert after[0].pods_free == 0
    assert decide(job_spec(_asking({})), after, NOW).gpu_type == V100
