"""A tenant tries to forge GPU assignments on the real API server (issue 20, docs/security.md).

The tenant is a ServiceAccount with a Role for pods (and pods/status) in its own
namespace only; it runs kubectl with a TokenRequest token. The admission policy
(manifests/security/assignment-policy.yaml, installed by the local cluster) must
refuse every write of `chronotope.dev/assigned-*` / `handshake` that does not come
from the scheduler, let everything else through, and the real scheduler must keep
binding pods with assignments, nothing double-booked.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from chronotope.sharing.assignment import (
    ASSIGNED_COMPUTE_PERCENT,
    ASSIGNED_GPU_UUIDS,
    ASSIGNED_GPUS,
    ASSIGNED_MEMORY_MIB,
    HANDSHAKE,
    GpuAssignment,
)
from e2e.kubetest import KubeCluster, wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
SHARE = "chronotope.dev/gpu-share"
DENIED = "only the chronotope scheduler"
NODE = "l4-000"
SQUATTED = "l4-001"
HOSTNAME = "kubernetes.io/hostname"


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, check=False, input=stdin, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tenant(kube_cluster: KubeCluster, namespace: str, tmp_path: Path) -> list[str]:
    """kubectl as a namespaced user: pods (and pods/status) in `namespace`, nothing else."""
    from chronotope.devcluster.identities import token_kubeconfig
    from chronotope.kube.rbac import request_token

    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tenant"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "pods/status"],
                    "verbs": ["create", "get", "list", "watch", "patch", "update", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
    ]
    kube_cluster.run_kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(rbac))
    user = f"system:serviceaccount:{namespace}:tenant"
    with kube_cluster.api_client() as api:
        token = request_token(api, namespace, "tenant", 3600)
    admin = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    path = tmp_path / "tenant.kubeconfig"
    path.write_text(yaml.safe_dump(token_kubeconfig(admin, user, token)))
    argv = [kube_cluster.kubectl[0], "--kubeconfig", str(path), "-n", namespace]
    # RBAC is what we think it is: pods here, not elsewhere, no bindings
    assert _run([*argv, "auth", "can-i", "create", "pods"]).stdout.strip() == "yes"
    assert _run([*argv, "auth", "can-i", "create", "pods", "-n", "default"]).stdout.strip() == "no"
    can_bind = _run([*argv, "auth", "can-i", "create", "pods", "--subresource=binding"])
    assert can_bind.stdout.strip() == "no"
    return argv


def _pod(
    name: str,
    annotations: dict[str, str] | None = None,
    *,
    gpus: int = 0,
    share: int = 0,
    node: str | None = None,
    pinned: str | None = None,
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    notes = dict(annotations or {})
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if share:
        limits[SHARE] = "1"
        notes |= {
            "chronotope.dev/gpu-compute-percent": str(share),
            "chronotope.dev/gpu-memory-mib": "4000",
        }
    spec: dict[str, Any] = {
        "schedulerName": "chronotope",
        "containers": [
            {"name": "c", "image": "registry.example/x:1", "resources": {"limits": limits}}
        ],
    }
    if node:
        spec |= {"nodeName": node, "schedulerName": "default-scheduler"}
    if pinned:
        spec["nodeSelector"] = {HOSTNAME: pinned}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": notes},
        "spec": spec,
    }


def _create(kubectl: list[str], pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return _run([*kubectl, "create", "-f", "-"], stdin=json.dumps(pod))


def _denied(out: subprocess.CompletedProcess[str], *named: str) -> None:
    assert out.returncode != 0, out.stdout
    assert DENIED in out.stderr, out.stderr
    assert "ValidatingAdmissionPolicy" in out.stderr, out.stderr
    for key in named:
        assert key in out.stderr, (key, out.stderr)


def _policy_in_effect(kubectl: list[str]) -> bool:
    """The policy is enforced once the API server's policy cache has it (seconds after up)."""
    probe = _pod("probe", {ASSIGNED_GPUS: "0"})
    out = _run([*kubectl, "create", "--dry-run=server", "-f", "-"], stdin=json.dumps(probe))
    return DENIED in out.stderr


def _assignment(core: client.CoreV1Api, namespace: str, name: str) -> GpuAssignment | None:
    pod = core.read_namespaced_pod(name, namespace)
    if not pod.spec.node_name:
        return None
    return GpuAssignment.from_annotations(pod.metadata.annotations or {})


def test_the_local_policy_is_the_charts(kube_cluster: KubeCluster) -> None:
    from chronotope.devcluster.binaries import ensure_binaries

    assert kube_cluster.local is not None
    helm = ensure_binaries(kube_cluster.local.settings, build=False).helm
    argv = [str(helm), "template", "chronotope", str(ROOT / "charts" / "chronotope")]
    argv += ["--namespace", "chronotope-system", "--kube-version", "1.33.0"]
    rendered = _run([*argv, "--show-only", "templates/assignment-policy.yaml"])
    assert rendered.returncode == 0, rendered.stderr
    local = ROOT / "manifests" / "security" / "assignment-policy.yaml"

    def essence(text: str) -> list[tuple[str, str, Any]]:
        docs = [d for d in yaml.safe_load_all(text) if d]
        return [(d["kind"], d["metadata"]["name"], d["spec"]) for d in docs]

    assert essence(local.read_text()) == essence(rendered.stdout), (
        "manifests/security/assignment-policy.yaml drifted from the chart: regenerate it "
        "(the command is in its header)"
    )


def test_a_tenant_cannot_create_pods_that_carry_an_assignment(
    kube_cluster: KubeCluster, namespace: str, tenant: list[str]
) -> None:
    wait_for(lambda: _policy_in_effect(tenant), 60, "the assignment policy enforced")
    # 1. a whole-GPU pod that presets the share keys (kept by the binder's merge before)
    forged = {ASSIGNED_COMPUTE_PERCENT: "1", ASSIGNED_MEMORY_MIB: "1"}
    _denied(_create(tenant, _pod("whole", forged, gpus=1)), *forged)
    # 2. a pre-bound squatter claiming all four GPUs of a node, with no GPU request
    squat = _pod("squat", {ASSIGNED_GPUS: "0,1,2,3"}, node=NODE)
    _denied(_create(tenant, squat), ASSIGNED_GPUS)
    # the handshake is part of the assignment: the device plugin finds pods by it
    _denied(_create(tenant, _pod("hs", {HANDSHAKE: "abc"}, share=50)), HANDSHAKE)
    # a share pod that skips the scheduler: pre-bound to a node, or for another scheduler
    # (the device plugin would answer it with whichever pod holds the node's lock)
    skips = "must be placed by the chronotope scheduler"
    for pod in (
        _pod("preset", share=50, node=NODE),
        _pod("preset-ours", share=50) | {"spec": _pod("x", share=50)["spec"] | {"nodeName": NODE}},
        _pod("other", share=50) | {"spec": _pod("x", share=50)["spec"] | {"schedulerName": "x"}},
    ):
        out = _create(tenant, pod)
        assert out.returncode != 0, out.stdout
        assert skips in out.stderr, out.stderr
    names = _run([*tenant, "get", "pods", "-o", "name"])
    assert names.returncode == 0, names.stderr
    assert names.stdout.strip() == ""  # nothing was created

    # no false positives: ordinary pods and annotations, created and changed by the tenant
    ok = _create(tenant, _pod("plain", {"team.example/owner": "a", "chronotope.dev/x": "1"}))
    assert ok.returncode == 0, ok.stderr
    patched = _run([*tenant, "annotate", "pod", "plain", "team.example/owner=b", "--overwrite"])
    assert patched.returncode == 0, patched.stderr
    removed = _run([*tenant, "annotate", "pod", "plain", "chronotope.dev/x-"])
    assert removed.returncode == 0, removed.stderr
    # ...but adding an assignment later is refused, through the pod and through pods/status
    _denied(_run([*tenant, "annotate", "pod", "plain", f"{ASSIGNED_GPUS}=0"]))
    status_patch = json.dumps({"metadata": {"annotations": {ASSIGNED_GPUS: "0"}}})
    via_status = [*tenant, "patch", "pod", "plain", "--subresource=status", "-p", status_patch]
    _denied(_run(via_status))
    annotations = json.loads(_run([*tenant, "get", "pod", "plain", "-o", "json"]).stdout)
    assert annotations["metadata"]["annotations"] == {"team.example/owner": "b"}


@pytest.mark.timeout(600)
def test_a_tenant_cannot_change_the_schedulers_assignment_and_nothing_is_double_booked(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str, tenant: list[str]
) -> None:
    wait_for(lambda: _policy_in_effect(tenant), 60, "the assignment policy enforced")
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        # the tenant's own share pod, bound by the real scheduler with its assignment
        created = _create(tenant, _pod("mine", share=50, pinned=NODE))
        assert created.returncode == 0, created.stderr
        mine = wait_for(lambda: _assignment(core, namespace, "mine"), 90, "mine bound")
        assert (mine.node, mine.compute_percent, mine.memory_mib) == (NODE, 50, 4000)

        # 3. after binding: move the assignment to another GPU, drop the limits: refused
        other = (mine.gpu_indices[0] + 1) % 4
        moved = [f"{ASSIGNED_GPUS}={other}", f"{ASSIGNED_GPU_UUIDS}=GPU-{NODE}-{other}"]
        _denied(_run([*tenant, "annotate", "pod", "mine", "--overwrite", *moved]))
        unlimited = [f"{ASSIGNED_COMPUTE_PERCENT}-", f"{ASSIGNED_MEMORY_MIB}-"]
        _denied(_run([*tenant, "annotate", "pod", "mine", *unlimited]))
        replaced = json.loads(_run([*tenant, "get", "pod", "mine", "-o", "json"]).stdout)
        replaced["metadata"]["annotations"].pop(ASSIGNED_COMPUTE_PERCENT)
        _denied(_run([*tenant, "replace", "-f", "-"], stdin=json.dumps(replaced)))
        # other annotations of the bound pod stay the tenant's to change
        note = _run([*tenant, "annotate", "pod", "mine", "team.example/owner=a"])
        assert note.returncode == 0, note.stderr
        assert _assignment(core, namespace, "mine") == mine

        # the ledger stays right: the other half of the GPU and the three free GPUs are
        # placed, with nothing double-booked on the node
        placed = {"mine": mine}
        created = _create(tenant, _pod("half", share=50, pinned=NODE))
        assert created.returncode == 0, created.stderr
        placed["half"] = wait_for(lambda: _assignment(core, namespace, "half"), 90, "half bound")
        for name in ("w1", "w2", "w3"):
            created = _create(tenant, _pod(name, gpus=1, pinned=NODE))
            assert created.returncode == 0, created.stderr
        for name in ("w1", "w2", "w3"):
            placed[name] = wait_for(
                functools.partial(_assignment, core, namespace, name), 90, f"{name} bound"
            )
    assert placed["half"].gpu_indices == mine.gpu_indices  # the two halves fill one GPU
    whole = [placed[n].gpu_indices[0] for n in ("w1", "w2", "w3")]
    assert sorted([*whole, mine.gpu_indices[0]]) == [0, 1, 2, 3]


@pytest.mark.timeout(600)
def test_the_ledger_ignores_assignments_on_pods_of_other_schedulers(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    """An admin may write assignments (the policy trusts system:masters); the ledger still
    counts a pod of another scheduler by its requests, so a squatter blocks nothing."""
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        forged = GpuAssignment(
            node=SQUATTED,
            gpu_indices=(0, 1, 2, 3),
            gpu_uuids=tuple(f"GPU-{SQUATTED}-{i}" for i in range(4)),
            memory_mib=None,
            compute_percent=None,
            handshake="squat",
        )
        squat = _pod("squat", forged.to_annotations(), node=SQUATTED)
        core.create_namespaced_pod(namespace, squat)
        # a restart rebuilds the ledger from the cluster's pods, the squatter among them
        assert kube_cluster.local is not None
        kube_cluster.local.restart_extender(chronotope_scheduler)
        core.create_namespaced_pod(namespace, _pod("share", share=50, pinned=SQUATTED))
        share = wait_for(lambda: _assignment(core, namespace, "share"), 90, "share bound")
    assert share.node == SQUATTED
