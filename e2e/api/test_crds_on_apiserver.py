"""The generated CRDs on the real kube-apiserver: samples round-trip, bad input is
rejected naming the field, and kubectl shows explain text, columns, categories and scale."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chronotope.api.v1alpha1 import MODELS
from e2e.kubetest import KubeCluster, wait_for

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO_ROOT / "manifests" / "samples").glob("*.yaml"))
INVALID = sorted((REPO_ROOT / "tests" / "fixtures" / "invalid").glob("*.yaml"))


def _sample_docs() -> list[Any]:
    params = []
    for path in SAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            params.append(pytest.param(doc, id=f"{path.stem}/{doc['metadata']['name']}"))
    return params


def _expectations(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        if line.startswith("# expect-"):
            key, _, value = line[len("# expect-") :].partition(":")
            found[key.strip()] = value.strip()
    return found


def _kubectl(
    cluster: KubeCluster, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cluster.kubectl, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture(autouse=True)
def _no_queue_left(kube_cluster: KubeCluster) -> Iterator[None]:
    """Delete the sample Queues a test applied: they are cluster-scoped, so they outlive the
    namespace, and while any Queue exists every other test's TrainingJobs need a LocalQueue."""
    yield
    docs = [p.values[0] for p in _sample_docs()]
    names = sorted({d["metadata"]["name"] for d in docs if d["kind"] == "Queue"})
    _kubectl(kube_cluster, "delete", "queue", *names, "--ignore-not-found", "--wait=false")


def _apply(cluster: KubeCluster, namespace: str, doc: dict[str, Any]) -> None:
    result = _kubectl(
        cluster, "apply", "--server-side", "--field-manager=chronotope-tests", "-n", namespace,
        "-f", "-", stdin=yaml.safe_dump(doc),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def _get(cluster: KubeCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result = _kubectl(cluster, "get", "-n", namespace, kind, name, "-o", "json")
    assert result.returncode == 0, result.stderr
    got: dict[str, Any] = json.loads(result.stdout)
    return got


def _contains(stored: Any, sent: Any, path: str = "spec") -> None:
    """Everything sent is stored unchanged (nothing pruned); the server may add defaults."""
    if isinstance(sent, dict):
        assert isinstance(stored, dict), path
        for key, value in sent.items():
            assert key in stored, f"{path}.{key} was pruned by the API server"
            _contains(stored[key], value, f"{path}.{key}")
    elif isinstance(sent, list):
        assert isinstance(stored, list), path
        assert len(stored) == len(sent), path
        for i, (a, b) in enumerate(zip(stored, sent, strict=True)):
            _contains(a, b, f"{path}[{i}]")
    else:
        assert stored == sent, f"{path}: stored {stored!r}, sent {sent!r}"


@pytest.mark.parametrize("doc", _sample_docs())
def test_sample_round_trips(
    kube_cluster: KubeCluster, chronotope_crds: list[str], namespace: str, doc: dict[str, Any]
) -> None:
    model = MODELS[doc["kind"]]
    _apply(kube_cluster, namespace, doc)
    stored = _get(kube_cluster, namespace, doc["kind"], doc["metadata"]["name"])
    _contains(stored["spec"], doc["spec"])
    assert model.model_validate(stored).spec == model.model_validate(doc).spec  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_sample_is_rejected_naming_the_field(
    kube_cluster: KubeCluster, chronotope_crds: list[str], namespace: str, path: Path
) -> None:
    expect = _expectations(path)
    # a create runs the schema and the rules and names the field as the schema does
    result = _kubectl(kube_cluster, "create", "-n", namespace, "-f", str(path))
    assert result.returncode != 0, f"{path.name} was accepted"
    assert f"{expect['field']}:" in result.stderr, result.stderr
    assert expect["message"] in result.stderr, result.stderr
    # server-side apply refuses it too (a wrong type already when it builds the typed patch)
    result = _kubectl(
        kube_cluster, "apply", "--server-side", "--field-manager=chronotope-tests",
        "-n", namespace, "-f", str(path),
    )  # fmt: skip
    assert result.returncode != 0, f"{path.name} was applied"
    assert expect["field"].split("[")[0] in result.stderr, result.stderr


def test_explain_shows_descriptions(kube_cluster: KubeCluster, chronotope_crds: list[str]) -> None:
    def explained() -> str:
        result = _kubectl(kube_cluster, "explain", "trainingjob.spec")
        return result.stdout if result.returncode == 0 else ""

    text = wait_for(explained, timeout=60, what="kubectl explain trainingjob.spec")
    assert "What to train, on which GPUs" in text
    assert "minReplicas" in text
    assert "Fewest workers the job can run with" in text
    deep = _kubectl(kube_cluster, "explain", "tj.spec.gpu.shared.priority").stdout
    assert "BestEffort" in deep


def _status_patch(
    kube_cluster: KubeCluster, namespace: str, kind: str, name: str, status: dict[str, Any]
) -> None:
    result = _kubectl(
        kube_cluster, "patch", "-n", namespace, kind, name, "--subresource=status",
        "--type=merge", "-p", json.dumps({"status": status}),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_get_chronotope_lists_all_kinds_with_columns(
    kube_cluster: KubeCluster, chronotope_crds: list[str], namespace: str
) -> None:
    by_kind = {doc.values[0]["kind"]: doc.values[0] for doc in _sample_docs()}
    for doc in by_kind.values():
        _apply(kube_cluster, namespace, doc)
    job = by_kind["TrainingJob"]["metadata"]["name"]
    status = {
        "phase": "Running",
        "replicas": 4,
        "plan": {"gpuType": "H100-SXM5-80GB", "workers": 4, "totalGpus": 32},
        "conditions": [
            {"type": "Running", "status": "True", "reason": "GangBound",
             "lastTransitionTime": "2030-01-01T00:00:00Z", "message": "all workers bound"},
        ],
    }  # fmt: skip
    _status_patch(kube_cluster, namespace, "trainingjob", job, status)
    stored = MODELS["TrainingJob"].model_validate(_get(kube_cluster, namespace, "tj", job))
    assert stored.status.plan.gpu_type == "H100-SXM5-80GB"  # type: ignore[attr-defined]

    out = _kubectl(kube_cluster, "get", "chronotope", "-n", namespace).stdout
    for doc in by_kind.values():
        assert doc["metadata"]["name"] in out, out
    for header in ("PHASE", "GPUS", "GPU-TYPE", "FINISH", "P99-MS", "SLO-MS", "RESIDENCY", "AGE"):
        assert header in out, out
    job_line = next(line for line in out.splitlines() if job in line)
    assert "Running" in job_line
    assert "H100-SXM5-80GB" in job_line
    assert "32" in job_line
    short = _kubectl(kube_cluster, "get", "tj,ipl,mv", "-n", namespace)
    assert short.returncode == 0, short.stderr


def test_kubectl_scale_resizes_an_elastic_job(
    kube_cluster: KubeCluster, chronotope_crds: list[str], namespace: str
) -> None:
    doc = next(
        d.values[0] for d in _sample_docs() if d.values[0]["metadata"]["name"] == "opt-elastic"
    )
    _apply(kube_cluster, namespace, doc)
    scaled = _kubectl(
        kube_cluster, "scale", "-n", namespace, "trainingjob/opt-elastic", "--replicas=6"
    )
    assert scaled.returncode == 0, scaled.stderr
    assert _get(kube_cluster, namespace, "tj", "opt-elastic")["spec"]["replicas"] == 6
    too_big = _kubectl(kube_cluster, "scale", "-n", namespace, "tj/opt-elastic", "--replicas=40")
    assert too_big.returncode != 0
    assert "spec.replicas" in too_big.stderr
    assert "at most maxReplicas" in too_big.stderr


def test_the_pod_template_is_the_kubernetes_type(
    kube_cluster: KubeCluster, chronotope_crds: list[str], namespace: str
) -> None:
    """The API server treats `spec.template` as a PodTemplateSpec: it refuses or prunes
    unknown fields and defaults as for the type itself (the schema comes from the
    Kubernetes OpenAPI)."""
    doc = next(d.values[0] for d in _sample_docs() if d.values[0]["kind"] == "TrainingJob")
    container = {
        "name": "w",
        "image": "x",
        "imagePullPolcy": "Always",  # a typo: not a field of a container
        "ports": [{"containerPort": 8080}],
        "resources": {"limits": {"cpu": 2, "memory": "1Gi"}},
    }
    doc = {**doc, "spec": {**doc["spec"], "template": {"spec": {"containers": [container]}}}}
    typo = 'unknown field "spec.template.spec.containers[0].imagePullPolcy"'
    create = ("create", "-n", namespace, "-f", "-")
    strict = _kubectl(kube_cluster, *create, stdin=yaml.safe_dump(doc))  # kubectl: Strict
    assert strict.returncode != 0
    assert typo in strict.stderr, strict.stderr
    result = _kubectl(kube_cluster, *create, "--validate=warn", stdin=yaml.safe_dump(doc))
    assert result.returncode == 0, result.stderr
    assert typo in result.stderr, result.stderr
    stored = _get(kube_cluster, namespace, "tj", doc["metadata"]["name"])
    (got,) = stored["spec"]["template"]["spec"]["containers"]
    assert "imagePullPolcy" not in got  # pruned, as the Pod API drops it
    assert got["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]  # the type's default
    assert got["resources"]["limits"] == {"cpu": 2, "memory": "1Gi"}  # int-or-string quantity
