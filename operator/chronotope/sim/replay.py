"""What `chronotope replay openb` sends to a real cluster, and how its answers are scored.

The replay submits the simulator's arrivals (`sim.engine.arrivals`, same seed,
same order) as real pods to a real kube-scheduler running the Chronotope
extender, one at a time, and scores the placements the cluster made exactly
as the simulator scores its own: the same `ClusterState` and fragmentation
tables, fed with the cluster's choices instead of the policy's. This module
is the pure part: pod manifests, the simulator's tie order, the node pools,
and the scoring. Pure.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chronotope.api.annotations import GPU_COMPUTE_PERCENT, GPU_MEMORY_MIB
from chronotope.sharing.labels import GPU_RESOURCE, SHARE_RESOURCE
from chronotope.sim.clusterspec import ClusterSpec
from chronotope.sim.engine import Replay, RunResult, arrivals, reference_rank
from chronotope.solver.model import MILLI, ClusterSnapshot, PodRequest
from chronotope.solver.policies import Choice

__all__ = [
    "REPLAY_GPU_MEMORY_MIB",
    "Arrival",
    "arrivals_of",
    "cluster_spec",
    "pod_manifest",
    "score",
    "simulated_placements",
    "tie_order",
    "write_placements",
]

REPLAY_GPU_MEMORY_MIB = 32768
"""openb states no GPU memory: nodes say 32 GiB per GPU, shares ask 1 MiB (never binding)."""
MODELS_ANNOTATION = "chronotope.dev/gpu-models"


@dataclass(frozen=True)
class Arrival:
    """One submitted pod: arrival index, its trace request, and the pod's name."""

    index: int
    request: PodRequest

    @property
    def pod_name(self) -> str:
        """The pod's name: arrival index, then the trace name, lower-cased."""
        return f"a{self.index:05d}-{self.request.name}".lower()


def arrivals_of(
    snapshot: ClusterSnapshot, pods: Sequence[PodRequest], seed: int, tune_ratio: float = 1.3
) -> list[Arrival]:
    """The simulator's arrivals for `seed`, in submission order."""
    total = sum(len(n.gpus) for n in snapshot.nodes) * MILLI
    return [Arrival(e, pods[i]) for e, i in enumerate(arrivals(pods, total, seed, tune_ratio))]


def tie_order(snapshot: ClusterSnapshot, seed: int) -> list[str]:
    """Node names in the simulator's tie order for `seed` (`Replay.start`), first wins."""
    rng = np.random.default_rng([seed, 7])
    rank = reference_rank(len(snapshot.nodes), rng)
    return [snapshot.nodes[i].name for i in np.argsort(rank, kind="stable")]


def cluster_spec(snapshot: ClusterSnapshot, name: str = "replay") -> ClusterSpec:
    """Node pools for kwok holding exactly the snapshot's nodes (names, CPU, memory, GPUs)."""
    groups: dict[tuple[str, int, int, int], list[str]] = defaultdict(list)
    for node in snapshot.nodes:
        groups[(node.gpu_model, len(node.gpus), node.cpu_milli, node.memory_mib)].append(node.name)
    pools: list[dict[str, Any]] = []
    for i, ((model, gpus, cpu, mem), names) in enumerate(sorted(groups.items())):
        pool: dict[str, Any] = {
            "name": f"p{i}",
            "count": len(names),
            "names": names,
            "cpu": f"{cpu}m",
            "memory": f"{mem}Mi",
            "maxPods": 1000,
        }
        if gpus:
            pool["gpu"] = {"model": model, "perNode": gpus, "memoryMiB": REPLAY_GPU_MEMORY_MIB}
        pools.append(pool)
    return ClusterSpec.model_validate({"name": name, "pools": pools})


def pod_manifest(arrival: Arrival, scheduler: str = "chronotope") -> dict[str, Any]:
    """A real pod asking what the trace's pod asks: CPU, memory, whole GPUs or a share."""
    req = arrival.request
    requests: dict[str, str] = {"cpu": f"{req.cpu_milli}m", "memory": f"{req.memory_mib}Mi"}
    limits: dict[str, str] = dict(requests)
    annotations: dict[str, str] = {}
    if req.is_share:
        if req.gpu_milli % 10:
            raise ValueError(f"{req.name}: {req.gpu_milli}m is not a whole GPU percentage")
        limits[SHARE_RESOURCE] = "1"
        annotations[GPU_COMPUTE_PERCENT] = str(req.gpu_milli * 100 // MILLI)
        annotations[GPU_MEMORY_MIB] = "1"
    elif req.num_gpus:
        limits[GPU_RESOURCE] = str(req.num_gpus)
    if req.gpu_models:
        annotations[MODELS_ANNOTATION] = ",".join(req.gpu_models)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": arrival.pod_name,
            "labels": {"chronotope.dev/replay": "openb"},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/replay:1",
                    "resources": {"requests": requests, "limits": limits},
                }
            ],
        },
    }


def score(
    snapshot: ClusterSnapshot,
    pods: Sequence[PodRequest],
    seed: int,
    placed: Sequence[tuple[str, tuple[int, ...]] | None],
    *,
    tune_ratio: float = 1.3,
    policy: str = "",
) -> RunResult:
    """The simulator's series and metrics for the cluster's placements of the arrivals."""
    run = Replay.start(snapshot, pods, seed, tune_ratio=tune_ratio)
    index = {name: i for i, name in enumerate(run.state.names)}
    for e, (i, where) in enumerate(zip(run.order, placed, strict=False)):
        spec = run.specs[i]
        if where is None:
            run.record(e, spec, placed=False)
            continue
        node = index[where[0]]
        run.state.take(node, spec.cpu, spec.mem, where[1], milli=spec.milli, gpu_mem=spec.gpu_mem)
        run.frag.refresh(node)
        run.record(e, spec, placed=True)
    done = len(placed)
    result = run.result(policy)
    if done < len(run.order):  # a partial replay (--limit): only the arrivals it made
        result.arrived, result.used = result.arrived[:done], result.used[:done]
        result.frag, result.idle = result.frag[:done], result.idle[:done]
    return result


def write_placements(
    path: Path, arrivals: Sequence[Arrival], placed: Sequence[tuple[str, tuple[int, ...]] | None]
) -> None:
    """`pod,node,gpus`: one row per arrival; node empty for a pod that fitted nowhere."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["pod", "node", "gpus"])
        for arrival, where in zip(arrivals, placed, strict=True):
            if where is None:
                writer.writerow([arrival.pod_name, "", ""])
            else:
                writer.writerow([arrival.pod_name, where[0], ",".join(map(str, where[1]))])


def simulated_placements(
    snapshot: ClusterSnapshot, choices: Sequence[Choice | None]
) -> list[tuple[str, tuple[int, ...]] | None]:
    """The simulator's (node index, GPUs) choices as (node name, GPUs)."""
    names = [n.name for n in snapshot.nodes]
    return [None if c is None else (names[c[0]], c[1]) for c in choices]
