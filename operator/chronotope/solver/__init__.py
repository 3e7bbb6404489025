"""Pure placement core: snapshot in, decision out.

Public entry points: `cache.ClusterCache.place` (one pod on the live cluster
model, the extender's path; the simulator calls the same policies on the same
arrays), `batch.plan` (pending gangs, CP-SAT, with a greedy warm start on the
same arrays) and `validate.validate`. Nothing here
imports `kubernetes` or `kopf`.
"""

from chronotope.solver.model import (
    Alternative,
    ClusterSnapshot,
    Gpu,
    Node,
    Placement,
    PlacementStrategy,
    PodRequest,
    Reason,
    Unplaced,
    Workload,
)

__all__ = [
    "Alternative",
    "ClusterSnapshot",
    "Gpu",
    "Node",
    "Placement",
    "PlacementStrategy",
    "PodRequest",
    "Reason",
    "Unplaced",
    "Workload",
]
