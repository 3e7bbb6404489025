"""Where a gang's next member goes: the one rule for every gang placement.

The extender reserves a gang's slots with it (`extender.gang.GangBook`), and
the operator's scheduling pass places the gangs it starts with it
(`workloads.capacity.take`), so what the pass counts as taken is where the
members go. The strategies are Ray's placement-group strategies:

- Pack / StrictPack: a node the gang already uses first; else the fullest
  node that holds the rest of the gang (best fit, so large empty nodes stay
  whole for large gangs), else the node with the most free GPUs (the fewest
  nodes). StrictPack never leaves the first member's node.
- Spread: the node with the fewest members first (as evenly as possible), of
  those the one with the most free GPUs. StrictSpread: only a node the gang does
  not use yet, the one with the most free GPUs.

Ties go to the larger node name, so the answer never depends on input order.

A gang whose TrainingJob requires one topology domain (`placement.topology`
Node, NVLinkDomain, Rack or Zone with `required: true`) goes into one domain:
of those whose nodes hold every member under the strategy (`gang_room`), the
one with the fewest free GPUs (best fit, so large domains stay whole for large
gangs), ties to the larger domain name (`gang_domain`); the members then go by
`next_slot` among that domain's nodes. A node without the domain's label is a
domain of its own. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy, TopologyLevel
from chronotope.sharing.labels import NVLINK_LABEL, RACK_LABEL, ZONE_LABEL

__all__ = [
    "DOMAIN_LABELS",
    "domain_of",
    "gang_domain",
    "gang_room",
    "members_held",
    "next_slot",
]

DOMAIN_LABELS = {
    TopologyLevel.NVLINK_DOMAIN: NVLINK_LABEL,
    TopologyLevel.RACK: RACK_LABEL,
    TopologyLevel.ZONE: ZONE_LABEL,
}
"""The node label naming each topology domain above one node."""

_PACKING = (PlacementStrategy.PACK, PlacementStrategy.STRICT_PACK)


def next_slot(
    fitting: Sequence[tuple[str, int]],
    used: Mapping[str, int],
    strategy: PlacementStrategy,
    rest: int,
) -> str | None:
    """The node for a gang's next member, or None when the strategy allows none.

    `fitting`: (node, free whole GPUs) for each node the member fits on now;
    `used`: the members each node holds already (a node it does not name, none);
    `rest`: whole GPUs the gang still needs, this member's included (0 for GPU shares).
    """
    if strategy is PlacementStrategy.STRICT_SPREAD:
        fitting = [f for f in fitting if not used.get(f[0])]
    if strategy is PlacementStrategy.STRICT_PACK and any(used.values()):
        fitting = [f for f in fitting if used.get(f[0])]
    if not fitting:
        return None
    if strategy in _PACKING:
        again = [f for f in fitting if used.get(f[0])]
        if again:
            return max(again, key=lambda f: (f[1], f[0]))[0]
        holds = [f for f in fitting if f[1] >= rest]
        if holds:  # the fewest free GPUs that hold the rest; of those, the larger name
            least = min(free for _, free in holds)
            return max(name for name, free in holds if free == least)
        return max(fitting, key=lambda f: (f[1], f[0]))[0]
    return max(fitting, key=lambda f: (-used.get(f[0], 0), f[1], f[0]))[0]


_ANY = TopologyLevel.ANY
_PREFIX = {level: f"{level.value}/" for level in TopologyLevel}


def domain_of(name: str, labels: Mapping[str, str], level: TopologyLevel) -> str | None:
    """The `level` domain node `name` (with `labels`) is in; None for Any.

    Node: the node itself. A node without the level's label is a domain of its own.
    """
    label = DOMAIN_LABELS.get(level)
    if label is None:
        return None if level is _ANY else f"node/{name}"
    value = labels.get(label)
    return _PREFIX[level] + value if value else f"node/{name}"


def gang_room(frees: Sequence[int], per_worker: int, strategy: PlacementStrategy) -> int:
    """How many members of `per_worker` GPUs nodes with `frees` free GPUs hold (`members_held`)."""
    return members_held([f // max(1, per_worker) for f in frees], strategy)


def members_held(per_node: Sequence[int], strategy: PlacementStrategy) -> int:
    """How many members nodes that each hold `per_node` of them hold together.

    StrictPack: on one node; StrictSpread: one a node; else any way.
    """
    if not per_node:
        return 0
    if strategy is PlacementStrategy.STRICT_PACK:
        return max(per_node)
    if strategy is PlacementStrategy.STRICT_SPREAD:
        return sum(1 for k in per_node if k > 0)
    return sum(per_node)


def gang_domain(
    fitting: Sequence[tuple[str, int]],
    domains: Mapping[str, str],
    strategy: PlacementStrategy,
    members: int,
    per_worker: int,
) -> str | None:
    """The domain a gang of `members` goes into, or None when no domain holds it.

    `fitting`: (node, free whole GPUs) for each node a member fits on now; `domains`:
    each node's domain (`domain_of`). Of the domains whose nodes hold every member
    (`gang_room`), the one with the fewest free GPUs; ties to the larger name.
    """
    frees: dict[str, list[int]] = {}
    for name, free in fitting:
        frees.setdefault(domains[name], []).append(free)
    holding = [
        (sum(f), d) for d, f in frees.items() if gang_room(f, per_worker, strategy) >= members
    ]
    if not holding:
        return None
    least = min(total for total, _ in holding)
    return max(d for total, d in holding if total == least)
