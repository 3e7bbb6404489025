"""The components run under the Helm chart's ServiceAccounts, and those are restricted.

The session fixtures (conftest: `chart_identities`) apply the chart's
ServiceAccounts and RBAC and start the extender, its kube-scheduler and the
operator with one token kubeconfig per component. Here: the running processes
really use those kubeconfigs, the API server authenticates each token as the
chart's ServiceAccount (SelfSubjectReview, `kubectl auth whoami`), and each
identity is refused what its component must never do (`kubectl auth can-i`
with the token itself, not `--as` impersonation). Every other e2e flow runs
under these identities, which proves the chart's RBAC grants enough.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubetest import KubeCluster, kubectl_binary, wait_for

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def identities(chart_identities: Any, chronotope_operator: int) -> Any:
    """The identities, with the extender, kube-scheduler and operator running under them."""
    if chart_identities is None:
        pytest.skip("CHRONOTOPE_TEST_ADMIN=1: the components run as cluster-admin")
    return chart_identities


def _kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _argv(cluster: KubeCluster, component: str) -> list[str]:
    state = cluster.local.load_state()
    [pid] = [p["pid"] for p in state.processes if p["name"] == component]
    return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")


def _flag(argv: list[str], flag: str) -> str:
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {argv}")


@pytest.mark.parametrize("component", ["operator", "scheduler", "device-plugin"])
def test_each_token_is_the_charts_service_account(identities: Any, component: str) -> None:
    path = identities.kubeconfig(component)
    config = yaml.safe_load(path.read_text())
    # only the token: no client certificate of the admin kubeconfig came along
    assert [set(u["user"]) for u in config["users"]] == [{"token"}]
    assert path.stat().st_mode & 0o077 == 0
    out = _kubectl(path, "auth", "whoami", "-o", "json")
    assert out.returncode == 0, out.stderr
    user = json.loads(out.stdout)["status"]["userInfo"]
    sa = f"{identities.release}-{component}"
    assert user["username"] == f"system:serviceaccount:{identities.namespace}:{sa}"
    assert "system:serviceaccounts" in user["groups"]
    assert "system:masters" not in user["groups"]


def test_the_running_processes_use_the_identity_kubeconfigs(
    kube_cluster: KubeCluster, identities: Any
) -> None:
    operator = identities.kubeconfig("operator")
    scheduler = identities.kubeconfig("scheduler")
    assert _flag(_argv(kube_cluster, "chronotope-operator"), "--kubeconfig") == str(operator)
    assert _flag(_argv(kube_cluster, "chronotope-extender"), "--kubeconfig") == str(scheduler)
    ks = _argv(kube_cluster, "chronotope-kube-scheduler")
    assert _flag(ks, "--authentication-kubeconfig") == str(scheduler)
    assert _flag(ks, "--authorization-kubeconfig") == str(scheduler)
    config = yaml.safe_load(Path(_flag(ks, "--config")).read_text())
    assert config["clientConnection"]["kubeconfig"] == str(scheduler)


# (component, can-i arguments, allowed): what each component needs, and what it must not do
CHECKS = [
    ("operator", ("create", "pods", "-n", "default"), True),
    ("operator", ("patch", "trainingjobs.chronotope.dev", "--subresource=status", "-A"), True),
    ("operator", ("watch", "persistentvolumes"), True),
    ("operator", ("watch", "storageclasses.storage.k8s.io"), True),
    ("operator", ("watch", "csistoragecapacities.storage.k8s.io"), True),
    ("operator", ("watch", "csidrivers.storage.k8s.io"), True),
    ("operator", ("create", "csistoragecapacities.storage.k8s.io"), False),
    ("operator", ("watch", "csinodes.storage.k8s.io"), True),
    ("operator", ("watch", "volumeattachments.storage.k8s.io"), True),
    ("operator", ("create", "csinodes.storage.k8s.io"), False),
    ("operator", ("watch", "runtimeclasses.node.k8s.io"), True),
    ("operator", ("create", "runtimeclasses.node.k8s.io"), False),
    ("operator", ("create", "persistentvolumeclaims", "-n", "default"), False),
    ("operator", ("get", "secrets", "-A"), False),
    ("operator", ("get", "secrets", "-n", "default"), False),
    ("operator", ("list", "secrets", "-n", "chronotope-system"), False),
    ("operator", ("create", "customresourcedefinitions.apiextensions.k8s.io"), False),
    ("operator", ("create", "serviceaccounts", "--subresource=token", "-n", "default"), False),
    ("scheduler", ("create", "pods", "--subresource=binding", "-n", "default"), True),
    ("scheduler", ("create", "pods", "-n", "default"), False),
    # (it may delete pods: preemption, from the built-in system:kube-scheduler role)
    ("scheduler", ("create", "deployments.apps", "-n", "default"), False),
    ("scheduler", ("patch", "trainingjobs.chronotope.dev", "-A"), False),
    ("scheduler", ("get", "secrets", "-A"), False),
    ("device-plugin", ("patch", "nodes"), True),
    ("device-plugin", ("create", "pods", "--subresource=binding", "-n", "default"), False),
    ("device-plugin", ("create", "pods", "-n", "default"), False),
    ("device-plugin", ("get", "secrets", "-A"), False),
]
# nobody deletes nodes or grants itself more (escalation through RBAC objects)
for _component in ("operator", "scheduler", "device-plugin"):
    CHECKS += [
        (_component, ("delete", "nodes"), False),
        (_component, ("create", "clusterrolebindings.rbac.authorization.k8s.io"), False),
        (_component, ("create", "rolebindings.rbac.authorization.k8s.io", "-n", "default"), False),
        (_component, ("escalate", "clusterroles.rbac.authorization.k8s.io"), False),
        (_component, ("bind", "clusterroles.rbac.authorization.k8s.io"), False),
        (_component, ("impersonate", "serviceaccounts", "-A"), False),
    ]


@pytest.mark.parametrize(
    ("component", "what", "allowed"),
    CHECKS,
    ids=[f"{c} {'may' if a else 'may-not'} {' '.join(w)}" for c, w, a in CHECKS],
)
def test_what_each_identity_may_and_may_not_do(
    identities: Any, component: str, what: tuple[str, ...], allowed: bool
) -> None:
    out = _kubectl(identities.kubeconfig(component), "auth", "can-i", *what)
    answer = out.stdout.strip()
    assert answer in ("yes", "no"), out.stdout + out.stderr
    assert (answer == "yes") is allowed, f"{component} can-i {' '.join(what)}: {answer}"


def test_the_restricted_scheduler_binds_a_pod(
    kube_cluster: KubeCluster, identities: Any, namespace: str
) -> None:
    # kube-scheduler and the extender's binder, both under the scheduler identity
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "as-sa"},
        "spec": {
            "schedulerName": "chronotope",
            "containers": [{"name": "c", "image": "fake", "resources": {"requests": {"cpu": "1"}}}],
        },
    }
    kube_cluster.run_kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def node() -> str:
        return kube_cluster.run_kubectl(
            "get", "pod", "as-sa", "-n", namespace, "-o", "jsonpath={.spec.nodeName}"
        ).strip()

    assert wait_for(node, 120, "the pod bound by the chronotope scheduler")


def test_applying_again_replaces_the_objects_and_mints_fresh_tokens(
    kube_cluster: KubeCluster, identities: Any
) -> None:
    before = identities.kubeconfig("operator").read_text()
    again = kube_cluster.local.chart_identities(identities.release, identities.namespace)
    assert again == identities
    assert identities.kubeconfig("operator").read_text() != before  # a new token
    out = _kubectl(again.kubeconfig("operator"), "auth", "whoami", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"]["userInfo"]["username"] == again.username("operator")
