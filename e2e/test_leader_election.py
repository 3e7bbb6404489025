"""Operator leader election on the real API server: one Lease, one writer.

Operators started here with `--leader-elect` use a Lease of their own (a fresh
id in the test's namespace) and their own metrics ports, so what each process
does is told apart by its Lease holder name, its `chronotope_operator_leader`
gauge and its own reconcile counter, whatever else runs on the cluster (the
session's operator, if another test started it, reconciles too; it does not
touch this Lease or these processes' metrics).
"""

from __future__ import annotations

import os
import signal
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from chronotope.devcluster.process import Started, free_port
from e2e.kubetest import KubeCluster, wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
GROUP, VERSION = "chronotope.dev", "v1alpha1"
TAKEOVER_S = 90
"""Generous bound for a standby to take over (lease 15 s + retry 2 s + process start)."""


@dataclass
class Operator:
    """One operator process started by this test."""

    component: str
    identity: str
    started: Started
    metrics_port: int

    def log(self) -> str:
        return self.started.log.read_text(errors="replace")

    def metric(self, name: str) -> float | None:
        """The sum of the samples of `name` on this process's /metrics (None: no sample)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ")
        ]
        return sum(values) if values else None

    def exit_code(self, timeout: float = 60) -> int:
        assert self.started.popen is not None
        return self.started.popen.wait(timeout)


@pytest.fixture
def election(kube_cluster: KubeCluster, namespace: str) -> Any:
    """Start operators that elect a leader on a Lease of their own; all stopped afterwards."""
    local = kube_cluster.local
    if local is None:
        pytest.skip("needs the cluster the tests start (unset CHRONOTOPE_TEST_KUBECONFIG)")
    from chronotope.kube.client import api_client
    from chronotope.kube.crds import install_crds

    crds = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    with api_client(kube_cluster.kubeconfig) as api:
        install_crds(api, crds)
    lease = f"le-{uuid.uuid4().hex[:8]}"
    started: list[Operator] = []

    def start(tag: str) -> Operator:
        health, metrics = free_port(), free_port()
        identity = f"{lease}-{tag}"
        component = f"leader-election-{tag}"
        proc = local.start_component(
            component,
            [
                sys.executable,
                "-m",
                "chronotope",
                "operator",
                "--kubeconfig",
                str(kube_cluster.kubeconfig),
                "--interval",
                "1",
                "--health-port",
                str(health),
                "--metrics-port",
                str(metrics),
                "--metrics-address",
                "127.0.0.1",
                "--leader-elect",
                "--leader-election-namespace",
                namespace,
                "--leader-election-id",
                lease,
                "--leader-election-identity",
                identity,
            ],
            f"http://127.0.0.1:{health}/healthz",  # a standby answers it too
        )
        op = Operator(component, identity, proc, metrics)
        started.append(op)
        return op

    try:
        yield start, lease
    finally:
        for op in started:
            local.stop_component(op.component)


def _lease(kube_cluster: KubeCluster, namespace: str, name: str) -> dict[str, Any] | None:
    with kube_cluster.api_client() as api:
        try:
            lease = client.CoordinationV1Api(api).read_namespaced_lease(name, namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
    return {"holder": lease.spec.holder_identity or "", "transitions": lease.spec.lease_transitions}


def _holder(kube_cluster: KubeCluster, namespace: str, name: str) -> str:
    lease = _lease(kube_cluster, namespace, name)
    return lease["holder"] if lease else ""


def _impossible_job(kube_cluster: KubeCluster, namespace: str) -> None:
    job = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": "le-probe"},
        "spec": {
            "replicas": 1,
            "gpu": {"count": 1},
            "gpuTypes": [{"name": "LEADER-ELECTION-GPU", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "LEADER-ELECTION-GPU", "durationSeconds": 3600},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
    }
    with kube_cluster.api_client() as api:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "trainingjobs", job
        )


RECONCILES = "chronotope_trainingjob_reconcile_seconds_count"
LEADER = "chronotope_operator_leader"


def test_one_leader_reconciles_and_a_standby_takes_over(
    kube_cluster: KubeCluster, namespace: str, election: Any
) -> None:
    start, lease = election
    a, b = start("a"), start("b")
    holder = wait_for(
        lambda: _holder(kube_cluster, namespace, lease), 60, "one operator to hold the Lease"
    )
    leader, standby = (a, b) if holder == a.identity else (b, a)
    assert holder == leader.identity
    wait_for(lambda: leader.metric(LEADER) == 1, 30, "the leader's gauge at 1")
    assert standby.metric(LEADER) == 0
    wait_for(lambda: "standing by as" in standby.log(), 30, "the standby to say it waits")

    # only the leader runs the controllers: its reconcile counter moves, the standby's has none
    _impossible_job(kube_cluster, namespace)
    wait_for(lambda: (leader.metric(RECONCILES) or 0) > 0, 60, "the leader to reconcile")
    assert standby.metric(RECONCILES) is None
    assert "starting the controllers" not in standby.log()
    before = _lease(kube_cluster, namespace, lease)
    assert before is not None

    # the leader dies without releasing: the standby waits out the lease, then leads
    os.killpg(leader.started.pid, signal.SIGKILL)
    assert leader.exit_code() == -signal.SIGKILL
    wait_for(
        lambda: _holder(kube_cluster, namespace, lease) == standby.identity,
        TAKEOVER_S,
        "the standby to take the Lease",
    )
    after = _lease(kube_cluster, namespace, lease)
    assert after is not None
    assert after["transitions"] == before["transitions"] + 1
    wait_for(lambda: "starting the controllers" in standby.log(), 30, "the standby to start")
    wait_for(lambda: standby.metric(LEADER) == 1, 30, "the new leader's gauge at 1")
    wait_for(lambda: (standby.metric(RECONCILES) or 0) > 0, 60, "the new leader to reconcile")


def test_sigterm_releases_and_a_stolen_lease_stops_the_leader(
    kube_cluster: KubeCluster, namespace: str, election: Any
) -> None:
    start, lease = election
    first = start("first")
    wait_for(lambda: _holder(kube_cluster, namespace, lease) == first.identity, 60, "first to lead")
    second = start("second")
    wait_for(lambda: "standing by as" in second.log(), 30, "second to stand by")

    # SIGTERM: the controllers stop, then the Lease is handed back before the process ends
    os.killpg(first.started.pid, signal.SIGTERM)
    assert first.exit_code() == 0
    assert _holder(kube_cluster, namespace, lease) != first.identity
    assert "released Lease" in first.log()
    wait_for(
        lambda: _holder(kube_cluster, namespace, lease) == second.identity, 30, "second to lead"
    )
    wait_for(lambda: "starting the controllers" in second.log(), 30, "second to start")

    # someone else writes the Lease: the leader must stop writing at once, non-zero
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with kube_cluster.api_client() as api:
        client.CoordinationV1Api(api).patch_namespaced_lease(
            lease, namespace, {"spec": {"holderIdentity": "intruder", "renewTime": now}}
        )
    assert second.exit_code() == 1
    assert "lost Lease" in second.log()
