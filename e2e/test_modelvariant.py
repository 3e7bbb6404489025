"""ModelVariants on the real control plane: grouped, planned, built, placed by the chronotope
scheduler, replicated when hot, and re-placed when a node carrying a replica goes away."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from chronotope.kube.nodes import apply_nodes, wait_nodes_ready
from chronotope.sim.clusterspec import load_spec, node_manifests
from e2e.kubetest import KubeCluster, wait_for
from e2e.test_inferencepipeline import _hold_gpus
from e2e.test_queues import _local_queue
from e2e.test_trainingjob import _events

pytestmark = pytest.mark.cluster

GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "modelvariants"
H100 = "H100-SXM5-80GB"
A100 = "A100-SXM4-80GB"
LABEL = "chronotope.dev/serving-group"
DEMO_SPEC = Path(__file__).resolve().parents[1] / "manifests" / "clusters" / "demo.yaml"


def mv(name: str, qps: float = 0.2, group: str | None = "llama", **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "base": {"name": "meta-llama/Llama-2-7b-hf", "parametersBillions": 6.7, "sizeMiB": 13000},
        "delta": {"uri": f"s3://deltas/{name}.delta", "bits": 4, "compressedSizeMiB": 600},
        "traffic": {"expectedQPS": qps},
        "slo": {"p99LatencyMs": 2000},
    }
    if group:
        spec["servingGroup"] = group
    spec |= over
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelVariant",
        "metadata": {"name": name},
        "spec": spec,
    }


class Api:
    """The three clients the test reads through, and where things stand (for failures)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.ns = namespace

    def status(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)
        return dict(obj.get("status") or {})

    def doc(self, group: str = "llama") -> dict[str, Any]:
        try:
            cm = self.core.read_namespaced_config_map(f"{group}-placement", self.ns)
        except client.exceptions.ApiException:
            return {}
        return dict(json.loads(cm.data["placement.json"]))

    def pods(self, group: str = "llama") -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=f"{LABEL}={group}").items)

    def where(self) -> str:
        pods = [(p.metadata.name, p.spec.node_name, p.status.phase) for p in self.pods()]
        return f"pods {pods}; placement {self.doc()}"

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        try:
            return wait_for(predicate, timeout, what)
        except AssertionError as exc:  # say where it stood
            raise AssertionError(f"{exc}: {self.where()}") from None


def _serving(k: Api, names: list[str]) -> bool:
    return all(k.status(n).get("phase") == "Serving" for n in names)


def _routes_ready(doc: dict[str, Any], variant: str, at_least: int) -> list[dict[str, Any]]:
    route = [e for e in (doc.get("routes") or {}).get(variant, []) if e["state"] == "serving"]
    if len(route) >= at_least and all(e["pod"] and e["ready"] for e in route):
        return route
    return []


def _check_built(k: Api) -> None:
    """One Deployment per group on the planned GPU type; the placement and status agree."""
    llama = k.apps.read_namespaced_deployment("llama", k.ns)
    assert llama.spec.replicas == 1
    template = llama.spec.template.spec
    assert template.scheduler_name == "chronotope"
    assert template.node_selector == {"nvidia.com/gpu.product": H100}
    assert template.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert sorted(o.name for o in llama.metadata.owner_references) == ["chat", "ocr", "sql"]
    other = k.apps.read_namespaced_deployment("mistralai-mistral-7b-v0-1", k.ns)
    assert [o.name for o in other.metadata.owner_references] == ["mistral-chat"]
    # the placement ConfigMap names the pod that holds the three deltas, and where it runs
    (replica_pod,) = k.pods()
    (replica,) = k.doc()["replicas"]
    assert replica["pod"] == replica_pod.metadata.name
    assert replica["node"] == replica_pod.spec.node_name
    assert replica["ready"] is True
    assert sorted(d["variant"] for d in replica["resident"]) == ["chat", "ocr", "sql"]
    assert {d["uri"] for d in replica["resident"]} >= {"s3://deltas/chat.delta"}
    for name in ("chat", "sql", "ocr"):
        status = k.status(name)
        assert status["residency"] == "GPU"
        assert status["expectedSwapLatencyMs"] == 0
        assert status["gpuType"] == H100
        assert status["servingReplica"] == replica_pod.metadata.name
        assert status["node"] == replica_pod.spec.node_name
        resident = next(c for c in status["conditions"] if c["type"] == "Resident")
        assert resident["status"] == "True"
        assert "resident on replica 1 of 1" in resident["message"]
    nodes = {n.metadata.name: n.metadata.labels for n in k.core.list_node().items}
    assert nodes[replica_pod.spec.node_name]["nvidia.com/gpu.product"] == H100


def _make_hot(k: Api) -> list[dict[str, Any]]:
    """chat's traffic goes up: it is replicated and the Deployment grows to hold it."""
    k.custom.patch_namespaced_custom_object(
        GROUP, VERSION, k.ns, PLURAL, "chat", {"spec": {"traffic": {"expectedQPS": 8}}}
    )
    route: list[dict[str, Any]] = k.wait(
        lambda: _routes_ready(k.doc(), "chat", 2), 120, "chat on two Ready replicas"
    )
    replicas = k.apps.read_namespaced_deployment("llama", k.ns).spec.replicas
    assert replicas == len(k.doc()["replicas"])
    assert replicas >= 2
    assert len({e["pod"] for e in route}) == len(route)

    def resident() -> str:
        status = k.status("chat")
        cond = next(c for c in status["conditions"] if c["type"] == "Resident")
        return f"{status['phase']}: {cond['message']}"

    # chat's status follows on its own next pass
    said = k.wait(lambda: "8.0 QPS" in resident() and resident(), 30, "chat's status re-planned")
    assert said.startswith("Serving: resident on replicas 1, 2 of ")
    return route


def _lose_a_node(k: Api, api: Any, route: list[dict[str, Any]], names: list[str]) -> None:
    """A node carrying one of chat's replicas goes: the pod is re-placed, the routes follow."""
    victim = next(p for p in k.pods() if p.metadata.name == route[-1]["pod"]).spec.node_name
    manifest = next(
        m for m in node_manifests(load_spec(DEMO_SPEC)) if m["metadata"]["name"] == victim
    )
    lost = {p.metadata.name for p in k.pods() if p.spec.node_name == victim}
    try:
        k.core.delete_node(victim)
        # what the pod garbage collector does for pods bound to a deleted node, sooner
        for name in lost:
            k.core.delete_namespaced_pod(name, k.ns, grace_period_seconds=0)

        def re_placed() -> list[dict[str, Any]]:
            doc = k.doc()
            pods = {p.metadata.name: p.spec.node_name for p in k.pods()}
            slots = doc.get("replicas") or []
            if any(r["pod"] in lost or r["pod"] not in pods or not r["ready"] for r in slots):
                return []
            if victim in pods.values():
                return []
            return _routes_ready(doc, "chat", 2)

        moved = k.wait(re_placed, 120, "the lost replica re-placed and routed")
        assert not {e["pod"] for e in moved} & lost
        # each variant's status follows on its own next pass
        k.wait(
            lambda: _serving(k, names) and k.status("chat")["servingReplica"] not in lost,
            60,
            "chat serving from a pod that still exists",
        )
        assert k.status("chat")["servingReplica"] in {e["pod"] for e in moved}
    finally:
        if victim not in {n.metadata.name for n in k.core.list_node().items}:
            apply_nodes(api, [manifest])
            wait_nodes_ready(api, {victim}, 60)


def test_variants_are_served_replicated_when_hot_and_re_placed_when_a_node_goes(
    kube_cluster: KubeCluster, chronotope_operator: None, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        k = Api(api, namespace)
        mistral = {"name": "mistralai/Mistral-7B-v0.1", "parametersBillions": 7.2, "sizeMiB": 14000}
        variants = [
            mv("chat"),
            mv("sql", 0.1),
            mv("ocr"),
            mv("mistral-chat", 0.1, None, base=mistral),
        ]
        for body in variants:
            k.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        names = [v["metadata"]["name"] for v in variants]
        k.wait(lambda: _serving(k, names), 120, "every variant serving")
        _check_built(k)
        route = _make_hot(k)
        _lose_a_node(k, api, route, names)


@contextlib.contextmanager
def _in_queue(k: Api, spec: dict[str, Any]) -> Iterator[str]:
    """A Queue with `spec`, the namespace's LocalQueue `default` onto it; deleted after."""
    queue = f"mv-{k.ns[-6:]}"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Queue", "metadata": {"name": queue}}
    k.custom.create_cluster_custom_object(GROUP, VERSION, "queues", body | {"spec": spec})
    try:
        local = _local_queue(k.ns, queue)
        k.custom.create_namespaced_custom_object(GROUP, VERSION, k.ns, "localqueues", local)
        yield queue
    finally:
        k.custom.delete_cluster_custom_object(GROUP, VERSION, "queues", queue)


def test_a_new_serving_group_waits_for_its_queue_quota(
    kube_cluster: KubeCluster, chronotope_operator: None, namespace: str
) -> None:
    spec: dict[str, Any] = {"quotas": [{"gpuType": H100, "gpus": 0}]}
    with kube_cluster.api_client() as api, _in_queue(Api(api, namespace), spec) as queue:
        k = Api(api, namespace)
        k.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, mv("held", group="quota")
        )
        k.wait(
            lambda: (
                k.status("held").get("phase") == "Pending"
                and "waiting for quota" in str(k.status("held").get("whyWaiting"))
            ),
            60,
            "the variant waiting for its queue's quota",
        )
        status = k.status("held")
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "QuotaExceeded"
        assert not k.apps.list_namespaced_deployment(namespace).items

        def pending() -> tuple[int, list[str]]:
            got = k.custom.get_cluster_custom_object(GROUP, VERSION, "queues", queue)
            q = got.get("status") or {}
            head = [w["workload"] for w in q.get("pendingHead") or []]
            return int(q.get("pendingWorkloads") or 0), head

        # the group is one pending workload of its Queue
        listed = (1, [f"{namespace}/serving-group:quota"])
        k.wait(lambda: pending() == listed, 60, "the Queue lists the waiting group")
        # room in the queue: the group is built at its next pass (within its refresh)
        spec["quotas"][0]["gpus"] = 16
        k.custom.patch_cluster_custom_object(GROUP, VERSION, "queues", queue, {"spec": spec})
        k.wait(
            lambda: bool(k.apps.list_namespaced_deployment(namespace).items),
            90,
            "the group's Deployment once the quota allows it",
        )
        k.wait(lambda: _serving(k, ["held"]), 120, "the variant serving")
        k.wait(lambda: pending() == (0, []), 60, "nothing pending in the Queue")
        # the queue is capped at what runs; then the variant's traffic wants a replica more
        spec["quotas"][0]["gpus"] = 1
        k.custom.patch_cluster_custom_object(GROUP, VERSION, "queues", queue, {"spec": spec})
        k.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "held", {"spec": {"traffic": {"expectedQPS": 8}}}
        )

        def not_scaling() -> list[Any]:
            return [
                e
                for e in k.core.list_namespaced_event(namespace).items
                if e.involved_object.name == "held"
                and e.reason == "QuotaExceeded"
                and e.message.startswith("not scaling up: ")
            ]

        k.wait(not_scaling, 90, "a QuotaExceeded event: the running group does not grow")
        assert k.apps.read_namespaced_deployment("quota", namespace).spec.replicas == 1
        assert k.status("held").get("phase") == "Serving"  # what runs keeps serving
        # the quota is raised again: the group takes its new plan
        spec["quotas"][0]["gpus"] = 16
        k.custom.patch_cluster_custom_object(GROUP, VERSION, "queues", queue, {"spec": spec})
        k.wait(
            lambda: k.apps.read_namespaced_deployment("quota", namespace).spec.replicas >= 2,
            90,
            "the group scaled up once its quota allows it",
        )


def _serving_on(k: Api, name: str, gpu_type: str) -> bool:
    """`name` serves from a pod bound to a node of `gpu_type` (and says that type)."""
    status = k.status(name)
    if status.get("phase") != "Serving" or status.get("gpuType") != gpu_type:
        return False
    node = k.core.read_node(status["node"])
    return bool(node.metadata.labels.get("nvidia.com/gpu.product") == gpu_type)


def test_a_serving_group_is_planned_on_free_gpus_and_back_once_its_best_type_frees_up(
    kube_cluster: KubeCluster, chronotope_operator: None, namespace: str
) -> None:
    # other work holds every H100 GPU: before, the group was planned on the H100s anyway
    # (the fewest GPUs for its traffic) and its pod stayed Pending ("Insufficient
    # nvidia.com/gpu") while the A100s idled; now it is planned on the A100s free now,
    # and back on the H100s once they free up
    with kube_cluster.api_client() as api:
        k = Api(api, namespace)
        selector = f"nvidia.com/gpu.product={H100}"
        h100 = sorted(n.metadata.name for n in k.core.list_node(label_selector=selector).items)
        assert h100
        for name in h100:
            _hold_gpus(k.core, namespace, name, 8)
        k.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, mv("chat"))
        k.wait(lambda: _serving_on(k, "chat", A100), 90, "chat serving on an A100")
        placed = _events(k.core, namespace, "chat")["Placed"]
        assert placed.startswith(f"{A100} (on the GPUs free now (1 x {H100} would serve it"), placed
        for name in h100:  # the other work ends
            k.core.delete_namespaced_pod(f"holder-{name}"[:63], namespace)
        k.wait(lambda: _serving_on(k, "chat", H100), 120, "chat serving on an H100 again")

        def off_h100() -> list[str]:
            live = [p for p in k.pods() if not p.metadata.deletion_timestamp]
            return [p.metadata.name for p in live if p.spec.node_name not in h100]

        k.wait(lambda: not off_h100(), 60, "the A100 replica gone")


def test_a_serving_group_is_planned_on_the_gpu_type_its_queue_admits(
    kube_cluster: KubeCluster, chronotope_operator: None, namespace: str
) -> None:
    # the namespace's queue lists A100 quota and no H100 quota: before, the group was
    # planned on the H100s (the fewest GPUs) and waited `QuotaExceeded` for good
    spec = {"quotas": [{"gpuType": H100, "gpus": 0}, {"gpuType": A100, "gpus": 8}]}
    with kube_cluster.api_client() as api, _in_queue(Api(api, namespace), spec):
        k = Api(api, namespace)
        k.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, mv("chat", group="quota")
        )
        k.wait(lambda: _serving_on(k, "chat", A100), 90, "chat serving on an A100")
        assert "QuotaExceeded" not in _events(k.core, namespace, "chat")
