"""All-or-nothing gangs: reserve GPUs for every member before any member binds.

kube-scheduler places pods one at a time, so a gang (the workers of one
training job) could end half-bound, holding GPUs while it waits for the rest
(the classic gang-scheduling deadlock). The extender prevents that: when the
first member of a gang is filtered, the whole gang's placement is reserved in
the cluster cache (synthetic holdings, one per member slot) or nothing is; members
then pass the filter only on nodes where the gang holds a slot, and binding a
member turns its slot into the pod's own holding. A reservation whose members
do not all arrive expires and is released.

Gangs are declared on pods: label `chronotope.dev/pod-group` (the gang's name)
and annotation `chronotope.dev/pod-group-size` (how many members), optional
`chronotope.dev/placement-strategy`: Pack (default), Spread, StrictPack,
StrictSpread (Ray's placement-group strategies; where each member goes is
`solver.slots.next_slot`, the rule the operator's scheduling pass places by),
and optional `chronotope.dev/placement-topology`: Node, NVLinkDomain, Rack or
Zone, the domain every member must share (`solver.slots.gang_domain` picks it;
a gang whose plan names its nodes, the operator's, is placed there instead).

Pure: plain values and the cluster cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy, TopologyLevel
from chronotope.sharing.labels import (
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    STRATEGY_ANNOTATION,
    TOPOLOGY_ANNOTATION,
)
from chronotope.solver.cache import ClusterCache
from chronotope.solver.model import PodRequest, Reason
from chronotope.solver.slots import domain_of, gang_domain, next_slot
from chronotope.workloads.podreq import PlannedPlacement

__all__ = ["MAX_GANG_SIZE", "Gang", "GangBook", "gang_of"]


MAX_GANG_SIZE = 10_000
"""The largest gang the extender accepts (a bound on what one annotation can ask)."""


@dataclass(frozen=True)
class Gang:
    """A gang as its pods declare it: `namespace/name` key, member count, strategy."""

    key: str
    size: int
    strategy: PlacementStrategy
    topology: TopologyLevel = TopologyLevel.ANY
    """The domain every member must share (`chronotope.dev/placement-topology`)."""


def gang_of(pod: Mapping[str, Any]) -> Gang | None:
    """The gang a pod belongs to, or None; ValueError naming the field when malformed."""
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(GANG_LABEL)
    if not name:
        return None
    annotations = meta.get("annotations") or {}
    raw = annotations.get(GANG_SIZE_ANNOTATION, "")
    try:
        size = int(raw)
    except ValueError:
        raise ValueError(
            f"metadata.annotations[{GANG_SIZE_ANNOTATION}]: {raw!r} is not an integer"
        ) from None
    if not 1 <= size <= MAX_GANG_SIZE:
        raise ValueError(
            f"metadata.annotations[{GANG_SIZE_ANNOTATION}]: {size} is not 1..{MAX_GANG_SIZE}"
        )
    strategy = _named(annotations, STRATEGY_ANNOTATION, PlacementStrategy.PACK)
    topology = _named(annotations, TOPOLOGY_ANNOTATION, TopologyLevel.ANY)
    return Gang(f"{meta.get('namespace', 'default')}/{name}", size, strategy, topology)


_E = TypeVar("_E", bound=StrEnum)


def _named(annotations: Mapping[str, str], key: str, default: _E) -> _E:
    """The annotation `key` as a value of `default`'s enum (`default` when absent)."""
    raw = annotations.get(key, default.value)
    kind = type(default)
    try:
        return kind(raw)
    except ValueError:
        allowed = ", ".join(v.value for v in kind)
        raise ValueError(f"metadata.annotations[{key}]: {raw!r} is not one of {allowed}") from None


@dataclass
class Reservation:
    gang: Gang
    slots: list[str]  # node per slot
    claimed: dict[str, int] = field(default_factory=dict)  # pod key -> slot
    expires_at: float = 0.0
    gpus: list[tuple[int, ...]] = field(default_factory=list)  # GPU indices per slot

    def slot_key(self, i: int) -> str:
        return f"gang:{self.gang.key}#{i}"

    def free_slots(self) -> list[int]:
        taken = set(self.claimed.values())
        return [i for i in range(len(self.slots)) if i not in taken]


@dataclass
class GangBook:
    """Each gang's reservation and bound members; a reservation lives `ttl_s` seconds."""

    ttl_s: float = 120.0
    reservations: dict[str, Reservation] = field(default_factory=dict)
    members_bound: dict[str, set[str]] = field(default_factory=dict)

    def allowed_nodes(self, gang: Gang, pod_key: str) -> set[str] | None:
        """Nodes this member may use under the current reservation (None: no reservation)."""
        res = self.reservations.get(gang.key)
        if res is None:
            return None
        if pod_key in res.claimed:
            return {res.slots[res.claimed[pod_key]]}
        return {res.slots[i] for i in res.free_slots()}

    def reserve(
        self, cache: ClusterCache, gang: Gang, req: PodRequest, candidates: list[str], now: float
    ) -> str | None:
        """Reserve every missing member's GPUs, or nothing; returns why not, or None on success."""
        bound = self.members_bound.get(gang.key, set())
        needed = gang.size - len(bound)
        if needed <= 0:
            return None
        members = Counter(h.node for k in bound if (h := cache.holdings.get(k)) is not None)
        on = set(members)
        if gang.topology is not TopologyLevel.ANY:
            within = _one_domain(cache, gang, req, candidates, needed=needed, on=on)
            if isinstance(within, str):
                return within
            candidates = within
        res = Reservation(gang, [], expires_at=now + self.ttl_s)
        for i in range(needed):
            rest = (needed - i) * (0 if req.is_share else req.num_gpus)
            node = self._pick(
                cache,
                members + Counter(res.slots),
                req,
                candidates,
                strategy=gang.strategy,
                rest=rest,
            )
            choice = None if node is None else cache.assume(res.slot_key(i), node, req, now)
            if node is None or choice is None or isinstance(choice, Reason):
                self._release(cache, res)
                return (
                    f"gang {gang.key} ({gang.strategy.value}) needs {needed} member(s) with "
                    f"{req.describe_gpus()} each; only {i} can be placed now"
                )
            res.slots.append(node)
            res.gpus.append(choice)
        hold_for_reservation(cache, res)
        self.reservations[gang.key] = res
        return None

    def reserve_planned(
        self,
        cache: ClusterCache,
        gang: Gang,
        req: PodRequest,
        candidates: list[str],
        now: float,
        *,
        plan: Sequence[PlannedPlacement],
    ) -> str | None:
        """Reserve every unbound member's planned node and GPUs, or nothing; why not, or None.

        Members already bound (an extender restarted between two members' binds, and
        lost the rest's reservation) take their own entries of the plan off it: the
        rest of the plan is what is reserved.
        """
        if len(plan) != gang.size:
            return f"the plan names {len(plan)} member(s), gang {gang.key} has {gang.size}"
        rest = _unbound_part(cache, plan, self.members_bound.get(gang.key, set()))
        if rest is None:
            return f"the members of gang {gang.key} already bound are not where the plan put them"
        if not rest:
            return None  # every member is bound: nothing to hold
        res = Reservation(gang, [], expires_at=now + self.ttl_s)
        offered = set(candidates)
        for i, slot in enumerate(rest):
            if slot.node not in offered:
                self._release(cache, res)
                return f"kube-scheduler ruled out the planned node {slot.node}"
            choice = cache.assume(res.slot_key(i), slot.node, req, now, slot.gpus)
            if isinstance(choice, Reason):
                self._release(cache, res)
                return f"planned node {slot.node} no longer fits: {choice.message}"
            res.slots.append(slot.node)
            res.gpus.append(choice)
        hold_for_reservation(cache, res)
        self.reservations[gang.key] = res
        return None

    @staticmethod
    def _pick(
        cache: ClusterCache,
        used: Mapping[str, int],
        req: PodRequest,
        candidates: list[str],
        *,
        strategy: PlacementStrategy,
        rest: int,
    ) -> str | None:
        """The next slot's node (`next_slot`); `used`: members bound or reserved per node."""
        fits = [n for n in candidates if not isinstance(cache.fit(n, req), Reason)]
        fitting = [(n, cache.free_whole(n)) for n in fits]
        return next_slot(fitting, used, strategy, rest)

    def claim(
        self,
        cache: ClusterCache,
        gang: Gang,
        pod_key: str,
        node: str,
        gpus: tuple[int, ...] | None = None,
    ) -> bool:
        """Turn a slot on `node` into room for this member (the caller then assumes the pod).

        With `gpus` (the member's planned GPUs), the slot that holds those is taken first.
        """
        res = self.reservations.get(gang.key)
        if res is None:
            return True  # no reservation (e.g. the rest of the gang is already bound)
        if pod_key in res.claimed:
            slot = res.claimed[pod_key]
        else:
            free = [i for i in res.free_slots() if res.slots[i] == node]
            if not free:
                return False
            slot = next((i for i in free if res.gpus[i] == gpus), free[0])
            res.claimed[pod_key] = slot
        cache.forget(res.slot_key(slot))
        return True

    def unclaim(
        self, cache: ClusterCache, gang: Gang, pod_key: str, req: PodRequest, now: float
    ) -> None:
        """A member's bind failed: hold its slot again for the next try."""
        res = self.reservations.get(gang.key)
        if res is None or pod_key not in res.claimed:
            return
        slot = res.claimed.pop(pod_key)
        if not isinstance(cache.assume(res.slot_key(slot), res.slots[slot], req, now), Reason):
            cache.confirm(res.slot_key(slot))

    def bound(self, gang: Gang, pod_key: str) -> None:
        """Record a bound member; the reservation ends once bound members claim every slot."""
        self.members_bound.setdefault(gang.key, set()).add(pod_key)
        res = self.reservations.get(gang.key)
        if (
            res is not None
            and len(res.claimed) == len(res.slots)
            and all(k in self.members_bound[gang.key] for k in res.claimed)
        ):
            del self.reservations[gang.key]

    def forget_member(self, cache: ClusterCache, gang: Gang, pod_key: str) -> None:
        """A member left: it no longer counts as bound, and its slot is open to another."""
        self.members_bound.get(gang.key, set()).discard(pod_key)
        res = self.reservations.get(gang.key)
        if res is not None:
            res.claimed.pop(pod_key, None)

    def drop(self, cache: ClusterCache, gang_key: str) -> None:
        """The gang has no member left (its pods were deleted): release what it holds."""
        res = self.reservations.pop(gang_key, None)
        if res is not None:
            for i in range(len(res.slots)):
                cache.forget(res.slot_key(i))
        self.members_bound.pop(gang_key, None)

    def expire(self, cache: ClusterCache, now: float) -> list[str]:
        """End reservations past their time, releasing unclaimed slots; returns the gang keys."""
        stale = [k for k, r in self.reservations.items() if r.expires_at <= now]
        for key in stale:
            self._release(cache, self.reservations.pop(key))
        return stale

    @staticmethod
    def _release(cache: ClusterCache, res: Reservation) -> None:
        for i in range(len(res.slots)):
            if i not in res.claimed.values():
                cache.forget(res.slot_key(i))


def _unbound_part(
    cache: ClusterCache, plan: Sequence[PlannedPlacement], bound: set[str]
) -> list[PlannedPlacement] | None:
    """The plan without the entries bound members hold, or None if one holds no entry."""
    rest = list(plan)
    for key in sorted(bound):
        held = cache.holdings.get(key)
        match = None
        if held is not None:
            match = next(
                (
                    i
                    for i, p in enumerate(rest)
                    if p.node == held.node and p.gpus in (None, held.gpu_indices)
                ),
                None,
            )
        if match is None:
            return None
        del rest[match]
    return rest


def hold_for_reservation(cache: ClusterCache, res: Reservation) -> None:
    """Slots live as long as their reservation, not the cache's assume TTL."""
    for i in range(len(res.slots)):
        cache.confirm(res.slot_key(i))


def _one_domain(
    cache: ClusterCache,
    gang: Gang,
    req: PodRequest,
    candidates: list[str],
    *,
    needed: int,
    on: set[str],
) -> list[str] | str:
    """The candidates in the one domain the gang goes into (`solver.slots.gang_domain`).

    Or why none holds its `needed` members now. The nodes of members already bound
    (`on`: an extender restarted between two binds) tie the rest to their domain.
    """

    def domain(n: str) -> str:
        return domain_of(n, dict(cache.nodes[n].topology), gang.topology) or ""

    fits = [n for n in candidates if not isinstance(cache.fit(n, req), Reason)]
    domains = {n: domain(n) for n in fits if n in cache.nodes}
    theirs = sorted({domain(n) for n in on if n in cache.nodes})
    where = f"within one {gang.topology.value}"
    if len(theirs) > 1:
        return (
            f"gang {gang.key}'s bound members are in {len(theirs)} {gang.topology.value}s "
            f"({', '.join(theirs)}); it requires one"
        )
    if theirs:
        domains = {n: d for n, d in domains.items() if d == theirs[0]}
        where = f"within {theirs[0]} (its bound members' {gang.topology.value})"
    if gang.strategy is PlacementStrategy.STRICT_SPREAD:
        domains = {n: d for n, d in domains.items() if n not in on}  # one member a node
    elif gang.strategy is PlacementStrategy.STRICT_PACK and on:
        domains = {n: d for n, d in domains.items() if n in on}  # all on the first's node
    fitting = [(n, cache.free_whole(n)) for n in fits if n in domains]
    chosen = gang_domain(fitting, domains, gang.strategy, needed, req.num_gpus)
    if chosen is None:
        return (
            f"gang {gang.key} ({gang.strategy.value}) needs {needed} member(s) with "
            f"{req.describe_gpus()} each {where}; no {gang.topology.value} holds them now"
        )
    return [n for n in candidates if domains.get(n) == chosen]
