"""The real kube-scheduler binds GPU pods through the Chronotope extender (end to end)."""

from __future__ import annotations

import functools
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from chronotope.sharing.assignment import GpuAssignment
from e2e.kubetest import KubeCluster, wait_for

pytestmark = pytest.mark.cluster

SHARE = "chronotope.dev/gpu-share"


def gpu_pod(name: str, gpus: int = 0, share: tuple[int, int] | None = None) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {SHARE: "1"}
    annotations = {}
    if share:
        annotations = {
            "chronotope.dev/gpu-compute-percent": str(share[0]),
            "chronotope.dev/gpu-memory-mib": str(share[1]),
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": "chronotope",
            "containers": [
                {"name": "c", "image": "registry.example/x:1", "resources": {"limits": limits}}
            ],
        },
    }


def _bound(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    pod = core.read_namespaced_pod(name, namespace)
    return pod if pod.spec.node_name else None


def test_whole_and_fractional_pods_are_bound_with_assignments(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, gpu_pod("whole", gpus=4))
        core.create_namespaced_pod(namespace, gpu_pod("frac-a", share=(50, 6000)))
        core.create_namespaced_pod(namespace, gpu_pod("frac-b", share=(50, 6000)))
        pods = {
            n: wait_for(functools.partial(_bound, core, namespace, n), 90, f"{n} bound")
            for n in ("whole", "frac-a", "frac-b")
        }
        nodes = {n: core.read_node(p.spec.node_name) for n, p in pods.items()}
    whole = GpuAssignment.from_annotations(pods["whole"].metadata.annotations)
    assert whole.node == pods["whole"].spec.node_name
    assert len(whole.gpu_indices) == 4
    assert whole.memory_mib is None
    assert whole.compute_percent is None
    assert max(whole.gpu_indices) < int(nodes["whole"].status.capacity["nvidia.com/gpu"])
    for name in ("frac-a", "frac-b"):
        share = GpuAssignment.from_annotations(pods[name].metadata.annotations)
        assert (share.compute_percent, share.memory_mib) == (50, 6000)
        assert len(share.gpu_uuids) == 1
        assert share.gpu_uuids[0] == f"GPU-{share.node}-{share.gpu_indices[0]}"
    # two halves fill one GPU: the policy (FGD's measure) never leaves two half-idle GPUs
    # when one full GPU is possible, and frac-b is filtered with frac-a already assumed
    a = GpuAssignment.from_annotations(pods["frac-a"].metadata.annotations)
    b = GpuAssignment.from_annotations(pods["frac-b"].metadata.annotations)
    assert (a.node, a.gpu_indices) == (b.node, b.gpu_indices)


def test_unplaceable_share_says_why_in_events(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, gpu_pod("too-much-memory", share=(10, 500_000)))

        def failed_event() -> Any:
            events = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=too-much-memory"
            ).items
            return next((e for e in events if e.reason == "FailedScheduling"), None)

        event = wait_for(failed_event, 60, "FailedScheduling event")
        assert "< requested 500000 MiB" in event.message
        assert core.read_namespaced_pod("too-much-memory", namespace).spec.node_name is None


def post(
    port: int, verb: str, body: bytes, context: ssl.SSLContext | None
) -> tuple[int, dict[str, Any]]:
    """POST `body` to the extender's `verb` over HTTPS as the caller `context` makes."""
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/{verb}", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_malformed_requests_get_400_and_unknown_nodes_a_reason(
    kube_cluster: KubeCluster, chronotope_scheduler: int
) -> None:
    port = chronotope_scheduler
    client = kube_cluster.local.extender_pki().client_context()  # kube-scheduler's certificate
    _post = functools.partial(post, context=client)
    status, body = _post(port, "filter", b"{not json")
    assert status == 400
    assert "not JSON" in body["Error"]
    status, body = _post(port, "bind", json.dumps({"PodName": "x"}).encode())
    assert status == 400
    assert "PodNamespace" in body["Error"]
    # a pod asking for no GPU and no CPU fits any known node, so the outcome is certain
    pod = {
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"schedulerName": "chronotope", "containers": [{"name": "c", "image": "x"}]},
    }
    status, body = _post(
        port, "filter", json.dumps({"Pod": pod, "NodeNames": ["no-such-node"]}).encode()
    )
    assert status == 200
    assert not body["NodeNames"]
    assert "not known" in body["FailedAndUnresolvableNodes"]["no-such-node"]
    status, body = _post(
        port, "filter", json.dumps({"Pod": pod, "NodeNames": ["no-such-node", "t4-000"]}).encode()
    )
    assert status == 200
    assert body["NodeNames"] == ["t4-000"]  # one node passes: no reasons for the others
    with urllib.request.urlopen(
        f"https://127.0.0.1:{port}/healthz", timeout=5, context=client
    ) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(
        f"https://127.0.0.1:{port}/metrics", timeout=5, context=client
    ) as resp:
        text = resp.read().decode()
    assert 'chronotope_extender_bad_requests_total{verb="filter"}' in text
    assert "chronotope_extender_request_seconds_bucket" in text


def _gang_member(name: str, gang: str, size: int, gpus: int, strategy: str) -> dict[str, Any]:
    pod = gpu_pod(name, gpus=gpus)
    pod["metadata"]["labels"] = {"chronotope.dev/pod-group": gang}
    pod["metadata"]["annotations"] = {
        "chronotope.dev/pod-group-size": str(size),
        "chronotope.dev/placement-strategy": strategy,
    }
    return pod


def test_gangs_bind_all_members_or_none(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        # 5 members x 8 GPUs: only four 8-GPU nodes exist, so no member may bind
        for i in range(5):
            core.create_namespaced_pod(namespace, _gang_member(f"big-{i}", "big", 5, 8, "Pack"))
        # 3 members x 1 GPU on distinct nodes: all bind
        for i in range(3):
            core.create_namespaced_pod(
                namespace, _gang_member(f"spread-{i}", "spread", 3, 1, "StrictSpread")
            )
        spread = [
            wait_for(functools.partial(_bound, core, namespace, f"spread-{i}"), 90, "spread bound")
            for i in range(3)
        ]
        assert len({p.spec.node_name for p in spread}) == 3

        def gang_event() -> Any:
            events = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=big-0"
            ).items
            return next((e for e in events if "gang" in (e.message or "")), None)

        event = wait_for(gang_event, 60, "FailedScheduling naming the gang")
        assert "needs 5 member(s) with 8 whole GPUs each" in event.message
        assert all(_bound(core, namespace, f"big-{i}") is None for i in range(5))
