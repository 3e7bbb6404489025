"""The device plugin over real gRPC, against pods and annotations on the real API server.

No kubelet runs here, so the test plays it (tests/fake_kubelet.py): it serves
Registration on a `kubelet.sock` in a temporary plugin directory, waits for
`chronotope device-plugin` (a real subprocess) to register, then dials the
plugin's socket for ListAndWatch and Allocate. The test also plays the binder:
it writes the assignment annotations on pods bound to a private kwok node and
takes the node's allocation lock, exactly as the binder would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from chronotope.deviceplugin._pb import api_pb2, api_pb2_grpc
from chronotope.sharing.assignment import (
    ALLOCATED_AT,
    ALLOCATION,
    ALLOCATION_LOCK,
    GpuAssignment,
    format_lock,
    gpu_uuid,
)
from chronotope.sharing.labels import SCHEDULER_NAME
from e2e.kubetest import KubeCluster, wait_for
from tests.fake_kubelet import FakeKubelet, fake_kubelet

pytestmark = pytest.mark.cluster

RESOURCE = "chronotope.dev/gpu-share"
GPUS = 2
SHARES = 4


@dataclass
class Plugin:
    node: str
    kubelet: FakeKubelet
    endpoint: str
    core: Any  # kubernetes.client.CoreV1Api
    log: Path

    def stub(self) -> Any:
        return self.kubelet.plugin_stub(self.endpoint)


def _node_manifest(name: str) -> dict[str, Any]:
    # A private kwok node (kwok keeps it Ready and runs its pods), tainted so that no
    # other test's pods are scheduled onto it; our pods name it in spec.nodeName.
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"type": "kwok", "nvidia.com/gpu.count": str(GPUS)},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {
            "taints": [
                {"key": "chronotope.dev/test", "value": "deviceplugin", "effect": "NoSchedule"}
            ]
        },
    }


@pytest.fixture(scope="module")
def plugin(kube_cluster: KubeCluster, device_plugin_kubeconfig: Path) -> Iterator[Plugin]:
    from kubernetes import client

    node = f"dp-{uuid.uuid4().hex[:6]}"
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # short unix socket paths
    log = plugin_dir / "plugin.log"
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_node(_node_manifest(node))
        try:
            with fake_kubelet(plugin_dir) as kubelet, log.open("w") as out:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "chronotope",
                        "-v",
                        "device-plugin",
                        "--node-name",
                        node,
                        "--kubeconfig",
                        str(device_plugin_kubeconfig),  # the chart's device-plugin identity
                        "--plugin-dir",
                        str(plugin_dir),
                        "--resource-name",
                        RESOURCE,
                        "--shares-per-gpu",
                        str(SHARES),
                        "--watch-interval",
                        "0.5",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
                try:
                    registration = kubelet.next_registration(timeout=120)
                    assert registration.resource_name == RESOURCE
                    assert registration.version == "v1beta1"
                    yield Plugin(node, kubelet, registration.endpoint, core, log)
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
        finally:
            core.delete_node(node)
            shutil.rmtree(plugin_dir, ignore_errors=True)


def _bind(
    plugin: Plugin, namespace: str, name: str, a: GpuAssignment, scheduler: str = SCHEDULER_NAME
) -> None:
    """What the binder does: the pod, bound to the node, carrying its assignment."""
    plugin.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "annotations": a.to_annotations()},
            "spec": {
                "schedulerName": scheduler,
                "nodeName": plugin.node,
                "tolerations": [{"key": "chronotope.dev/test", "operator": "Exists"}],
                "containers": [{"name": "main", "image": "fake"}],
            },
        },
    )


def _lock(plugin: Plugin, handshake: str | None) -> None:
    value = format_lock(handshake, time.time()) if handshake else None
    plugin.core.patch_node(plugin.node, {"metadata": {"annotations": {ALLOCATION_LOCK: value}}})


def _node_lock(plugin: Plugin) -> str | None:
    annotations = plugin.core.read_node(plugin.node).metadata.annotations or {}
    return annotations.get(ALLOCATION_LOCK)


def _pod_annotations(plugin: Plugin, namespace: str, name: str) -> dict[str, str]:
    return dict(plugin.core.read_namespaced_pod(name, namespace).metadata.annotations or {})


def _assignment(node: str, index: int, handshake: str) -> GpuAssignment:
    return GpuAssignment(
        node=node,
        gpu_indices=(index,),
        gpu_uuids=(gpu_uuid(node, index),),
        memory_mib=4096,
        compute_percent=25,
        handshake=handshake,
    )


def _prefer(stub: Any, available: list[str], size: int) -> list[str]:
    """GetPreferredAllocation as the kubelet calls it before Allocate."""
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, allocation_size=size
            )
        ]
    )
    return list(stub.GetPreferredAllocation(request, timeout=30).container_responses[0].deviceIDs)


def _allocate(stub: Any, *device_ids: str) -> dict[str, str]:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(device_ids))]
    )
    response = stub.Allocate(request, timeout=30)
    return dict(response.container_responses[0].envs)


def test_lists_the_nodes_gpus_as_share_devices(plugin: Plugin) -> None:
    stub: api_pb2_grpc.DevicePluginStub
    with plugin.stub() as stub:
        stream = stub.ListAndWatch(api_pb2.Empty(), timeout=60)
        devices = next(iter(stream)).devices
        stream.cancel()
    assert [d.ID for d in devices] == [
        f"{gpu_uuid(plugin.node, i)}::{k}" for i in range(GPUS) for k in range(SHARES)
    ]
    assert {d.health for d in devices} == {"Healthy"}


def test_allocate_follows_the_handshake_not_the_size(plugin: Plugin, namespace: str) -> None:
    """Two same-size pods on one node: Allocate serves the lock holder, then the other."""
    _bind(plugin, namespace, "first", _assignment(plugin.node, 0, "hs-first"))
    _bind(plugin, namespace, "second", _assignment(plugin.node, 1, "hs-second"))
    _lock(plugin, "hs-second")
    with plugin.stub() as stub:
        envs = _allocate(stub, f"{gpu_uuid(plugin.node, 0)}::0")
        assert envs == {
            "NVIDIA_VISIBLE_DEVICES": gpu_uuid(plugin.node, 1),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
            "CHRONOTOPE_HANDSHAKE": "hs-second",
        }
        second = _pod_annotations(plugin, namespace, "second")
        assert second[ALLOCATION] == "consumed"
        assert second[ALLOCATED_AT].endswith("Z")
        assert _pod_annotations(plugin, namespace, "first")[ALLOCATION] == "pending"
        assert _node_lock(plugin) is None

        _lock(plugin, "hs-first")
        envs = _allocate(stub, f"{gpu_uuid(plugin.node, 1)}::3")
        assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(plugin.node, 0)
        assert envs["CHRONOTOPE_HANDSHAKE"] == "hs-first"
        assert _pod_annotations(plugin, namespace, "first")[ALLOCATION] == "consumed"
        assert _node_lock(plugin) is None


def test_mismatched_handshake_is_refused_with_a_reason(plugin: Plugin, namespace: str) -> None:
    _bind(plugin, namespace, "p", _assignment(plugin.node, 0, "hs-pod"))
    _lock(plugin, "hs-nobody")
    try:
        with plugin.stub() as stub, pytest.raises(grpc.RpcError) as err:
            _allocate(stub, f"{gpu_uuid(plugin.node, 0)}::0")
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "hs-nobody" in (err.value.details() or "")
        assert _pod_annotations(plugin, namespace, "p")[ALLOCATION] == "pending"
        assert _node_lock(plugin) is not None  # not ours to release
        # the refusal is logged by the plugin, with the same reason
        wait_for(lambda: "hs-nobody" in plugin.log.read_text(), timeout=30, what="refusal in log")

        # a request whose size does not match the assignment is refused too
        _lock(plugin, "hs-pod")
        with plugin.stub() as stub, pytest.raises(grpc.RpcError) as err:
            _allocate(stub, f"{gpu_uuid(plugin.node, 0)}::0", f"{gpu_uuid(plugin.node, 1)}::0")
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "assigned 1 GPU(s)" in (err.value.details() or "")
        assert _pod_annotations(plugin, namespace, "p")[ALLOCATION] == "pending"
    finally:
        _lock(plugin, None)


def test_an_assignment_the_scheduler_did_not_make_or_devices_elsewhere_are_refused(
    plugin: Plugin, namespace: str
) -> None:
    """The authoritative record, then the kubelet's devices, checked against the assignment."""
    slot = [f"{gpu_uuid(plugin.node, i)}::{k}" for i in range(GPUS) for k in range(SHARES)]
    _bind(plugin, namespace, "other", _assignment(plugin.node, 1, "hs-other"), "default-scheduler")
    _lock(plugin, "hs-other")
    try:
        with plugin.stub() as stub, pytest.raises(grpc.RpcError) as err:
            _allocate(stub, slot[SHARES])
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "schedulerName 'default-scheduler', not 'chronotope'" in (err.value.details() or "")
        assert _pod_annotations(plugin, namespace, "other")[ALLOCATION] == "pending"

        # ours, on GPU 1: the kubelet is offered GPU 1's slots but asks for GPU 0's
        _bind(plugin, namespace, "mine", _assignment(plugin.node, 1, "hs-mine"))
        _lock(plugin, "hs-mine")
        with plugin.stub() as stub:
            assert _prefer(stub, slot, 1) == [slot[SHARES]]
            with pytest.raises(grpc.RpcError) as err:
                _allocate(stub, slot[0])
            assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            details = err.value.details() or ""
            assert f"the kubelet allocated devices ['{slot[0]}']" in details
            assert "which were offered with free slots: the request is not for this pod" in (
                details
            )
            assert _pod_annotations(plugin, namespace, "mine")[ALLOCATION] == "pending"
            envs = _allocate(stub, slot[SHARES])  # what it was offered
        assert envs["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid(plugin.node, 1)
        assert _pod_annotations(plugin, namespace, "mine")[ALLOCATION] == "consumed"
    finally:
        _lock(plugin, None)
