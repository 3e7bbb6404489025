"""Smoke tests on the real local control plane: scheduler, controllers, CRDs, GPU nodes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from e2e.kubetest import KubeCluster, wait_for

pytestmark = pytest.mark.cluster

GPU = "nvidia.com/gpu"


def _gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:latest",
                    "resources": {"limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def test_version_is_the_pinned_build(kube_cluster: KubeCluster) -> None:
    version = json.loads(kube_cluster.run_kubectl("version", "-o", "json"))["serverVersion"]
    assert version["gitVersion"] == "v1.33.13"
    assert (version["major"], version["minor"]) == ("1", "33")


def test_gpu_nodes_have_capacity_and_topology(kube_cluster: KubeCluster) -> None:
    with kube_cluster.api_client() as api:
        nodes = client.CoreV1Api(api).list_node().items
    gpu_nodes = [n for n in nodes if int(n.status.capacity.get(GPU, "0")) > 0]
    assert len(gpu_nodes) == 14  # demo spec: 2 h100 + 2 a100 + 4 v100 + 4 t4 + 2 l4
    assert sum(int(n.status.allocatable[GPU]) for n in gpu_nodes) == 60
    for node in gpu_nodes:
        labels = node.metadata.labels
        assert labels["nvidia.com/gpu.count"] == node.status.capacity[GPU]
        assert int(labels["nvidia.com/gpu.memory"]) > 0
        for key in (
            "nvidia.com/gpu.product",
            "topology.kubernetes.io/zone",
            "chronotope.dev/rack",
            "chronotope.dev/nvlink-domain",
        ):
            assert labels[key]
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_gpu_pod_is_scheduled_and_runs(kube_cluster: KubeCluster, namespace: str) -> None:
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, _gpu_pod("one-gpu", 1))
        pod = wait_for(
            lambda: (
                (p := core.read_namespaced_pod("one-gpu", namespace)).status.phase == "Running"
                and p
            ),
            what="pod Running",
        )
        node = core.read_node(pod.spec.node_name)
    assert int(node.status.capacity[GPU]) >= 1
    assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"


def test_oversized_gpu_pod_stays_pending_with_reason(
    kube_cluster: KubeCluster, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, _gpu_pod("too-big", 16))

        def unschedulable() -> Any:
            pod = core.read_namespaced_pod("too-big", namespace)
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                    return cond
            return None

        cond = wait_for(unschedulable, what="PodScheduled=False/Unschedulable")
        assert cond.status == "False"
        assert f"Insufficient {GPU}" in cond.message
        assert core.read_namespaced_pod("too-big", namespace).spec.node_name is None


def test_deployment_produces_running_pods(kube_cluster: KubeCluster, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]},
            },
        },
    }
    with kube_cluster.api_client() as api:
        client.AppsV1Api(api).create_namespaced_deployment(namespace, deployment)
        core = client.CoreV1Api(api)

        def running() -> bool:
            pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
            return sum(1 for p in pods if p.status.phase == "Running") == 3

        wait_for(running, timeout=90, what="3 running replicas")
        # garbage collection: deleting the Deployment removes its ReplicaSet and pods
        client.AppsV1Api(api).delete_namespaced_deployment(
            "web", namespace, propagation_policy="Foreground"
        )
        wait_for(
            lambda: not core.list_namespaced_pod(namespace, label_selector="app=web").items,
            timeout=90,
            what="pods garbage-collected",
        )


def test_crd_applied_server_side_becomes_established(kube_cluster: KubeCluster) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "smokewidgets.smoke.chronotope.dev"},
        "spec": {
            "group": "smoke.chronotope.dev",
            "scope": "Namespaced",
            "names": {"plural": "smokewidgets", "singular": "smokewidget", "kind": "SmokeWidget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 1},
                                    },
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    kube_cluster.run_kubectl(
        "apply",
        "--server-side",
        "--field-manager=chronotope-tests",
        "-f",
        "-",
        input=json.dumps(crd),
    )
    try:
        kube_cluster.run_kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/smokewidgets.smoke.chronotope.dev",
        )
    finally:
        kube_cluster.run_kubectl(
            "delete", "crd", "smokewidgets.smoke.chronotope.dev", "--wait=false"
        )
