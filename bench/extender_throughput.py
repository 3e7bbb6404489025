#!/usr/bin/env python3
"""Scheduling throughput of kube-scheduler + the Chronotope extender vs kube-scheduler alone.

Same kwok cluster, same run: POD_COUNT one-GPU pods go to the default
scheduler, then the same number to the `chronotope` scheduler (kube-scheduler
+ extender over HTTP); throughput is pods bound per second from the first
create to the last binding, and the figure that matters is the ratio. Then
filter and prioritize latency over HTTP with every node of the cluster as
candidates (p50/p99, client side, so HTTP and JSON costs are included).

Figures only; nothing here gates. Usage:
    .venv/bin/python bench/extender_throughput.py [--spec SPEC.yaml] [--pods 500]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from chronotope.devcluster.cluster import LocalCluster
from chronotope.devcluster.settings import ClusterSettings
from chronotope.devcluster.spec import load_spec
from chronotope.kube.client import api_client

ROOT = Path(__file__).resolve().parents[1]


def _pod(name: str, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/x:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def _throughput(core: client.CoreV1Api, ns: str, scheduler: str, count: int) -> float:
    core.create_namespace({"metadata": {"name": ns}})
    while not core.list_namespaced_service_account(ns).items:
        time.sleep(0.2)
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda i: core.create_namespaced_pod(ns, _pod(f"p-{i}", scheduler)), range(count)
            )
        )
    while True:
        bound = sum(1 for p in core.list_namespaced_pod(ns).items if p.spec.node_name)
        if bound >= count:
            return count / (time.perf_counter() - start)
        if time.perf_counter() - start > 900:
            raise TimeoutError(f"{scheduler}: only {bound}/{count} bound after 900 s")
        time.sleep(0.2)


def _latency(port: int, verb: str, nodes: list[str], samples: int) -> tuple[float, float]:
    pod = _pod("probe", "chronotope")
    pod["metadata"]["namespace"] = "default"
    body = json.dumps({"Pod": pod, "NodeNames": nodes}).encode()
    times = []
    for _ in range(samples):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/{verb}", data=body)
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.99 * (len(times) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "manifests/clusters/openb.yaml")
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    spec = load_spec(args.spec)
    base = ClusterSettings.from_env()
    with tempfile.TemporaryDirectory() as state:
        settings = ClusterSettings(
            cache_dir=base.cache_dir, state_root=Path(state), bin_dir=base.bin_dir
        )
        cluster = LocalCluster(settings, "bench")
        print(f"cluster: {spec.node_count} nodes, {spec.gpu_count} GPUs ({args.spec.name})")
        cluster.up(spec)
        try:
            port = cluster.start_chronotope_scheduler()
            state_ = cluster.load_state()
            assert state_ is not None
            with api_client(state_.kubeconfig, qps_connections=16) as api:
                core = client.CoreV1Api(api)
                alone = _throughput(core, "bench-default", "default-scheduler", args.pods)
                ours = _throughput(core, "bench-chronotope", "chronotope", args.pods)
                nodes = [n.metadata.name for n in core.list_node().items]
            f50, f99 = _latency(port, "filter", nodes, args.samples)
            p50, p99 = _latency(port, "prioritize", nodes, args.samples)
        finally:
            cluster.down()
    print(f"{'metric':<44}{'value':>12}")
    print(f"{'kube-scheduler alone (pods/s)':<44}{alone:>12.1f}")
    print(f"{'kube-scheduler + chronotope extender (pods/s)':<44}{ours:>12.1f}")
    print(f"{'ratio (goal >= 0.7)':<44}{ours / alone:>12.2f}")
    print(f"{f'filter p50 / p99 ms ({len(nodes)} nodes)':<44}{f50:>6.2f} / {f99:.2f}")
    print(f"{f'prioritize p50 / p99 ms ({len(nodes)} nodes)':<44}{p50:>6.2f} / {p99:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
