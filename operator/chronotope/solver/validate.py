"""Solver-agnostic feasibility check of a decision against a snapshot.

Every test of the online policies and the batch planner goes through
`validate`, so tests check properties (no over-commit, gangs whole, spread
honoured) rather than one exact assignment. It returns a list of violations
in plain words; an empty list means the decision is feasible.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from chronotope.solver.model import (
    ClusterSnapshot,
    Placement,
    PlacementStrategy,
    PodRequest,
    Workload,
)

__all__ = ["validate"]


@dataclass
class _Use:
    """What the placements take, per node and per GPU."""

    cpu: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    mem: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    share: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    gmem: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))


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
    for w in wl:
        for member in w.member_names():
            requests[member] = w.pod
    errors: list[str] = []
    placed: dict[str, Placement] = {}
    use = _Use()
    for pl in placements:
        if pl.pod in placed:
            errors.append(f"pod {pl.pod} is placed twice")
            continue
        placed[pl.pod] = pl
        errors += _check_pod(snapshot, pl, requests.get(pl.pod), use)
    errors += _check_capacity(snapshot, use)
    for w in wl:
        errors += _check_gang(snapshot, w, [placed[m] for m in w.member_names() if m in placed])
    return errors


def _check_pod(
    snapshot: ClusterSnapshot, pl: Placement, req: PodRequest | None, use: _Use
) -> list[str]:
    """One placement's own errors; adds what it takes to `use`."""
    node = snapshot.by_name.get(pl.node)
    if node is None:
        return [f"pod {pl.pod} is placed on unknown node {pl.node}"]
    if req is None:
        return [f"pod {pl.pod} has no known request"]
    errors = []
    use.cpu[node.name] += req.cpu_milli
    use.mem[node.name] += req.memory_mib
    if len(set(pl.gpu_indices)) != len(pl.gpu_indices):
        errors.append(f"pod {pl.pod} lists a GPU twice: {pl.gpu_indices}")
    if len(pl.gpu_indices) != req.num_gpus:
        errors.append(f"pod {pl.pod} needs {req.num_gpus} GPUs, got {len(pl.gpu_indices)}")
    if req.num_gpus and not req.allows(node.gpu_model):
        errors.append(f"pod {pl.pod} does not allow GPU model {node.gpu_model!r}")
    if not req.may_use(node.name):
        errors.append(f"pod {pl.pod} may not run on node {node.name}")
    indices = {g.index for g in node.gpus}
    for g in pl.gpu_indices:
        if g not in indices:
            errors.append(f"pod {pl.pod} uses GPU {g} that {node.name} does not have")
            continue
        use.share[node.name, g] += req.gpu_milli
        use.gmem[node.name, g] += req.gpu_memory_mib
    return errors


def _check_capacity(snapshot: ClusterSnapshot, use: _Use) -> list[str]:
    """Nodes and GPUs given more than they have free."""
    errors = []
    for name, used in use.cpu.items():
        if used > snapshot.by_name[name].free_cpu:
            errors.append(
                f"node {name}: CPU over-committed ({used} > {snapshot.by_name[name].free_cpu})"
            )
    for name, used in use.mem.items():
        if used > snapshot.by_name[name].free_memory:
            errors.append(f"node {name}: memory over-committed")
    for (name, g), used in use.share.items():
        gpu = next(x for x in snapshot.by_name[name].gpus if x.index == g)
        if used > gpu.free_milli:
            errors.append(f"node {name} GPU {g}: share over-committed ({used} > {gpu.free_milli})")
        if use.gmem[name, g] > gpu.free_mem and gpu.memory_mib:
            errors.append(f"node {name} GPU {g}: device memory over-committed")
    return errors


def _check_gang(snapshot: ClusterSnapshot, w: Workload, members: list[Placement]) -> list[str]:
    """A gang's rules: all or nothing, one start time, strategy, shared topology."""
    if not members:
        return []
    errors = []
    if len(members) != w.replicas:
        errors.append(f"gang {w.name}: {len(members)} of {w.replicas} members placed")
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
