"""The real extender says a repeated line once: an unschedulable pod's "fits no node" line
is not logged on every retry (issue 20: 552 times in 10 minutes), even when its text
alternates between retries (chronotope.ratelimit's filter on the process's log)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e.kubetest import KubeCluster, wait_for
from e2e.test_extender import gpu_pod

pytestmark = pytest.mark.cluster

RETRIES = 30


def _filter(port: int, context: Any, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """One /filter call as kube-scheduler makes it (HTTPS, its client certificate)."""
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/filter",
        data=json.dumps({"Pod": pod, "NodeNames": nodes}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30, context=context) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def _lines(log: Path, key: str) -> list[str]:
    return [
        line
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
        if f"pod {key} " in line and "fits no node" in line
    ]


def test_an_unschedulable_pods_line_is_logged_once_not_per_retry(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    assert kube_cluster.local is not None
    log = kube_cluster.local.directory / "logs" / "chronotope-extender.log"
    caller = kube_cluster.local.extender_pki().client_context()  # kube-scheduler's certificate
    pod = gpu_pod("too-much-memory", share=(10, 500_000))
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        created = core.create_namespaced_pod(namespace, pod)  # kube-scheduler retries it too
        nodes = sorted(n.metadata.name for n in core.list_node().items)
    body = api.sanitize_for_serialization(created)
    key = f"{namespace}/too-much-memory"
    # the extender is asked again and again, and about two node sets in turn, so the
    # line's text alternates ("1 node(s): ..." / "N node(s): ..."): the service's own
    # once-per-pod memory would say it on every call, the log filter once per text
    for i in range(RETRIES):
        out = _filter(chronotope_scheduler, caller, body, nodes[:1] if i % 2 else nodes)
        assert not out.get("NodeNames"), out  # fits no node, every time
    lines = wait_for(lambda: _lines(log, key) or None, 30, "the fits-no-node line")
    texts = {line.split(" fits no node: ", 1)[1] for line in lines}
    # both node sets were reported (kube-scheduler's own retries may add a third text,
    # for the nodes it passed), each text once, not once per retry
    assert sum(t.startswith("1 node(s): ") for t in texts) == 1, lines
    assert len(texts) >= 2, lines
    assert len(lines) == len(texts), "\n".join(lines)
    assert all("< requested 500000 MiB" in text for text in texts), texts
