"""`kubectl chronotope` through kubectl's plugin mechanism, against the real local cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.kubetest import KubeCluster, wait_for

BIN = str(Path(sys.executable).parent)


def _kubectl(cluster: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl chronotope ARGS` with the plugin on PATH and $KUBECONFIG set (kubectl finds
    plugins only when their name is the first argument, before any flag)."""
    env = os.environ | {
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    return subprocess.run(
        [cluster.kubectl[0], "chronotope", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _gpu_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "chronotope",
            "nodeSelector": {"nvidia.com/gpu.product": "L4"},
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


def test_gpus_why_plan_and_top_show_a_bound_pod(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, _gpu_pod("probe"))
        pod = wait_for(
            lambda: (p := core.read_namespaced_pod("probe", namespace)).spec.node_name and p,
            60,
            "probe bound",
        )
    key = f"{namespace}/probe"
    out = _kubectl(kube_cluster, "gpus", "--gpu-type", "L4", "-o", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    holders = {
        h["pod"]: (n["node"], g["index"])
        for n in data["nodes"]
        for g in n["gpus"]
        for h in g["holders"]
    }
    gpu = int(pod.metadata.annotations["chronotope.dev/assigned-gpus"])
    assert holders[key] == (pod.spec.node_name, gpu)
    assert {n["gpuType"] for n in data["nodes"]} == {"L4"}
    table = _kubectl(kube_cluster, "gpus", "--gpu-type", "L4")
    assert key in table.stdout
    assert "total L4:" in table.stdout

    why = _kubectl(kube_cluster, "why", "pod/probe", "-n", namespace)
    assert why.returncode == 0, why.stderr
    assert f"on node {pod.spec.node_name}, GPUs {gpu}" in why.stdout

    top = _kubectl(kube_cluster, "top", "-o", "json")
    assert top.returncode == 0, top.stderr
    assert json.loads(top.stdout)["byNamespace"][namespace]["gpus"] == 1.0
    plan = _kubectl(kube_cluster, "plan", "-A")
    assert plan.returncode == 0, plan.stderr


def test_unknown_names_and_unreachable_clusters_say_so_in_one_line(
    kube_cluster: KubeCluster, tmp_path: Path, namespace: str
) -> None:
    missing = _kubectl(kube_cluster, "why", "trainingjob/nope", "-n", namespace)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"error: trainingjob {namespace}/nope not found"
    bad_kind = _kubectl(kube_cluster, "why", "deployment/x")
    assert bad_kind.returncode == 2
    assert "KIND one of trainingjob" in bad_kind.stderr
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    env = os.environ | {"KUBECONFIG": str(config)}
    gone = subprocess.run(
        [f"{BIN}/kubectl-chronotope", "gpus"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert gone.returncode == 1
    assert gone.stderr.startswith("error: ")
    assert len(gone.stderr.strip().splitlines()) == 1
    assert "Traceback" not in gone.stderr
