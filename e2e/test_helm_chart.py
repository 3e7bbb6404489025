"""The Helm chart: lint, render with several value sets and have the real API server
validate the output, install and uninstall cleanly, and least-privilege RBAC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.kubetest import KubeCluster, wait_for

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "chronotope"


def _helm(cluster: KubeCluster) -> str:
    from chronotope.devcluster.binaries import ensure_binaries

    assert cluster.local is not None
    return str(ensure_binaries(cluster.local.settings, build=False).helm)


def _run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def _server_version(cluster: KubeCluster) -> str:
    out = _run(*cluster.kubectl, "version", "-o", "json")
    return str(json.loads(out.stdout)["serverVersion"]["gitVersion"]).lstrip("v")


def test_the_chart_crds_are_the_generated_ones() -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert (CHART / "crds" / path.name).read_text() == path.read_text(), (
            f"charts/chronotope/crds/{path.name} drifted: cp crds/*.yaml charts/chronotope/crds/"
        )


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="defaults"),
        pytest.param(
            ["--set", "devicePlugin.enabled=false", "--set", "operator.dashboardPort=8090"],
            id="no-device-plugin-dashboard",
        ),
        pytest.param(
            ["--set", "scheduler.kubeSchedulerImage=registry.example/ks:v1.33.0"], id="pinned"
        ),
    ],
)
def test_lint_and_render_are_accepted_by_the_api_server(
    kube_cluster: KubeCluster, values: list[str]
) -> None:
    helm = _helm(kube_cluster)
    lint = _run(helm, "lint", "--strict", str(CHART), *values)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    version = _server_version(kube_cluster)
    rendered = _run(
        helm,
        "template",
        "t",
        str(CHART),
        "--namespace",
        "default",
        "--kube-version",
        version,
        *values,
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    sched = next(
        d for d in docs if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    )
    image = sched["spec"]["template"]["spec"]["containers"][0]["image"]
    if "kubeSchedulerImage" not in str(values):
        major_minor = ".".join(version.split(".")[:2])
        assert image.startswith(f"registry.k8s.io/kube-scheduler:v{major_minor}.")
    applied = _run(
        *kube_cluster.kubectl, "apply", "--dry-run=server", "-f", "-", stdin=rendered.stdout
    )
    assert applied.returncode == 0, applied.stderr


def test_values_with_unknown_keys_or_wrong_types_are_refused(kube_cluster: KubeCluster) -> None:
    helm = _helm(kube_cluster)
    for bad in (
        ["--set", "operator.replicas=2"],
        ["--set", "nosuch=1"],
        ["--set", "devicePlugin.enabled=maybe"],
    ):
        out = _run(helm, "template", "t", str(CHART), "--kube-version", "1.33.0", *bad)
        assert out.returncode != 0, bad
        assert "values don't meet the specifications of the schema" in out.stderr


def test_install_rbac_and_uninstall(kube_cluster: KubeCluster, namespace: str) -> None:
    helm = _helm(kube_cluster)
    env_kube = ["--kubeconfig", str(kube_cluster.kubeconfig)]
    release = f"r{namespace[-6:]}"
    installed = _run(helm, *env_kube, "install", release, str(CHART), "--namespace", namespace)
    assert installed.returncode == 0, installed.stderr

    def can(sa: str, *what: str) -> bool:
        out = _run(
            *kube_cluster.kubectl,
            "auth",
            "can-i",
            *what,
            f"--as=system:serviceaccount:{namespace}:{release}-{sa}",
        )
        return out.stdout.strip() == "yes"

    assert can("operator", "create", "pods", "-n", "default")
    assert can("operator", "patch", "trainingjobs.chronotope.dev", "--subresource=status", "-A")
    assert can("operator", "patch", "configmaps", "-n", "default")  # placement ConfigMaps
    assert can("operator", "update", "deployments.apps", "-n", "default")  # serving groups
    assert not can("operator", "delete", "configmaps", "-n", "default")
    assert not can("operator", "get", "secrets", "-A")
    assert not can("operator", "get", "secrets", "-n", namespace)
    assert not can("operator", "delete", "nodes")
    assert can("scheduler", "create", "pods", "--subresource=binding", "-n", "default")
    assert not can("scheduler", "create", "pods", "-n", "default")
    assert not can("scheduler", "get", "secrets", "-A")
    assert can("device-plugin", "patch", "nodes")
    assert not can("device-plugin", "create", "pods", "-n", "default")
    assert not can("device-plugin", "create", "pods", "--subresource=binding", "-n", "default")
    upgraded = _run(
        helm,
        *env_kube,
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "devicePlugin.enabled=false",
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert not can("device-plugin", "patch", "nodes")  # its role went with the DaemonSet
    rolled = _run(helm, *env_kube, "rollback", release, "1", "--namespace", namespace)
    assert rolled.returncode == 0, rolled.stderr
    assert can("device-plugin", "patch", "nodes")
    removed = _run(helm, *env_kube, "uninstall", release, "--namespace", namespace, "--wait")
    assert removed.returncode == 0, removed.stderr

    def leftovers() -> list[str]:
        out = _run(
            *kube_cluster.kubectl,
            "get",
            "clusterroles,clusterrolebindings,deployments,daemonsets,serviceaccounts,configmaps,services",
            "-A",
            "-l",
            f"app.kubernetes.io/instance={release}",
            "-o",
            "name",
        )
        return [line for line in out.stdout.splitlines() if line]

    wait_for(lambda: leftovers() == [], 60, "no orphaned objects")
