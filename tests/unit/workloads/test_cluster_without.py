"""The cluster without some jobs' pods, read again only where they ran.

A lease check with running jobs leaving (`gates._NodeCheck.fits`) and a
preemption plan ask for the cluster's capacity without those jobs' workers.
That was a whole new read of every node and pod each time (0.4 s on openb's
1,213 nodes), so a pass weighing a few lease stops took seconds
(`bench/training_pass.py --settled 30 --queues 0 --checkpoint`).
`capacity.cluster_without` reads again only the nodes those workers ran on,
and must give exactly what reading the whole cluster gives.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from chronotope.workloads.capacity import (
    ClusterFacts,
    NodeCapacity,
    cluster_capacity,
    cluster_without,
    facts_of,
)
from chronotope.workloads.gang import worker_pods
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import volume_rules
from chronotope.workloads.preemption import capacity_without
from chronotope.workloads.training import Action, Decision
from tests.unit.workloads.test_backfill import busy_pod, node, tjob

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
TYPES = ("A100", "V100")


def _cluster(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes of two types in two zones (CPU, memory and pod slots stated), and jobs' workers.

    The workers: whole-GPU gangs of one or two, GPU-share ones, each with CPU asked,
    some with a required pod anti-affinity; pods of other schedulers beside them.
    """
    nodes = []
    for i in range(12):
        n = node(f"n{i}", TYPES[i % 2], rng.choice((4, 8)))
        n["metadata"]["labels"]["topology.kubernetes.io/zone"] = f"z{i % 3}"
        n["status"]["allocatable"] |= {"cpu": "64", "memory": "512Gi", "pods": "110"}
        nodes.append(n)
    cpu_only = {"metadata": {"name": "cpu-0", "labels": {}}, "status": {"allocatable": {}}}
    nodes.append(cpu_only)
    free = {
        n["metadata"]["name"]: int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes[:-1]
    }
    pods: list[dict[str, Any]] = []
    for j in range(10):
        gpu_type = TYPES[j % 2]
        job = tjob(f"j{j}", created=NOW, gpus=rng.choice((1, 2)), types={gpu_type: 1.0})
        if j % 4 == 3:
            job["spec"]["gpu"] = {"shared": {"memoryMiB": 4096, "computePercent": 30}}
        else:
            job["spec"]["replicas"] = rng.choice((1, 2))
        if j % 5 == 0:
            term = {
                "labelSelector": {"matchLabels": {"app": "apart"}},
                "topologyKey": "kubernetes.io/hostname",
            }
            job["spec"]["template"]["metadata"] = {"labels": {"app": "apart"}}
            job["spec"]["template"]["spec"]["affinity"] = {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
            }
        job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "2", "memory": "8Gi"}
        }
        spec = job_spec(job)
        per = 1 if spec.gpu.shared is not None else int(spec.gpu.count or 0)
        places = [
            n
            for n, f in free.items()
            if f >= per
            and nodes[int(n[1:])]["metadata"]["labels"]["nvidia.com/gpu.product"] == gpu_type
        ]
        if len(places) < spec.replicas:
            continue
        chosen = rng.sample(places, spec.replicas)
        d = Decision(
            Action.START, "test", gpu_type=gpu_type, workers=spec.replicas, gpus_per_worker=per
        )
        for pod, where in zip(worker_pods(job, spec, d, 0), chosen, strict=True):
            pod["spec"]["nodeName"] = where
            pod["status"] = {"phase": "Running"}
            if spec.gpu.shared is None:
                free[where] -= per
            pods.append(pod)
    for k, (name, f) in enumerate(free.items()):
        if f and k % 3 == 0:
            pods.append(busy_pod(f"busy-{k}", name, rng.randint(1, f)))
    pods.append(busy_pod("on-cpu", "cpu-0", 0))
    done = busy_pod("done", "n0", 1)
    done["status"] = {"phase": "Succeeded"}
    pods.append(done)
    return nodes, pods


def _same(a: Sequence[NodeCapacity], b: Sequence[NodeCapacity]) -> None:
    assert [n.name for n in a] == [n.name for n in b]  # the same order
    assert tuple(a) == tuple(b)
    fa, fb = facts_of(a), facts_of(b)
    assert (fa.outside, dict(fa.claimed)) == (fb.outside, dict(fb.claimed))


@pytest.mark.parametrize("seed", range(8))
def test_the_cluster_without_some_jobs_is_what_reading_it_whole_gives(seed: int) -> None:
    rng = random.Random(seed)
    nodes, pods = _cluster(rng)
    read = cluster_capacity(nodes, pods)
    jobs = sorted(
        {
            f"scale/{p['metadata']['labels']['chronotope.dev/job']}"
            for p in pods
            if p["metadata"]["namespace"] == "scale"
        }
    )
    assert jobs
    for k in (1, 2, 3):
        gone = rng.sample(jobs, min(k, len(jobs)))
        quick = capacity_without(gone, nodes=nodes, pods=pods, read=read)
        _same(quick, capacity_without(gone, nodes=nodes, pods=pods))
        # only the nodes they ran on were read again: the others are `read`'s own
        ran = {
            p["spec"]["nodeName"]
            for p in pods
            if f"scale/{p['metadata']['labels'].get('chronotope.dev/job')}" in gone
        }
        kept = {id(n) for n in read}
        assert all(id(n) in kept for n in quick if n.name not in ran)
        assert not any(id(n) in kept for n in quick if n.name in ran)
    assert capacity_without(["scale/nobody"], nodes=nodes, pods=pods, read=read) is read


def test_a_worker_waiting_to_bind_or_a_claim_held_reads_the_whole_cluster() -> None:
    nodes, pods = _cluster(random.Random(3))
    victim = next(p for p in pods if p["metadata"]["namespace"] == "scale")
    gone = [f"scale/{victim['metadata']['labels']['chronotope.dev/job']}"]
    # a worker created but not bound: the GPUs promised to it depend on every node
    waiting = {**victim, "metadata": {**victim["metadata"], "name": "late"}}
    waiting["spec"] = {k: v for k, v in victim["spec"].items() if k != "nodeName"}
    waiting["status"] = {"phase": "Pending"}
    with_waiting = [*pods, waiting]
    read = cluster_capacity(nodes, with_waiting)
    quick = capacity_without(gone, nodes=nodes, pods=with_waiting, read=read)
    _same(quick, capacity_without(gone, nodes=nodes, pods=with_waiting))
    assert not {id(n) for n in quick} & {id(n) for n in read}
    # a ReadWriteOncePod claim the leaving job's worker holds is free once it has left
    claim = {
        "metadata": {"name": "solo", "namespace": "scale"},
        "spec": {"accessModes": ["ReadWriteOncePod"], "volumeName": "pv-solo"},
        "status": {"phase": "Bound"},
    }
    facts = ClusterFacts(volumes=volume_rules([claim], []))
    victim["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "solo"}}]
    read = cluster_capacity(nodes, pods, facts=facts)
    assert facts_of(read).claimed
    quick = capacity_without(gone, nodes=nodes, pods=pods, facts=facts_of(read), read=read)
    _same(quick, capacity_without(gone, nodes=nodes, pods=pods, facts=facts_of(read)))
    assert not facts_of(quick).claimed


def test_without_nothing_read_is_the_cluster_read_whole() -> None:
    nodes, pods = _cluster(random.Random(0))
    read = cluster_capacity(nodes, pods)
    assert cluster_without(read, frozenset(), nodes, pods) is read
