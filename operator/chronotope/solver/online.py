"""The online policies by name, and why no node of a snapshot fits a pod.

`make_policy` is how the simulator, the benchmarks and the scheduler extender
get a policy from its name. A policy decides on the arrays (`ClusterState`):
the simulator's own, or the live cache's (`solver.cache.ClusterCache.place`).
`node_reasons` counts how many nodes each predicate ruled out, for the batch
planner's `Unplaced`. `PlacementRules` is how the extender places pods (its
policy and co-location rules), from the flags it and the operator share.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from chronotope.solver.colocation import DEFAULT_BUDGET, RUNTIMES, Colocation, budget_error
from chronotope.solver.model import ClusterSnapshot, PodRequest, Reason

if TYPE_CHECKING:
    from collections.abc import Sequence

    from chronotope.solver.frag import TypicalPod
    from chronotope.solver.policies import Policy

__all__ = [
    "POLICY_NAMES",
    "PlacementRules",
    "add_placement_arguments",
    "make_policy",
    "node_reasons",
]

POLICY_NAMES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "chronotope")


def node_reasons(snapshot: ClusterSnapshot, pod: PodRequest) -> list[Reason]:
    """Why no node fits the pod now, as counts per predicate; empty if one fits."""
    short = {"rules": 0, "cpu": 0, "memory": 0, "model": 0, "gpu": 0}
    fits = 0
    for node in snapshot.nodes:
        if not pod.may_use(node.name):
            short["rules"] += 1
            continue
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
        "rules": "its node rules rule them out",
        "cpu": "not enough free CPU",
        "memory": "not enough free memory",
        "model": "no allowed GPU model",
        "gpu": f"fewer than {pod.num_gpus} GPU(s) with {pod.gpu_milli}m free",
    }
    return [
        Reason(
            code="NodeRules" if k == "rules" else f"Insufficient{k.capitalize()}",
            message=f"{v} nodes: {words[k]}",
            nodes=v,
        )
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


@dataclass(frozen=True)
class PlacementRules:
    """How the extender places pods: its online policy, co-location rules and expected pods.

    The extender's `--policy`, `--interference-budget`, `--colocation-runtime` and
    `--typical-pods` (`add_placement_arguments`). The operator takes the same flags,
    so the GPUs it counts as free for a GPU share are those the extender would give it.
    """

    policy: Policy = field(default_factory=lambda: make_policy("chronotope"))
    colocation: Colocation = field(default_factory=Colocation)
    typical: tuple[TypicalPod, ...] | None = None
    """The request mix the fragmentation-aware policies expect (None: learned from the
    pods seen, `ClusterCache.typical`)."""

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, typical: Sequence[TypicalPod] | None = None
    ) -> PlacementRules:
        """The rules `add_placement_arguments`' flags name; `typical`: `--typical-pods` read.

        The pod list is read by the caller (`sim.openb.typical_of`): this layer reads no files.
        """
        return cls(
            make_policy(args.policy),
            Colocation(budget=args.interference_budget, runtime=args.colocation_runtime),
            tuple(typical) if typical is not None else None,
        )


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `PlacementRules`: the extender's, and the operator's (to agree with it)."""
    parser.add_argument(
        "--policy",
        default="chronotope",
        choices=POLICY_NAMES,
        help="online placement policy (the one `chronotope simulate openb` measures)",
    )
    parser.add_argument(
        "--interference-budget",
        type=_budget,
        default=DEFAULT_BUDGET,
        metavar="X",
        help="largest predicted slowdown of a High-priority GPU share that co-located "
        f"shares may cause, as a factor >= 1 (default {DEFAULT_BUDGET})",
    )
    parser.add_argument(
        "--colocation-runtime",
        choices=RUNTIMES,
        default="mps",
        help="what runs GPU shares on the nodes: `mps` (MPS alone; a best-effort share beside "
        "a High one is held to a static MPS percent) or `gated` (an Orion-style kernel-level "
        "runtime that holds best-effort kernels back while a High request is in service; "
        "the co-location rules then predict with that runtime; docs/colocation.md)",
    )
    parser.add_argument(
        "--typical-pods",
        type=Path,
        help="openb-style pod list CSV whose request mix the fragmentation-aware policies "
        "expect (default: learned from the pods seen)",
    )


def _budget(text: str) -> float:
    """`--interference-budget`: a factor >= 1; anything else stops the start with the reason."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    why = budget_error(value)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return value
