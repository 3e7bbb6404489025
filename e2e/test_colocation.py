"""Interference-aware co-location end to end: kube-scheduler, the extender, the device plugin.

On the local control plane, the real kube-scheduler calls the real extender
(restarted here with an `--interference-budget`) for pods that may only land
on a private one-GPU kwok node, so every choice is forced. A High-priority
compute-bound inference share lands first; a best-effort memory-bound
training share lands beside it with the compute percent the interference
model allows; a second High-priority share is refused on that GPU, and its
FailedScheduling event says why (the rules' reason); once a second node
exists it lands there. The shares on the first node reach the container
through the real device plugin over gRPC (the test plays the kubelet, as in
test_deviceplugin.py): the Allocate response carries the MPS percentage, the
priority and the profile.

The budget is derived from the model (the declared profiles' class streams),
so the test checks the rules and the plumbing, not today's constants.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.deviceplugin._pb import api_pb2
from chronotope.sharing.assignment import GpuAssignment, gpu_uuid
from chronotope.solver.colocation import Colocation
from chronotope.solver.model import Reason
from chronotope.solver.state import ShareTag
from e2e.kubetest import KubeCluster, wait_for
from tests.fake_kubelet import FakeKubelet, fake_kubelet

pytestmark = pytest.mark.cluster

RESOURCE = "chronotope.dev/gpu-share"
TAINT = {"key": "chronotope.dev/test", "value": "colocation", "effect": "NoSchedule"}
CB, MB = WorkloadProfile.COMPUTE_BOUND, WorkloadProfile.MEMORY_BOUND
HP_A, BE, HP_B = 40, 30, 20
"""Compute percent each pod asks: together they fit one GPU, so only the rules can refuse."""


def _budget() -> float:
    """The smallest two-decimal budget that admits the memory-bound share beside infer-a."""
    predicted = Colocation().pair(CB, MB, 100)  # the class streams do not depend on the cap
    return max(1.0, math.ceil(predicted * 100 + 0.5) / 100)


@dataclass
class Colo:
    model: str
    nodes: list[str]
    budget: float
    kubelet: FakeKubelet
    endpoint: str
    core: Any  # kubernetes.client.CoreV1Api


def _node(name: str, model: str) -> dict[str, Any]:
    resources = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": model,
                "nvidia.com/gpu.memory": "23034",
                "nvidia.com/gpu.count": "1",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": [TAINT]},
        "status": {"allocatable": resources, "capacity": resources},
    }


def _add_node(core: Any, api: Any, name: str, model: str) -> None:
    from chronotope.kube.nodes import apply_nodes, wait_nodes_ready

    apply_nodes(api, [_node(name, model)])
    wait_nodes_ready(api, {name}, 120)

    def only_our_taint() -> bool:
        taints = core.read_node(name).spec.taints or []
        return all(t.key == TAINT["key"] for t in taints)

    wait_for(only_our_taint, 120, f"node {name} without the not-ready taint")


@pytest.fixture(scope="module")
def colo(
    kube_cluster: KubeCluster,
    chronotope_scheduler: int,
    chart_identities: Any,
    device_plugin_kubeconfig: Path,
) -> Iterator[Colo]:
    from kubernetes import client

    assert kube_cluster.local is not None
    tag = uuid.uuid4().hex[:6]
    model, first = f"COLO-{tag}", f"colo-{tag}-0"
    budget = _budget()
    plugin_dir = Path(tempfile.mkdtemp(prefix="colo-", dir="/tmp"))  # short socket paths
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        _add_node(core, api, first, model)
        nodes = [first]
        try:
            with fake_kubelet(plugin_dir) as kubelet, (plugin_dir / "plugin.log").open("w") as out:
                proc = subprocess.Popen(
                    [
                        *(sys.executable, "-m", "chronotope", "-v", "device-plugin"),
                        *("--node-name", first, "--kubeconfig", str(device_plugin_kubeconfig)),
                        *("--plugin-dir", str(plugin_dir), "--resource-name", RESOURCE),
                        *("--gpus", "1", "--shares-per-gpu", "10", "--watch-interval", "0.5"),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                try:
                    registration = kubelet.next_registration(timeout=120)
                    # restarted after the plugin marked its node, so the binder takes its lock
                    kube_cluster.local.start_chronotope_scheduler(
                        chronotope_scheduler,
                        ("--interference-budget", f"{budget:.2f}"),
                        identities=chart_identities,
                    )
                    yield Colo(model, nodes, budget, kubelet, registration.endpoint, core)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
                    kube_cluster.local.start_chronotope_scheduler(
                        chronotope_scheduler, identities=chart_identities
                    )
        finally:
            for name in nodes:
                core.delete_node(name)
            shutil.rmtree(plugin_dir, ignore_errors=True)


def _share_pod(name: str, model: str, percent: int, priority: str, profile: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {
                "chronotope.dev/gpu-compute-percent": str(percent),
                "chronotope.dev/gpu-memory-mib": "4000",
                "chronotope.dev/gpu-priority": priority,
                "chronotope.dev/gpu-profile": profile,
            },
        },
        "spec": {
            "schedulerName": "chronotope",
            "nodeSelector": {"nvidia.com/gpu.product": model},
            "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/x:1",
                    "resources": {"limits": {RESOURCE: "1"}},
                }
            ],
        },
    }


def _bound(colo: Colo, namespace: str, name: str) -> GpuAssignment | None:
    pod = colo.core.read_namespaced_pod(name, namespace)
    if not pod.spec.node_name:
        return None
    return GpuAssignment.from_annotations(pod.metadata.annotations or {})


def _allocate(colo: Colo, slot: int) -> dict[str, str]:
    """What the kubelet does when the pod starts: Allocate one share device of the GPU."""
    request = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[f"{gpu_uuid(colo.nodes[0], 0)}::{slot}"])
        ]
    )
    with colo.kubelet.plugin_stub(colo.endpoint) as stub:
        response = stub.Allocate(request, timeout=30)
    return dict(response.container_responses[0].envs)


def _place(colo: Colo, namespace: str, pod: dict[str, Any]) -> GpuAssignment:
    name = pod["metadata"]["name"]
    colo.core.create_namespaced_pod(namespace, pod)
    return wait_for(lambda: _bound(colo, namespace, name), 90, f"{name} bound")


@pytest.mark.timeout(600)
def test_best_effort_beside_high_with_the_models_share_and_no_second_high(
    kube_cluster: KubeCluster, colo: Colo, namespace: str
) -> None:
    rules = Colocation(budget=colo.budget)
    infer_a = ShareTag(f"{namespace}/infer-a", SharePriority.HIGH, CB, HP_A)
    expected = rules.admit((infer_a,), ShareTag("t", SharePriority.BEST_EFFORT, MB, BE))
    assert isinstance(expected, int), expected

    # 1. the High-priority inference share, alone on the GPU
    a = _place(colo, namespace, _share_pod("infer-a", colo.model, HP_A, "high", "compute-bound"))
    assert (a.node, a.gpu_indices, a.compute_percent) == (colo.nodes[0], (0,), HP_A)
    envs = _allocate(colo, 0)
    assert envs["CHRONOTOPE_HANDSHAKE"] == a.handshake
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(HP_A)
    assert envs["CHRONOTOPE_GPU_PRIORITY"] == "high"
    assert envs["CHRONOTOPE_GPU_PROFILE"] == "compute-bound"

    # 2. the memory-bound best-effort training share lands beside it, at the model's percent
    pod = _share_pod("train", colo.model, BE, "best-effort", "memory-bound")
    be = _place(colo, namespace, pod)
    assert (be.node, be.gpu_indices) == (a.node, a.gpu_indices)
    assert be.compute_percent == expected
    envs = _allocate(colo, 1)
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu_uuid(colo.nodes[0], 0),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(expected),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M",
        "CHRONOTOPE_HANDSHAKE": be.handshake,
        "CHRONOTOPE_GPU_PRIORITY": "best-effort",
        "CHRONOTOPE_GPU_PROFILE": "memory-bound",
    }

    # 3. a second High-priority share would push infer-a over the budget: refused, and why
    train = ShareTag(f"{namespace}/train", SharePriority.BEST_EFFORT, MB, expected)
    why = rules.admit(
        (infer_a, train), ShareTag(f"{namespace}/infer-b", SharePriority.HIGH, CB, HP_B)
    )
    assert isinstance(why, Reason), "the model must refuse infer-b beside infer-a and train"
    colo.core.create_namespaced_pod(
        namespace, _share_pod("infer-b", colo.model, HP_B, "high", "compute-bound")
    )

    def refusal() -> Any:
        events = colo.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=infer-b"
        ).items
        return next(
            (e for e in events if e.reason == "FailedScheduling" and "budget" in (e.message or "")),
            None,
        )

    event = wait_for(refusal, 90, "FailedScheduling with the co-location reason")
    assert f"gpu 0 of {colo.nodes[0]}: {why.message}" in event.message
    assert f"over the {colo.budget:.2f}x budget" in event.message
    assert _bound(colo, namespace, "infer-b") is None

    # 4. it was the rules, not the room: on a second node it lands at once
    with kube_cluster.api_client() as api:
        second = f"{colo.nodes[0][:-2]}-1"
        colo.nodes.append(second)
        _add_node(colo.core, api, second, colo.model)
    b = wait_for(lambda: _bound(colo, namespace, "infer-b"), 120, "infer-b bound")
    assert (b.node, b.compute_percent, b.priority) == (second, HP_B, "high")
