"""Pure placement core: snapshot in, decision out.

Public entry points: `online.place` (one pod, the extender's fast path),
`batch.plan` (pending gangs, CP-SAT) and `validate.validate`. Nothing here
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
