"""1,000 mixed GPU pods on 120 heterogeneous kwok nodes, with an extender restart midway.

Checks what a user relies on: no GPU is ever over-allocated (summing the
assignment annotations per GPU), every pod that fits is placed, and killing
the extender mid-stream loses nothing (its cluster cache is rebuilt from the bound
pods' annotations and placement resumes).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from chronotope.devcluster.cluster import LocalCluster
from chronotope.kube.client import api_client
from chronotope.sharing.assignment import GpuAssignment
from chronotope.sim.clusterspec import ClusterSpec
from e2e.kubetest import wait_for
from e2e.test_extender import gpu_pod

pytestmark = pytest.mark.cluster

SPEC = ClusterSpec.model_validate(
    {
        "name": "scale",
        "pools": [
            {
                "name": "a100",
                "count": 40,
                "gpu": {"model": "A100", "perNode": 8, "memoryMiB": 81920},
            },
            {
                "name": "v100",
                "count": 40,
                "gpu": {"model": "V100", "perNode": 4, "memoryMiB": 32510},
            },
            {"name": "t4", "count": 40, "gpu": {"model": "T4", "perNode": 2, "memoryMiB": 15109}},
        ],
    }
)  # 560 GPUs


def _workload(seed: int = 7) -> list[dict[str, Any]]:
    """1,000 pods asking for about 105 % of the 560 GPUs: mostly shares, some 1-8 GPU pods."""
    rng = random.Random(seed)
    pods = []
    for i in range(1000):
        r = rng.random()
        if r < 0.75:
            pods.append(
                gpu_pod(
                    f"s-{i}",
                    share=(rng.choice([10, 20, 25, 30, 50]), rng.choice([2000, 4000, 8000, 12000])),
                )
            )
        elif r < 0.92:
            pods.append(gpu_pod(f"g1-{i}", gpus=1))
        elif r < 0.98:
            pods.append(gpu_pod(f"g2-{i}", gpus=2))
        elif r < 0.995:
            pods.append(gpu_pod(f"g4-{i}", gpus=4))
        else:
            pods.append(gpu_pod(f"g8-{i}", gpus=8))
    return pods


@pytest.fixture(scope="module")
def scale_cluster(
    cluster_settings: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalCluster, int]]:
    settings = dataclasses.replace(cluster_settings, state_root=tmp_path_factory.mktemp("scale"))
    cluster = LocalCluster(settings, "scale")
    cluster.up(SPEC)
    try:
        yield cluster, cluster.start_chronotope_scheduler()
    finally:
        cluster.down()


def _usage(pods: list[Any], nodes: dict[str, Any]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(node, gpu) -> [(compute %, memory MiB)] from the assignment annotations of bound pods."""
    usage: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for pod in pods:
        if not pod.spec.node_name:
            continue
        a = GpuAssignment.from_annotations(pod.metadata.annotations)
        assert a.node == pod.spec.node_name
        capacity = int(nodes[a.node].status.capacity["nvidia.com/gpu"])
        for index in a.gpu_indices:
            assert 0 <= index < capacity
            usage[(a.node, index)].append((a.compute_percent or 100, a.memory_mib or 0))
    return usage


def _fits_somewhere(
    pod: Any, usage: dict[tuple[str, int], list[tuple[int, int]]], nodes: dict[str, Any]
) -> bool:
    limits = pod.spec.containers[0].resources.limits
    annotations = pod.metadata.annotations or {}
    for name, node in nodes.items():
        count = int(node.status.capacity["nvidia.com/gpu"])
        memory = int(node.metadata.labels["nvidia.com/gpu.memory"])
        if "nvidia.com/gpu" in limits:
            free = sum(1 for i in range(count) if not usage.get((name, i)))
            if free >= int(limits["nvidia.com/gpu"]):
                return True
        else:
            pct = int(annotations["chronotope.dev/gpu-compute-percent"])
            mem = int(annotations["chronotope.dev/gpu-memory-mib"])
            for i in range(count):
                held = usage.get((name, i), [])
                if sum(p for p, _ in held) + pct <= 100 and sum(m for _, m in held) + mem <= memory:
                    return True
    return False


def test_thousand_pods_no_overallocation_and_restart_loses_nothing(
    scale_cluster: tuple[LocalCluster, int], tmp_path: Path
) -> None:
    cluster, port = scale_cluster
    state = cluster.load_state()
    assert state is not None
    ns = "scale"
    with api_client(state.kubeconfig, qps_connections=16) as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda: core.list_namespaced_service_account(ns).items, 60, "default SA")
        pods = _workload()
        # 700 pods before the restart, the rest after it: the restart lands while binds
        # are in flight, and the restarted extender must place pods around the GPUs it
        # only knows from the bound pods' annotations
        before, after = pods[:700], pods[700:]
        pool = ThreadPoolExecutor(16)
        creating = pool.map(lambda p: core.create_namespaced_pod(ns, p), before)

        def bound_count() -> int:
            return sum(1 for p in core.list_namespaced_pod(ns).items if p.spec.node_name)

        wait_for(lambda: bound_count() >= 300, 300, "300 pods bound before the restart")
        cluster.restart_extender(port)  # SIGTERM, then a fresh process on the same port
        list(creating)
        at_restart = bound_count()
        list(pool.map(lambda p: core.create_namespaced_pod(ns, p), after))
        pool.shutdown()

        # quiescence: the bound count stops moving and no pending pod fits anywhere
        nodes = {n.metadata.name: n for n in core.list_node().items}
        deadline = time.monotonic() + 420
        last, stable_since = -1, time.monotonic()
        while True:
            listed = core.list_namespaced_pod(ns).items
            usage = _usage(listed, nodes)
            pending = [p for p in listed if not p.spec.node_name]
            now = time.monotonic()
            count = len(listed) - len(pending)
            if count != last:
                last, stable_since = count, now
            fitting = [p.metadata.name for p in pending if _fits_somewhere(p, usage, nodes)]
            if not fitting and now - stable_since > 5:
                break
            assert now < deadline, (
                f"{len(fitting)} pending pods fit but were not placed: {fitting[:5]}"
            )
            time.sleep(2)

    for (node, gpu), held in usage.items():
        memory = int(nodes[node].metadata.labels["nvidia.com/gpu.memory"])
        assert sum(p for p, _ in held) <= 100, f"{node}/{gpu} over-allocated: {held}"
        assert sum(m for _, m in held) <= memory, f"{node}/{gpu} memory over-allocated: {held}"
        whole = [h for h in held if h == (100, 0)]
        assert not whole or len(held) == 1, f"{node}/{gpu} whole GPU shared: {held}"
    assert last > at_restart, "placement did not resume after the extender restart"
    used = sum(1 for held in usage.values() if held)
    assert used >= 0.9 * sum(p.count * p.gpu.per_node for p in SPEC.pools if p.gpu)
