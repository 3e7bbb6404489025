"""The admission webhook on the real API server: denials name the field, warnings reach
kubectl, a running job keeps its template while `kubectl scale` works, defaults are stored,
and with the webhook down the documented failure policy holds (docs/webhook.md)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.kubetest import KubeCluster, wait_for

pytestmark = pytest.mark.cluster

DENIED = 'admission webhook "validate.chronotope.dev" denied the request'
UNREACHABLE = 'failed calling webhook "validate.chronotope.dev"'


def _job(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replicas": 1,
        "gpu": {"count": 1},
        "gpuTypes": [{"name": "L4", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "L4", "durationSeconds": 3600},
        "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}},
    }
    return {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": base | spec,
    }


def _kubectl(cluster: KubeCluster, *args: str, stdin: str | None = None) -> Any:
    return subprocess.run(
        [*cluster.kubectl, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _apply(cluster: KubeCluster, namespace: str, obj: dict[str, Any]) -> Any:
    return _kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(obj))


def _get(cluster: KubeCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    out = _kubectl(cluster, "get", "-n", namespace, kind, name, "-o", "json")
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def _warnings(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    return [line.removeprefix("Warning: ") for line in lines if line.startswith("Warning: ")]


def test_a_bad_pod_template_is_denied_naming_the_field(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    # a wrong type: the CRD's PodTemplateSpec schema refuses it, before any webhook
    bad = _job("bad", template={"spec": {"containers": "not-a-list"}})
    out = _apply(kube_cluster, namespace, bad)
    assert out.returncode != 0
    assert DENIED not in out.stderr
    assert "spec.template.spec.containers: Invalid value" in out.stderr
    assert "must be of type array" in out.stderr
    # a template of the right types that the operator cannot use: the webhook denies it
    container = {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    out = _apply(
        kube_cluster, namespace, _job("bad", template={"spec": {"containers": [container]}})
    )
    assert out.returncode != 0
    assert DENIED in out.stderr
    assert (
        "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]: request GPUs "
        "through spec.gpu"
    ) in out.stderr
    gone = _kubectl(kube_cluster, "get", "-n", namespace, "trainingjob", "bad")
    assert "NotFound" in gone.stderr  # nothing was stored


def test_a_gang_whose_strategy_its_pods_rules_forbid_is_denied(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    port = {"containerPort": 7777, "hostPort": 7777}
    template = {"spec": {"containers": [{"name": "w", "image": "x", "ports": [port]}]}}
    packed = _job("packed", replicas=2, placement={"strategy": "StrictPack"}, template=template)
    out = _apply(kube_cluster, namespace, packed)
    assert out.returncode != 0
    assert DENIED in out.stderr
    assert (
        "spec.placement.strategy: StrictPack puts all 2 workers on one node, but its workers "
        "ask host port(s) 7777/TCP"
    ) in out.stderr
    # under Pack it is admitted (and placed StrictSpread)
    packed["spec"]["placement"] = {"strategy": "Pack"}
    assert _apply(kube_cluster, namespace, packed).returncode == 0
    # the other way round: StrictSpread, but a pod affinity its workers meet keeps them
    # together (once one runs, the others may go only beside it)
    term = {
        "labelSelector": {"matchLabels": {"chronotope.dev/job": "spread"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    near = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    together: dict[str, Any] = {
        "spec": {"containers": [{"name": "w", "image": "x"}], "affinity": near}
    }
    spread = _job("spread", replicas=2, placement={"strategy": "StrictSpread"}, template=together)
    out = _apply(kube_cluster, namespace, spread)
    assert out.returncode != 0
    assert DENIED in out.stderr
    assert "StrictSpread puts each of its 2 workers on a node of its own" in out.stderr
    # and a required Node topology under StrictSpread: one node, one a node
    node = {"strategy": "StrictSpread", "topology": "Node", "required": True}
    out = _apply(kube_cluster, namespace, _job("onenode", replicas=2, placement=node))
    assert out.returncode != 0
    assert DENIED in out.stderr
    assert "topology Node (required) puts them all on one" in out.stderr


def test_a_template_no_gpu_node_admits_is_a_warning_kubectl_prints(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    template = {
        "spec": {
            "nodeSelector": {"chronotope.dev/e2e-pool": "nowhere"},
            "containers": [{"name": "w", "image": "x"}],
        }
    }
    out = _apply(kube_cluster, namespace, _job("pinned", template=template))
    assert out.returncode == 0, out.stderr  # admitted: it waits for such a node
    (warning,) = _warnings(out.stderr)
    assert warning.startswith("spec.template: no node of GPU type L4 (")
    assert "node(s) by nodeSelector chronotope.dev/e2e-pool=nowhere)" in warning
    assert warning.endswith("it waits until one does")


def test_missing_references_and_unknown_gpu_types_are_warnings_kubectl_prints(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    job = _job("profiled", parallelism={"modelProfile": "opt-350"})
    job["spec"]["gpuTypes"].append({"name": "Z100-NOSUCH", "relativeSpeed": 4.0})
    out = _apply(kube_cluster, namespace, job)
    assert out.returncode == 0, out.stderr
    assert _warnings(out.stderr) == [
        "spec.gpuTypes: no node has GPU type Z100-NOSUCH (nvidia.com/gpu.product); the others "
        "are used",
        f"spec.parallelism.modelProfile: model profile ConfigMap {namespace}/opt-350 not "
        "found; the job waits for it (create it with `chronotope profile configmap`)",
    ]
    stage = {
        "name": "chat",
        "model": {"variant": "ghost"},
        "profiles": [
            {"gpuType": "L4", "batches": [{"batchSize": 1, "latencyMs": 20, "throughputQPS": 50}]}
        ],
    }
    pipeline: dict[str, Any] = {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "InferencePipeline",
        "metadata": {"name": "chat"},
        "spec": {
            "stages": [stage],
            "slo": {"p99LatencyMs": 200},
            "traffic": {"trace": {"configMap": "arrivals"}},
        },
    }
    out = _apply(kube_cluster, namespace, pipeline)
    assert out.returncode == 0, out.stderr
    assert _warnings(out.stderr) == [
        f"spec.stages[0].model.variant: ModelVariant {namespace}/ghost not found; the "
        "pipeline waits for it",
        f"spec.traffic.trace.configMap: trace ConfigMap {namespace}/arrivals not found; the "
        "pipeline waits for it",
    ]
    # once the trace exists, a spec change is admitted without that warning
    trace = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "arrivals"}}
    created = _apply(kube_cluster, namespace, trace | {"data": {"arrivals.txt": "0.1\n0.2\n"}})
    assert created.returncode == 0, created.stderr
    pipeline["spec"]["slo"]["p99LatencyMs"] = 250
    out = _apply(kube_cluster, namespace, pipeline)
    assert out.returncode == 0, out.stderr
    assert [w for w in _warnings(out.stderr) if "trace" in w] == []


def test_a_running_job_keeps_its_template_and_gpus_while_kubectl_scale_works(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    job = _job("elastic", minReplicas=1, maxReplicas=3, checkpoint={"path": "/ckpt/elastic"})
    assert _apply(kube_cluster, namespace, job).returncode == 0

    def phase() -> str:
        status = _get(kube_cluster, namespace, "trainingjob", "elastic").get("status") or {}
        return str(status.get("phase"))

    wait_for(lambda: phase() == "Running", 120, "the job runs")
    new_template = {"spec": {"template": {"spec": {"containers": [{"name": "w", "image": "y"}]}}}}
    for change, field in (
        (new_template, "spec.template"),
        ({"spec": {"gpu": {"count": 2}}}, "spec.gpu"),
        ({"spec": {"checkpoint": {"path": "/elsewhere"}}}, "spec.checkpoint.path"),
    ):
        out = _kubectl(
            kube_cluster, "patch", "-n", namespace, "trainingjob", "elastic",
            "--type=merge", "-p", json.dumps(change),
        )  # fmt: skip
        assert out.returncode != 0, change
        assert DENIED in out.stderr
        assert f"{field}: cannot change while the job is Running" in out.stderr
    scaled = _kubectl(kube_cluster, "scale", "-n", namespace, "trainingjob/elastic", "--replicas=2")
    assert scaled.returncode == 0, scaled.stderr
    patched = _kubectl(
        kube_cluster, "patch", "-n", namespace, "trainingjob", "elastic",
        "--type=merge", "-p", json.dumps({"spec": {"maxReplicas": 4, "priority": 7}}),
    )  # fmt: skip
    assert patched.returncode == 0, patched.stderr
    spec = _get(kube_cluster, namespace, "trainingjob", "elastic")["spec"]
    assert (spec["replicas"], spec["maxReplicas"], spec["priority"]) == (2, 4, 7)
    assert spec["template"] == job["spec"]["template"]


def test_defaults_are_visible_on_the_stored_object(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str
) -> None:
    plain = _job("plain")
    assert _apply(kube_cluster, namespace, plain).returncode == 0
    spec = _get(kube_cluster, namespace, "trainingjob", "plain")["spec"]
    assert spec["restart"] == {"policy": "OnFailure", "maxRestarts": 3}
    assert spec["placement"] == {"strategy": "Pack", "topology": "Any", "required": False}
    mine = _job("mine", restart={"policy": "Never"}, placement={"strategy": "Spread"})
    assert _apply(kube_cluster, namespace, mine).returncode == 0
    spec = _get(kube_cluster, namespace, "trainingjob", "mine")["spec"]
    assert spec["restart"] == {"policy": "Never", "maxRestarts": 3}  # the user's value kept
    assert spec["placement"] == {"strategy": "Spread", "topology": "Any", "required": False}


@pytest.fixture
def webhook_down(kube_cluster: KubeCluster, chronotope_operator: int) -> Iterator[None]:
    """The operator (and with it the webhook) stopped; started again, as before, afterwards."""
    assert kube_cluster.local is not None
    kube_cluster.local.stop_component("chronotope-operator")
    try:
        yield
    finally:
        kube_cluster.local.restart_operator()  # re-registers the webhook with Fail


def test_with_the_webhook_down_creates_and_spec_changes_fail_but_the_rest_works(
    kube_cluster: KubeCluster, chronotope_operator: int, namespace: str, request: Any
) -> None:
    assert _apply(kube_cluster, namespace, _job("before")).returncode == 0
    request.getfixturevalue("webhook_down")
    out = _apply(kube_cluster, namespace, _job("after"))
    assert out.returncode != 0
    assert UNREACHABLE in out.stderr  # failurePolicy Fail: refused, not admitted unchecked
    respec = _kubectl(
        kube_cluster, "patch", "-n", namespace, "trainingjob", "before",
        "--type=merge", "-p", json.dumps({"spec": {"priority": 3}}),
    )  # fmt: skip
    assert respec.returncode != 0
    assert UNREACHABLE in respec.stderr
    # what never reaches the webhook keeps working: metadata, scale, status, and a deletion
    # (TrainingJobs carry no finalizer: their workers go with them by owner reference)
    for argv in (
        ("label", "trainingjob", "before", "team=a"),
        ("annotate", "trainingjob", "before", "note=x"),
        ("scale", "trainingjob/before", "--replicas=1"),
        ("patch", "trainingjob", "before", "--subresource=status", "--type=merge",
         "-p", json.dumps({"status": {"phase": "Waiting"}})),
        ("delete", "trainingjob", "before", "--wait=false"),
    ):  # fmt: skip
        done = _kubectl(kube_cluster, "-n", namespace, *argv)
        assert done.returncode == 0, (argv, done.stderr)
    gone = _kubectl(kube_cluster, "get", "-n", namespace, "trainingjob", "before")
    assert "NotFound" in gone.stderr

    # failurePolicy Ignore (the chart's webhook.failurePolicy=Ignore): admitted unchecked
    assert kube_cluster.local is not None
    kube_cluster.local.register_webhooks(failure_policy="Ignore", wait=False)
    gpus = {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    bad = _job("unchecked", template={"spec": {"containers": [gpus]}})  # the webhook denies it

    def admitted() -> bool:
        return bool(_apply(kube_cluster, namespace, bad).returncode == 0)

    wait_for(admitted, 60, "the API server to apply failurePolicy Ignore")
    stored = _get(kube_cluster, namespace, "trainingjob", "unchecked")["spec"]
    assert "restart" not in stored  # the defaulting webhook was skipped too
