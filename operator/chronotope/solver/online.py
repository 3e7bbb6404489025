"""The online policies by name, and placing one pod on a pydantic snapshot.

`make_policy` is how the simulator, the benchmarks and the scheduler extender
get a policy from its name. The extender decides on the live cache
(`solver.cache.ClusterCache.place`); `place` here is the same decision on a
frozen `ClusterSnapshot`, for callers that hold one. `place` is pure: it
builds (and caches per snapshot) the array form of the cluster, asks the
policy for a node and GPUs, and returns a `Placement`, or an `Unplaced` whose
reasons count how many nodes each predicate ruled out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from chronotope.solver.frag import FragModel, FragTracker, TypicalPod, typical_pods
from chronotope.solver.model import ClusterSnapshot, Placement, PodRequest, Reason, Unplaced

if TYPE_CHECKING:
    from chronotope.solver.policies import Policy

__all__ = ["POLICY_NAMES", "make_policy", "node_reasons", "place"]

POLICY_NAMES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "chronotope")

_CACHE: OrderedDict[int, tuple[ClusterSnapshot, object, object]] = OrderedDict()
_CACHE_SIZE = 4


def node_reasons(snapshot: ClusterSnapshot, pod: PodRequest) -> list[Reason]:
    """Why no node fits the pod now, as counts per predicate; empty if one fits."""
    short = {"cpu": 0, "memory": 0, "model": 0, "gpu": 0}
    fits = 0
    for node in snapshot.nodes:
        bad = False
        if node.free_cpu < pod.cpu_milli:
            short["cpu"] += 1
            bad = True
        if node.free_memory < pod.memory_mib:
            short["memory"] += 1
            bad = True
        if pod.num_gpus:
            if not node.gpus or not pod.allows(node.gpu_model):
                short["model"] += 1
                bad = True
            else:
                room = [
                    g
                    for g in node.gpus
                    if g.free_milli >= pod.gpu_milli and g.free_mem >= pod.gpu_memory_mib
                ]
                if len(room) < pod.num_gpus:
                    short["gpu"] += 1
                    bad = True
        fits += not bad
    if fits:
        return []
    words = {
        "cpu": "not enough free CPU",
        "memory": "not enough free memory",
        "model": "no allowed GPU model",
        "gpu": f"fewer than {pod.num_gpus} GPU(s) with {pod.gpu_milli}m free",
    }
    return [
        Reason(code=f"Insufficient{k.capitalize()}", message=f"{v} nodes: {words[k]}", nodes=v)
        for k, v in short.items()
        if v
    ]


def make_policy(name: str) -> Policy:
    """The online policy called `name` (one of `POLICY_NAMES`)."""
    from chronotope.solver.fragpack import Chronotope
    from chronotope.solver.policies import BASELINES

    if name == "chronotope":
        return Chronotope()
    if name not in BASELINES:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICY_NAMES)}")
    return BASELINES[name]()


def _arrays(
    snapshot: ClusterSnapshot, typical: Sequence[TypicalPod] | None
) -> tuple[object, object]:
    from chronotope.solver.state import ClusterState

    key = id(snapshot)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is snapshot:
        _CACHE.move_to_end(key)
        return hit[1], hit[2]
    state = ClusterState.from_snapshot(snapshot)
    frag = FragTracker(FragModel(list(typical or []), state.models), state)
    _CACHE[key] = (snapshot, state, frag)
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return state, frag


def place(
    snapshot: ClusterSnapshot,
    pod: PodRequest,
    policy: str = "chronotope",
    *,
    typical: Sequence[TypicalPod] | None = None,
    seed: int = 0,
) -> Placement | Unplaced:
    """Choose a node and GPUs for `pod` on `snapshot`. Pure; never mutates the snapshot.

    `typical` is the expected request mix for the fragmentation-aware policies
    (build it with `frag.typical_pods` over recent pods); without it they fall
    back to the pod itself as the only typical shape.
    """
    from chronotope.solver.policies import Context
    from chronotope.solver.state import ClusterState

    impl = make_policy(policy)
    mix = list(typical) if typical else typical_pods([pod])
    state, frag = _arrays(snapshot, mix)
    assert isinstance(state, ClusterState) and isinstance(frag, FragTracker)
    if frag.model.typical != mix:
        frag = FragTracker(FragModel(mix, state.models), state)
    spec = state.spec(pod)
    cand = state.feasible(spec)
    if len(cand) == 0:
        reasons = node_reasons(snapshot, pod) or [
            Reason(code="NoFit", message="no node fits the pod")
        ]
        return Unplaced(name=pod.name, reasons=tuple(reasons))
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(seed))
    node, gpus = impl.choose(ctx, spec, cand)
    return Placement(
        pod=pod.name, node=state.names[node], gpu_indices=gpus, gpu_milli=pod.gpu_milli
    )
