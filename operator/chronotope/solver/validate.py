"""Solver-agnostic feasibility check of a decision against a snapshot.

Every test of the online policies and the batch planner goes through
`validate`, so tests check properties (no over-commit, gangs whole, spread
honoured) rather than one exact assignment. It returns a list of violations
in plain words; an empty list means the decision is feasible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from chronotope.solver.model import (
    ClusterSnapshot,
    Placement,
    PlacementStrategy,
    PodRequest,
    Workload,
)

__all__ = ["validate"]


def validate(
    snapshot: ClusterSnapshot,
    placements: Iterable[Placement],
    *,
    workloads: Iterable[Workload] = (),
    pods: Mapping[str, PodRequest] | None = None,
) -> list[str]:
    """Violations of `placements` on `snapshot` (empty when feasible).

    Pod requests come from `workloads` (members named `<workload>-<i>`) and/or
    `pods`. Gang rules (all-or-nothing, strategies, topology) are checked
    for every workload given.
    """
    wl = list(workloads)
    requests: dict[str, PodRequest] = dict(pods or {})
    owner: dict[str, Workload] = {}
    for w in wl:
        for member in w.member_names():
            requests[member] = w.pod
            owner[member] = w
    errors: list[str] = []
    placed: dict[str, Placement] = {}
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    share: dict[tuple[str, int], int] = defaultdict(int)
    gmem: dict[tuple[str, int], int] = defaultdict(int)
    for pl in placements:
        if pl.pod in placed:
            errors.append(f"pod {pl.pod} is placed twice")
            continue
        placed[pl.pod] = pl
        node = snapshot.by_name.get(pl.node)
        req = requests.get(pl.pod)
        if node is None:
            errors.append(f"pod {pl.pod} is placed on unknown node {pl.node}")
            continue
        if req is None:
            errors.append(f"pod {pl.pod} has no known request")
            continue
        cpu[node.name] += req.cpu_milli
        mem[node.name] += req.memory_mib
        if len(set(pl.gpu_indices)) != len(pl.gpu_indices):
            errors.append(f"pod {pl.pod} lists a GPU twice: {pl.gpu_indices}")
        if len(pl.gpu_indices) != req.num_gpus:
            errors.append(f"pod {pl.pod} needs {req.num_gpus} GPUs, got {len(pl.gpu_indices)}")
        if req.num_gpus and not req.allows(node.gpu_model):
            errors.append(f"pod {pl.pod} does not allow GPU model {node.gpu_model!r}")
        indices = {g.index for g in node.gpus}
        for g in pl.gpu_indices:
            if g not in indices:
                errors.append(f"pod {pl.pod} uses GPU {g} that {node.name} does not have")
                continue
            share[node.name, g] += req.gpu_milli
            gmem[node.name, g] += req.gpu_memory_mib
    for name, used in cpu.items():
        if used > snapshot.by_name[name].free_cpu:
            errors.append(
                f"node {name}: CPU over-committed ({used} > {snapshot.by_name[name].free_cpu})"
            )
    for name, used in mem.items():
        if used > snapshot.by_name[name].free_memory:
            errors.append(f"node {name}: memory over-committed")
    for (name, g), used in share.items():
        gpu = next(x for x in snapshot.by_name[name].gpus if x.index == g)
        if used > gpu.free_milli:
            errors.append(f"node {name} GPU {g}: share over-committed ({used} > {gpu.free_milli})")
        if gmem[name, g] > gpu.free_mem and gpu.memory_mib:
            errors.append(f"node {name} GPU {g}: device memory over-committed")
    for w in wl:
        members = [placed[m] for m in w.member_names() if m in placed]
        if members and len(members) != w.replicas:
            errors.append(f"gang {w.name}: {len(members)} of {w.replicas} members placed")
        if not members:
            continue
        if len({m.start_s for m in members}) > 1:
            errors.append(f"gang {w.name}: members start at different times")
        nodes = [m.node for m in members]
        if w.strategy is PlacementStrategy.STRICT_SPREAD and len(set(nodes)) != len(nodes):
            errors.append(f"gang {w.name}: STRICT_SPREAD members share a node")
        if w.strategy is PlacementStrategy.STRICT_PACK and len(set(nodes)) > 1:
            errors.append(f"gang {w.name}: STRICT_PACK members on {len(set(nodes))} nodes")
        if w.same_topology:
            domains = {getattr(snapshot.by_name[n], w.same_topology) for n in nodes}
            if len(domains) > 1:
                errors.append(f"gang {w.name}: members span {len(domains)} {w.same_topology}s")
    return errors
