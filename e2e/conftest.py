"""Session fixtures: a real local control plane for every test that asks for one.

`kube_cluster` starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (built from pinned Kubernetes modules) once per test
session, with the demo cluster's simulated GPU nodes, and stops them at the
end. Set CHRONOTOPE_TEST_KUBECONFIG to run the cluster tests against an
already running cluster instead (it is then left alone).

Each test that needs API objects takes `namespace`: a fresh namespace, deleted
afterwards.

The extender, its kube-scheduler, the operator and the device plugins the tests
start run under the Helm chart's ServiceAccounts and RBAC (`chart_identities`),
so every flow also proves the chart grants enough. Set CHRONOTOPE_TEST_ADMIN=1 to
run them as cluster-admin instead (for debugging a failure that may be RBAC).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.kubetest import KubeCluster, kubectl_binary, scratch_namespace

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_SPEC = REPO_ROOT / "manifests" / "clusters" / "demo.yaml"
TUNER_DOWN_DELAY_S = 15.0
"""The operator's InferencePipeline scale-down delay in tests (60 s by default)."""


@pytest.fixture(scope="session")
def cluster_settings(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from chronotope.devcluster.settings import ClusterSettings

    base = ClusterSettings.from_env()
    # state (certs, etcd data, logs) under pytest's tmp dir; binaries from the shared cache
    return ClusterSettings(
        cache_dir=base.cache_dir,
        state_root=tmp_path_factory.mktemp("clusters"),
        bin_dir=base.bin_dir,
    )


@pytest.fixture(scope="session")
def kube_cluster(cluster_settings: Any) -> Iterator[KubeCluster]:
    existing = os.environ.get("CHRONOTOPE_TEST_KUBECONFIG")
    kubectl = kubectl_binary()
    if existing:
        path = Path(existing)
        yield KubeCluster(kubeconfig=path, server="", kubectl=[kubectl, "--kubeconfig", str(path)])
        return
    from chronotope.devcluster.cluster import LocalCluster
    from chronotope.sim.clusterspec import load_spec

    cluster = LocalCluster(cluster_settings, name=f"test-{os.getpid()}")
    state = cluster.up(load_spec(DEMO_SPEC))
    try:
        yield KubeCluster(
            kubeconfig=state.kubeconfig,
            server=state.server,
            kubectl=[kubectl, "--kubeconfig", str(state.kubeconfig)],
            local=cluster,
        )
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def chart_identities(kube_cluster: KubeCluster) -> Any:
    """The chart's ServiceAccounts + RBAC applied, a token kubeconfig each (ChartIdentities).

    None (components run as cluster-admin) with CHRONOTOPE_TEST_ADMIN=1 or on a
    cluster the tests did not start.
    """
    if os.environ.get("CHRONOTOPE_TEST_ADMIN") == "1" or kube_cluster.local is None:
        return None
    return kube_cluster.local.chart_identities()


@pytest.fixture(scope="session")
def device_plugin_kubeconfig(kube_cluster: KubeCluster, chart_identities: Any) -> Path:
    """The kubeconfig a test's `chronotope device-plugin` process runs with."""
    if chart_identities is None:
        return kube_cluster.kubeconfig
    path: Path = chart_identities.kubeconfig("device-plugin")
    return path


@pytest.fixture(scope="session")
def chronotope_scheduler(kube_cluster: KubeCluster, chart_identities: Any) -> int:
    """The Chronotope extender plus a kube-scheduler with the `chronotope` profile; its port."""
    if kube_cluster.local is None:
        raise RuntimeError(
            "extender tests need the cluster the tests start (unset CHRONOTOPE_TEST_KUBECONFIG)"
        )
    port: int = kube_cluster.local.start_chronotope_scheduler(identities=chart_identities)
    return port


@pytest.fixture(scope="session")
def chronotope_operator(
    kube_cluster: KubeCluster, chronotope_scheduler: int, chart_identities: Any
) -> int:
    """The CRDs installed and the Chronotope controllers running (with the scheduler).

    Returns the port of the operator's dashboard (on 127.0.0.1).
    """
    if kube_cluster.local is None:
        raise RuntimeError("operator tests need the cluster the tests start")
    from chronotope.devcluster.process import free_port

    dashboard = free_port()
    kube_cluster.local.start_operator(
        extra_args=(
            "--tuner-down-delay-s",
            str(TUNER_DOWN_DELAY_S),
            "--dashboard-port",
            str(dashboard),
        ),
        identities=chart_identities,
    )
    return dashboard


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:8]}"
    with kube_cluster.api_client() as api, scratch_namespace(client.CoreV1Api(api), name):
        yield name
