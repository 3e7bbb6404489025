"""Where a gang's next member goes: the one rule for every gang placement.

The extender reserves a gang's slots with it (`extender.gang.GangBook`), and
the operator's scheduling pass places the gangs it starts with it
(`workloads.capacity.take`), so what the pass counts as taken is where the
members go. The strategies are Ray's placement-group strategies:

- Pack / StrictPack: a node the gang already uses first; else the fullest
  node that holds the rest of the gang (best fit, so large empty nodes stay
  whole for large gangs), else the node with the most free GPUs (the fewest
  nodes). StrictPack never leaves the first member's node.
- Spread / StrictSpread: a node the gang does not use yet first (StrictSpread:
  only those), the one with the most free GPUs.

Ties go to the larger node name, so the answer never depends on input order.
Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy

__all__ = ["next_slot"]

_PACKING = (PlacementStrategy.PACK, PlacementStrategy.STRICT_PACK)


def next_slot(
    fitting: Sequence[tuple[str, int]],
    used: Collection[str],
    strategy: PlacementStrategy,
    rest: int,
) -> str | None:
    """The node for a gang's next member, or None when the strategy allows none.

    `fitting`: (node, free whole GPUs) for each node the member fits on now;
    `used`: nodes that already hold a member; `rest`: whole GPUs the gang still
    needs, this member's included (0 for GPU shares).
    """
    if strategy is PlacementStrategy.STRICT_SPREAD:
        fitting = [f for f in fitting if f[0] not in used]
    if strategy is PlacementStrategy.STRICT_PACK and used:
        fitting = [f for f in fitting if f[0] in used]
    if not fitting:
        return None
    if strategy in _PACKING:
        again = [f for f in fitting if f[0] in used]
        if again:
            return max(again, key=lambda f: (f[1], f[0]))[0]
        holds = [f for f in fitting if f[1] >= rest]
        if holds:  # the fewest free GPUs that hold the rest; of those, the larger name
            least = min(free for _, free in holds)
            return max(name for name, free in holds if free == least)
        return max(fitting, key=lambda f: (f[1], f[0]))[0]
    return max(fitting, key=lambda f: (f[0] not in used, f[1], f[0]))[0]
