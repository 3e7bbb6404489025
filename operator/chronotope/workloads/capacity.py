"""What GPUs the cluster has, and which are free, from plain node and pod objects.

A view of the one cluster model: the nodes and bound pods go into a
`ClusterCache` exactly as the extender's watch feeds its own
(`workloads.cluster_feed`: assignment annotations are the truth; pods bound by
another scheduler take `nvidia.com/gpu` GPUs by count), and each GPU node is
summed up as a `NodeCapacity` with the indices of its untouched GPUs. Workers
created for a gang but not yet bound are promised GPUs of their type, so two
jobs decided in a row do not both count on the same free GPUs: a worker
whose pod carries a planned node and GPUs (the pass's own placement, or a
joint plan's) holds exactly those, any other by count.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain
from typing import Any, NamedTuple, TypeAlias

from chronotope.api.quantity import QuantityError
from chronotope.api.v1alpha1.trainingjob import PlacementStrategy, TopologyLevel
from chronotope.sharing.labels import (
    DONE_PHASES,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    SCHEDULER_NAME,
    ZONE_LABEL,
)
from chronotope.solver.cache import ClusterCache
from chronotope.solver.model import MILLI, UNBOUNDED, PodRequest
from chronotope.solver.online import PlacementRules
from chronotope.solver.policies import Policy
from chronotope.solver.slots import domain_of, gang_domain, next_slot
from chronotope.workloads.cluster_feed import hold_planned, node_info, pod_holding
from chronotope.workloads.node_fit import (
    NO_LIMITS,
    NOBODY,
    Amounts,
    Attach,
    Crowd,
    Domains,
    HostPort,
    NamespaceLabels,
    Neighbour,
    NodeRules,
    Place,
    PodTerm,
    RuntimeRule,
    Skew,
    Spread,
    Taint,
    VolumeLimits,
    VolumeRule,
    amount_of,
    anti_among,
    attached_by,
    attached_of,
    claims_of,
    domains,
    host_ports,
    neighbour,
    node_taints,
    pod_anti_terms,
)
from chronotope.workloads.podreq import (
    GPU_RESOURCES,
    PodRequestError,
    extra_requests,
    planned,
    pod_requests,
    resource_amount,
)

__all__ = [
    "NO_FACTS",
    "Capacity",
    "ClusterFacts",
    "FreeGpus",
    "NodeCapacity",
    "Placements",
    "SharePlacer",
    "Usable",
    "admitting",
    "cluster_capacity",
    "cluster_model",
    "cluster_without",
    "facts_of",
    "in_cluster",
    "of_type",
    "take",
    "unblocked",
    "workers_binding",
]


@dataclass(frozen=True, eq=False)
class ClusterFacts:
    """What the node rules read beyond the GPU nodes' own state: one object per cluster model."""

    volumes: Mapping[str, VolumeRule] | None = None
    """Where each PersistentVolumeClaim may be used (`node_fit.volume_rules`; None: not
    known, nothing is checked)."""
    namespaces: NamespaceLabels | None = None
    """Each namespace's labels (`node_fit.namespace_labels`): what a pod (anti-)affinity
    term's `namespaceSelector` reads (None: not known, such a term is not read)."""
    runtimes: Mapping[str, RuntimeRule] | None = None
    """What each RuntimeClass adds to its pods (`node_fit.runtime_rules`; None: not
    known, a pod's RuntimeClass is not read)."""
    outside: tuple[Place, ...] = ()
    """The nodes without GPUs that run pods (what pod affinity on a zone or rack reads
    there); `cluster_capacity` fills it in."""
    limits: VolumeLimits = NO_LIMITS
    """How many CSI volumes each node may attach, and those VolumeAttachments attach
    (`node_fit.volume_limits`; kube-scheduler's NodeVolumeLimits)."""
    claimed: Mapping[str, tuple[str, Neighbour]] = field(default_factory=dict)
    """Each `ReadWriteOncePod` claim (`namespace/name`, `VolumeRule.one_pod`) a bound pod
    mounts: that pod's `namespace/name` and namespace and labels (kube-scheduler's
    VolumeRestrictions lets no other pod use it); `cluster_capacity` fills it in."""

    def used_by(self, claim: str, who: Neighbour | None) -> str | None:
        """The bound pod other than a worker `who` describes that uses `claim`, or None.

        A pod in `who`'s namespace with all of its labels (the job label among them) is
        one of the job's own workers.
        """
        user = self.claimed.get(claim)
        if user is None or (who is not None and user[1][0] == who[0] and who[1] <= user[1][1]):
            return None
        return user[0]


NO_FACTS = ClusterFacts()
"""A cluster model that knows nothing beyond its GPU nodes (built by hand, in tests)."""


@dataclass(frozen=True)
class NodeCapacity:
    """One GPU node as the TrainingJob decisions see it: GPU model and counts, and what is free."""

    name: str
    gpu_model: str
    total: int
    free: int
    schedulable: bool
    memory_mib: int = 0
    """Memory of one GPU (the `nvidia.com/gpu.memory` label); 0 when unknown."""
    zone: str = ""
    free_gpus: tuple[int, ...] = ()
    """Indices of the untouched GPUs (empty when built by hand: the first `free`)."""
    cpu_free_milli: int = UNBOUNDED
    """Allocatable CPU not requested by bound pods (UNBOUNDED: the node states none)."""
    memory_free_mib: int = UNBOUNDED
    """Allocatable memory not requested by bound pods (UNBOUNDED: the node states none)."""
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)
    """The node's labels (what a pod's nodeSelector and node affinity read): the node
    object's own mapping, not copied (left out of equality)."""
    taints: tuple[Taint, ...] = ()
    """The node's NoSchedule and NoExecute taints (what a pod must tolerate)."""
    cpu_milli: int = UNBOUNDED
    """Allocatable CPU (UNBOUNDED: the node states none)."""
    host_memory_mib: int = UNBOUNDED
    """Allocatable memory (UNBOUNDED: the node states none)."""
    pods_free: int = UNBOUNDED
    """Pods it may still take: its allocatable `pods` less its pods, bound or planned there
    and not yet bound (UNBOUNDED: the node states none). NodeResourcesFit's "Too many pods"."""
    others: Amounts = ()
    """Its allocatable resources other than CPU, memory, pods and GPUs (extended
    resources, `ephemeral-storage`, hugepages; `podreq.resource_amount`'s units)."""
    others_free: Amounts = ()
    """Those not requested by its pods (bound, or planned there and not yet bound)."""
    idle: int = 0
    """Untouched GPUs no pod may take: it has no pod slot left (they are not `free`)."""
    attach_limits: Amounts = ()
    """The CSI drivers its CSINode limits, and how many volumes each may attach there."""
    attached: frozenset[tuple[str, str]] = frozenset()
    """The CSI volumes (driver, handle) attached there: its pods' (bound, or planned there
    and not yet bound) and its VolumeAttachments'; kept only where `attach_limits`."""
    host_ports: frozenset[HostPort] = frozenset()
    """Host ports its pods hold (bound, or planned there and not yet bound): kube-scheduler's
    NodePorts filter keeps a pod asking one of them off the node."""
    partial: tuple[tuple[int, int], ...] = ()
    """(milli-GPU, device memory MiB) left on each GPU GPU-share pods use in part (neither
    untouched nor full); memory 0 where unknown."""
    neighbours: Crowd = NOBODY
    """Its pods (bound, or planned there and not yet bound), as pod (anti-)affinity and
    topology spread see them."""
    repels: tuple[PodTerm, ...] = ()
    """Their required pod anti-affinity terms: kube-scheduler's InterPodAffinity filter keeps
    a pod they select off the node (on `kubernetes.io/hostname`) or its domain."""
    facts: ClusterFacts = field(default=NO_FACTS, compare=False, repr=False)
    """What the cluster holds beyond its GPU nodes: the same object on every node of one
    cluster model (`facts_of`)."""


@dataclass(frozen=True, order=True)
class FreeGpus:
    """The GPUs of one type serving pods may take now (`variants.free_serving_gpus`)."""

    whole: tuple[int, ...]
    """Per node whole-GPU pods may use: its free whole GPUs, most first."""
    shares: tuple[tuple[int, int], ...] = ()
    """Per GPU a GPU-share pod may use (on the nodes those may use): (milli-GPU, device
    memory MiB) left, untouched GPUs included; memory 0 where unknown. What the free
    GPUs are compared and remembered by; `placer` places shares on them."""
    placer: SharePlacer | None = field(default=None, compare=False, repr=False)
    """Places share pods on this type as the extender would (None: no share fits)."""

    def after_shares(self, asks: Sequence[PodRequest]) -> tuple[int, tuple[int, ...]]:
        """How many of the share pods `asks` find no GPU, and `whole` once the rest are placed."""
        if not asks:
            return 0, self.whole
        if self.placer is None:
            return len(asks), self.whole
        return self.placer.place(asks)


@dataclass(frozen=True, eq=False)
class SharePlacer:
    """GPU-share pods of one GPU type placed as the extender places them, on the cluster model.

    The extender's decision (`ClusterCache.trial`: its policy, under its co-location
    rules, on the arrays of the one cluster model), tried on a copy: which GPU each
    share takes, or that none does, and which untouched GPUs that leaves to
    whole-GPU pods.
    """

    cache: ClusterCache
    """The cluster model (its co-location rules are the extender's)."""
    policy: Policy
    """The extender's placement policy."""
    share_nodes: tuple[str, ...]
    """The nodes of the type share pods may use."""
    whole_nodes: tuple[tuple[str, int], ...]
    """The nodes of the type whole-GPU pods may use, and their free whole GPUs."""
    memo: dict[tuple[PodRequest, ...], tuple[int, tuple[int, ...]]] = field(
        default_factory=dict, repr=False
    )

    def place(self, asks: Sequence[PodRequest]) -> tuple[int, tuple[int, ...]]:
        """How many of `asks` (largest first) find no GPU, and each whole node's free GPUs after.

        The whole nodes' free GPUs less the untouched GPUs the shares took there, most first.
        """
        key = tuple(sorted(asks, key=lambda r: (r.gpu_milli, r.gpu_memory_mib), reverse=True))
        known = self.memo.get(key)
        if known is not None:
            return known
        placed, after = self.cache.trial(key, self.share_nodes, self.policy)
        before = self.cache.state()
        whole = []
        for name, free in self.whole_nodes:
            i = self.cache.index(name)
            took = 0 if i is None else int(before.full_free[i] - after.full_free[i])
            whole.append(max(0, free - took))
        out = placed.count(None), tuple(sorted(whole, reverse=True))
        self.memo[key] = out
        return out


Capacity: TypeAlias = Sequence[NodeCapacity]
"""The cluster's GPU nodes as the TrainingJob decisions see them (`cluster_capacity`)."""


@dataclass(frozen=True)
class _Index:
    """Where each GPU model's nodes are in one capacity, and those nodes."""

    positions: dict[str, tuple[int, ...]]
    nodes: dict[str, tuple[NodeCapacity, ...]]
    tainted: frozenset[str] = frozenset()
    """The GPU models some node of which carries a taint."""
    crowded: frozenset[str] = frozenset()
    """The GPU models some node of which has fewer pod slots left than free GPUs (a take
    never makes another so: each worker takes a slot and at least one GPU), or none left
    beside untouched GPUs (`idle`)."""
    repelling: Mapping[str, frozenset[PodTerm]] = field(default_factory=dict)
    """Per GPU model, the pod anti-affinity terms of the pods on its nodes (`repels`)."""
    far: frozenset[PodTerm] = frozenset()
    """The pod anti-affinity terms on a topology domain above one node of every pod."""
    domains: dict[tuple[NodeRules, frozenset[PodTerm], bool], Domains] = field(default_factory=dict)
    """`node_fit.domains` of this capacity, by what was asked."""
    where: Mapping[str, int] = field(default_factory=dict)
    """Each node's position, by name."""


class _Memo:
    last: tuple[Capacity, _Index] | None = None
    """The index of the capacity last asked about (a pass asks about one capacity per job)."""


def _index(capacity: Capacity) -> _Index:
    """`capacity`'s nodes by GPU model; remembered for a tuple, which cannot change."""
    last = _Memo.last
    if last is not None and last[0] is capacity:
        return last[1]
    positions: dict[str, list[int]] = {}
    for i, n in enumerate(capacity):
        positions.setdefault(n.gpu_model, []).append(i)
    outside = facts_of(capacity).outside
    index = _Index(
        {g: tuple(p) for g, p in positions.items()},
        {g: tuple(capacity[i] for i in p) for g, p in positions.items()},
        frozenset(n.gpu_model for n in capacity if n.taints),
        frozenset(n.gpu_model for n in capacity if n.pods_free < n.free or n.idle),
        _repelling(capacity),
        frozenset(
            t
            for terms in (*(n.repels for n in capacity), *(r for _, _, r in outside))
            for t in terms
            if not t.on_node
        ),
        where={n.name: i for i, n in enumerate(capacity)},
    )
    if isinstance(capacity, tuple):
        _Memo.last = (capacity, index)
    return index


def facts_of(capacity: Capacity) -> ClusterFacts:
    """What `capacity`'s cluster holds beyond its GPU nodes (`ClusterFacts`)."""
    return capacity[0].facts if capacity else NO_FACTS


def in_cluster(capacity: Capacity, rules: NodeRules) -> NodeRules:
    """`rules` as `capacity`'s cluster reads them.

    Their terms' `namespaceSelector`s read against its namespaces' labels, and what
    their RuntimeClass adds, and the CSI volumes they mount of drivers some node limits
    (`ClusterFacts`, `NodeRules.attach`). `admitting`, `take` and `unblocked` read
    rules so; a decision that reads a rule's fields itself asks this first.
    """
    facts = facts_of(capacity)
    rules = rules.among(facts.namespaces).run_by(facts.runtimes)
    if facts.limits.drivers and (rules.claims or rules.ephemeral):
        rules = rules.attaching(rules.volumes(facts.volumes), facts.limits.drivers)
    return rules


def _repelling(capacity: Capacity) -> dict[str, frozenset[PodTerm]]:
    """Per GPU model, the distinct pod anti-affinity terms of the pods on its nodes."""
    out: dict[str, set[PodTerm]] = {}
    for n in capacity:
        if n.repels:
            out.setdefault(n.gpu_model, set()).update(n.repels)
    return {g: frozenset(t) for g, t in out.items()}


def of_type(capacity: Capacity, gpu_type: str) -> Sequence[NodeCapacity]:
    """The nodes of `capacity` with `gpu_type` GPUs, in its order.

    The scheduling pass asks this of one capacity for every waiting job and GPU
    type, so the capacities it builds (`cluster_capacity`, `take`) are tuples and
    each is indexed once.
    """
    return _index(capacity).nodes.get(gpu_type, ())


class Usable(NamedTuple):
    """The nodes of a GPU type as one job's workers see them (`admitting`)."""

    nodes: Sequence[NodeCapacity]
    """The nodes its workers may use, each one's free GPUs cut to what its free CPU and
    memory let the workers take."""
    refused: dict[str, int]
    """The nodes its workers may not use, counted by their first reason."""
    short: int = 0
    """Nodes whose free GPUs its workers cannot all take now for want of CPU, memory, another
    resource they request or pod slots."""
    blocked: int = 0
    """Nodes with free GPUs its workers cannot take now: a pod there holds a host port
    they ask (`NodeRules.port_clash`)."""
    shunned: int = 0
    """Nodes with free GPUs its workers cannot take now for a required pod (anti-)affinity:
    theirs, or a pod's there or in its zone or rack (`NodeRules.shuns`, `Domains`)."""
    positions: Mapping[str, int] | None = None
    """Where each node is in `nodes`, when some node is refused (None: as in the type's)."""
    full: int = 0
    """Nodes with untouched GPUs and no pod slot left (`NodeCapacity.idle`)."""
    shunning: Callable[[], str] | None = None
    """Works out `shuns` (None: no node is `shunned`)."""
    lacking: Callable[[], str] | None = None
    """Works out `lacks` (None: no node is `short`)."""

    def lacks(self) -> str:
        """What one of the `short` nodes lacks, in words (`_lacks`); worked out once, when asked."""
        return self.lacking() if self.lacking is not None else ""

    def shuns(self) -> str:
        """Why one of the `shunned` nodes is (`NodeRules.shuns`, `Domains.refuses`).

        Worked out when asked, once: a pass carries every answer over each start
        (`_carry_admitted`), and most are never asked why.
        """
        return self.shunning() if self.shunning is not None else ""


class _Once:
    """A reason worked out on the first call and kept (`Usable.shunning`)."""

    __slots__ = ("_make", "_said")

    def __init__(self, make: Callable[[], str]) -> None:
        self._make: Callable[[], str] | None = make
        self._said = ""

    def __call__(self) -> str:
        if self._make is not None:
            self._said, self._make = self._make(), None
        return self._said


_Whom: TypeAlias = tuple[frozenset[PodTerm] | None, bool, Domains, tuple[Skew, ...]]
"""Whether a pod (anti-)affinity or spread may concern the workers (None: none may;
else the running pods' anti-affinity terms that select them, so jobs selected alike
share answers), whether they are the first of a series their required pod affinity
may start anywhere, the topology domains terms above one node keep them in or out
of, and their topology spread constraints counted for the type (`_whom`, `_skews`)."""
_NO_ONE: _Whom = (None, False, Domains(), ())
_Asked: TypeAlias = tuple[NodeRules, int, _Whom, tuple[VolumeRule, ...]]
"""What `admitting` answers for: rules, GPUs per worker, `_Whom`, the claims' volumes."""
_ADMITTED: dict[int, tuple[Sequence[NodeCapacity], dict[_Asked, Usable]]] = {}
"""`admitting`'s answers by the type's nodes (their id), then what was asked (`_Asked`).
A pass asks it of one capacity for every job, and each start there changes one type's
nodes only (`take` keeps the others' tuples, and carries that type's answers over), so
most jobs find their answer here."""
_ADMITTED_KEPT = 4096


def admitting(capacity: Capacity, gpu_type: str, rules: NodeRules, per_worker: int = 1) -> Usable:
    """The nodes of `gpu_type` that pods with `rules` may use now (`workloads.node_fit`).

    A node refused by its labels or taints is left out; a node whose free CPU or
    memory holds fewer workers of `per_worker` GPUs than its free GPUs do counts
    only the GPUs those workers take, and one where a pod holds a host port they
    ask counts none. A type none of whose nodes carries a taint is answered without
    looking at its nodes when the rules select nothing, request no CPU or memory
    and ask no host port (most jobs, and every job of a cluster without taints). A
    node where a required pod affinity or anti-affinity keeps the workers off
    (theirs, or a pod's there or in its zone or rack) counts none too.
    """
    index = _index(capacity)
    nodes = index.nodes.get(gpu_type, ())
    rules = in_cluster(capacity, rules)
    whom = _whom(capacity, index, gpu_type, rules, per_worker)
    if (
        not _looks(rules)
        and whom[0] is None
        and gpu_type not in index.tainted
        and gpu_type not in index.crowded
    ):
        return Usable(nodes, {})
    volumes = rules.volumes(facts_of(capacity).volumes) if rules.claims or rules.ephemeral else ()
    held = _ADMITTED.get(id(nodes))
    if held is None or held[0] is not nodes:  # held by the memo: its id is not reused
        if len(_ADMITTED) >= _ADMITTED_KEPT:
            _ADMITTED.clear()
        held = _ADMITTED[id(nodes)] = (nodes, {})
    answers = held[1]
    asked = (rules, per_worker, whom, volumes)
    hit = answers.get(asked)
    if hit is not None:
        return hit
    kept: list[NodeCapacity] = []
    refused: dict[str, int] = {}
    cut = [0, 0, 0]  # nodes short of resources or slots, blocked by a host port, shunned
    was_cut: set[int] = set()  # positions in `kept` of those
    full = 0
    for n in nodes:
        why = _refusal(n, rules, volumes)
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        full += n.idle > 0
        room = _room(n, rules, per_worker, whom)
        if room < n.free:
            cut[_cause(n, rules, per_worker, whom)] += 1
            was_cut.add(len(kept))
            kept.append(replace(n, free=room, free_gpus=n.free_gpus[:room]))
        else:
            kept.append(n)
    said = ""
    for limit in _shared_domains(rules, whom):
        capped, why = _within_domain(kept, limit, per_worker)
        cut[2] += len(capped - was_cut)
        was_cut |= capped
        said = said or why
    at = {n.name: k for k, n in enumerate(kept)} if refused else None
    seen = Usable(
        tuple(kept),
        refused,
        cut[0],
        cut[1],
        cut[2],
        positions=at,
        full=full,
        shunning=_Once(partial(_shuns, nodes, rules, per_worker, whom, at, shared=said))
        if cut[2]
        else None,
        lacking=_Once(partial(_lacks, nodes, rules, per_worker, whom, at)) if cut[0] else None,
    )
    answers[asked] = seen
    return seen


_Limit: TypeAlias = tuple[str, Callable[[str], int], str]
"""How many of a gang's workers each domain of a key takes: the key, the number for a
value, and the rule in words (`_shared_domains`)."""


def _shared_domains(rules: NodeRules, whom: _Whom) -> list[_Limit]:
    """How the workers' rules share out a zone or rack among the gang's own workers.

    Their topology spread on a key other than `kubernetes.io/hostname` that selects
    them lets a domain take as many as keep its count within `maxSkew` of the least
    (`Skew.room`); their required pod anti-affinity on such a key that selects them
    lets each domain take one (the domains where a pod it selects runs are refused,
    `Domains`). kube-scheduler binds the workers one after another, each counted for
    the next.
    """
    out: list[_Limit] = []
    for skew in whom[3]:
        s = skew.spread
        if s.own and not s.term.on_node:
            out.append((s.term.key, partial(_spread_room, skew), f"its workers' {s}"))
    who = rules.who
    if who is not None:
        out.extend(
            (t.key, _one, f"its workers' pod anti-affinity on {t.key}")
            for t in rules.anti
            if not t.on_node and t.selects(who)
        )
    return out


def _spread_room(skew: Skew, value: str) -> int:
    """`Skew.room` for a domain of `value` (a constraint that selects the workers)."""
    return skew.room({skew.spread.term.key: value}, NOBODY) or 0


def _one(_value: str) -> int:
    return 1


def _left(
    n: NodeCapacity, rules: NodeRules, per_worker: int, whom: _Whom, *, had: int, shared: bool
) -> int:
    """The free GPUs of `n` workers with `rules` can take after one more went there.

    `had`: what they could take before; `shared`: a domain is shared among the gang's
    own workers (`_shared_domains`), which gave this node its part, now one less.
    """
    plain = (
        not rules.asks
        and not rules.host_ports
        and not rules.attach
        and whom[0] is None
        and n.pods_free >= n.free
    )
    left = n.free if plain else _room(n, rules, per_worker, whom)
    return min(left, had - per_worker) if shared else left


def _within_domain(
    kept: list[NodeCapacity], limit: _Limit, per_worker: int
) -> tuple[set[int], str]:
    """Cut `kept`'s free GPUs (in place) so no domain of `limit`'s key takes more workers.

    A domain whose nodes hold more workers than it may take gives them out one per
    node in turn (so a gang placed one per node, and one packed, count what the domain
    takes); nodes without the key are left as they are. Returns the positions of the
    nodes cut, and the rule in words for the first.
    """
    key, most, rule = limit
    groups: dict[str, list[int]] = {}
    for k, n in enumerate(kept):
        value = n.labels.get(key)
        if value is not None and n.schedulable and n.free >= per_worker:
            groups.setdefault(value, []).append(k)
    capped: set[int] = set()
    said = ""
    for value, members in groups.items():
        budget = most(value)
        holds = [kept[k].free // per_worker for k in members]
        if sum(holds) <= budget:
            continue
        given = [0] * len(members)
        while budget > 0:
            for j, h in enumerate(holds):
                if budget > 0 and given[j] < h:
                    given[j] += 1
                    budget -= 1
        for j, k in enumerate(members):
            room = given[j] * per_worker
            if room < kept[k].free:
                n = kept[k]
                kept[k] = replace(n, free=room, free_gpus=n.free_gpus[:room])
                capped.add(k)
        said = said or f"{rule} lets {most(value)} of them into its {key} domain {value}"
    return capped, said


def _looks(rules: NodeRules) -> bool:
    """Whether the rules may leave out or cut a node no taint is on (else all count as they are)."""
    return (
        rules.selects
        or rules.asks
        or bool(rules.host_ports)
        or bool(rules.claims)
        or bool(rules.ephemeral)
    )


def _whom(
    capacity: Capacity, index: _Index, gpu_type: str, rules: NodeRules, per_worker: int
) -> _Whom:
    """`_whom_of`, with the level each spread placed in levels reaches (`_levelled`)."""
    whom = _whom_of(capacity, index, gpu_type, rules)
    if not any(s.spread.levels for s in whom[3]):
        return whom
    nodes = index.nodes.get(gpu_type, ())
    key = (id(nodes), rules, per_worker, whom)
    hit = _LEVELS.get(key)
    if hit is not None and hit[0] is nodes:  # held here: its id is not reused
        return hit[1]
    if len(_LEVELS) >= _ADMITTED_KEPT:
        _LEVELS.clear()
    levelled = _levelled(capacity, nodes, rules, per_worker, whom)
    _LEVELS[key] = (nodes, levelled)
    return levelled


_LEVELS: dict[tuple[int, NodeRules, int, _Whom], tuple[Sequence[NodeCapacity], _Whom]] = {}
"""`_whom`'s answers for spreads placed in levels, by the type's nodes (their id), rules,
GPUs per worker and `_whom_of`'s answer: a pass asks for one job's several times
(deciding, the joint plan, placing it), and working the level out reads every node."""


def _whom_of(capacity: Capacity, index: _Index, gpu_type: str, rules: NodeRules) -> _Whom:
    """Whether a pod (anti-)affinity may keep the workers off some node of `gpu_type` (`_Whom`).

    It may when theirs may (they state one) or a pod's on a node of the type (or
    above one node, anywhere) selects them; else not, so jobs of equal rules share
    `admitting`'s answers. First: they have a required pod affinity no pod of
    `capacity` meets and they meet it themselves (kube-scheduler lets the first of
    such a series go on any node).
    """
    who = rules.who
    if who is None:
        return _NO_ONE
    far = frozenset(t for t in index.far if t.selects(who))
    near = frozenset(t for t in index.repelling.get(gpu_type, ()) if t.selects(who))
    spread = _skews(capacity, index.nodes.get(gpu_type, ()), rules)
    if not (rules.anti or rules.near or far or near or spread):
        return _NO_ONE
    outside = facts_of(capacity).outside
    first = rules.meets_near(who) and not any(
        rules.meets_near(p)
        for pods in (*(n.neighbours for n in capacity), *(p for _, p, _ in outside))
        for p in pods
    )
    if not (far or any(not t.on_node for t in (*rules.anti, *rules.near))):
        return near, first, Domains(), spread
    asked = (rules, far, first)
    known = index.domains.get(asked)
    if known is None:
        places = (*((n.labels, n.neighbours, n.repels) for n in capacity), *outside)
        known = index.domains[asked] = domains(rules, places, first=first)
    return near | far, first, known, spread


def _skews(capacity: Capacity, nodes: Sequence[NodeCapacity], rules: NodeRules) -> tuple[Skew, ...]:
    """The workers' topology spread constraints (`NodeRules.spread`) counted now (`Skew`).

    kube-scheduler's PodTopologySpread counts the pods a constraint selects in each
    domain of its key over the nodes it counts: those of `nodes` (the workers' GPU
    type's) their node selector and affinity admit, or every node
    (`nodeAffinityPolicy: Ignore`; of the nodes without GPUs the model knows those
    that run pods), less those whose taints they do not tolerate (`nodeTaintsPolicy:
    Honor`), and those without a label one of the workers' constraints is on. The
    least is over the domains found (0 with fewer than `minDomains`).
    """
    if not rules.spread:
        return ()
    keys = _spread_keys(rules)
    out: list[Skew] = []
    for s in rules.spread:
        pool: Iterable[NodeCapacity] = capacity if s.every_node else nodes
        places: Iterable[tuple[Mapping[str, str], Crowd]] = (
            (n.labels, n.neighbours) for n in pool if _counts_over(s, n, rules, keys)
        )
        if s.every_node:
            places = chain(
                places,
                (
                    (labels, pods)
                    for labels, pods, _ in facts_of(capacity).outside
                    if keys.issubset(labels)
                ),
            )
        if s.term.on_node:  # a domain a node: its pods are read where asked (`Skew.counted`)
            least, found = None, 0
            for _, pods in places:
                found += 1
                k = pods.count(s.term)
                least = k if least is None else min(least, k)
                if least == 0:
                    break
            out.append(Skew(s, 0 if least is None or found < s.min_domains else least))
            continue
        counts: dict[str, int] = {}
        for labels, pods in places:
            value = labels[s.term.key]
            counts[value] = counts.get(value, 0) + pods.count(s.term)
        least = min(counts.values()) if len(counts) >= s.min_domains and counts else 0
        out.append(Skew(s, least, tuple(sorted(counts.items()))))
    return tuple(out)


def _spread_keys(rules: NodeRules) -> frozenset[str]:
    """The keys above one node the workers' spreads are on: a node must carry them all."""
    return frozenset(s.term.key for s in rules.spread if not s.term.on_node)


def _counts_over(s: Spread, n: NodeCapacity, rules: NodeRules, keys: frozenset[str]) -> bool:
    """Whether spread `s` of workers with `rules` counts over node `n` (`_skews`).

    Its node selector and affinity admit it (or `nodeAffinityPolicy: Ignore`), its
    taints are tolerated (with `nodeTaintsPolicy: Honor`), and it carries `keys`.
    """
    return (
        (s.every_node or rules.refuses(n.name, n.labels, ()) is None)
        and not (s.honor_taints and (not n.schedulable or rules.untolerated(n.taints)))
        and keys.issubset(n.labels)
    )


def _levelled(
    capacity: Capacity,
    nodes: Sequence[NodeCapacity],
    rules: NodeRules,
    per_worker: int,
    whom: _Whom,
) -> _Whom:
    """`whom` with each spread placed in levels (`Spread.levels`) given its `Skew.level`.

    kube-scheduler binds a gang's workers one after another, each counted for the next;
    placed fewest-first, every domain (node, zone, rack) the constraint counts over
    rises to the least, over those domains, of its count plus the workers its nodes
    can take by every other rule (0 on a node they may not use), and each domain may
    take workers up to `maxSkew` above that (`_level`). Only one such spread is counted
    so: with one per node and one per zone (or rack), the zone's, each node taking what
    the per-node one lets it at the least count (whatever the order, workers bound only
    raise that least); with two above one node, or a pod anti-affinity that shares a
    zone or rack out among the gang's own workers, none; nor a spread that counts every
    node (`nodeAffinityPolicy: Ignore`: nodes of other types, which the workers never
    take). The least count is the level of the others.
    """
    skews = whom[3]
    flat = tuple(replace(k, level=k.least) if k.spread.levels else k for k in skews)
    chosen = _rising(skews)
    wide = sum(not k.spread.term.on_node for k in _risers(skews))
    who = rules.who
    apart = who is not None and any(not t.on_node and t.selects(who) for t in rules.anti)
    if chosen is None or apart or wide > 1 or len(_risers(skews)) - wide > 1:
        return whom[0], whom[1], whom[2], flat
    at = skews.index(chosen)
    others: _Whom = (  # the other spreads at the least count: what each node can take
        whom[0],
        whom[1],
        whom[2],
        tuple(f for k, f in zip(skews, flat, strict=True) if k is not chosen),
    )
    volumes = rules.volumes(facts_of(capacity).volumes) if rules.claims or rules.ephemeral else ()
    level = _level(chosen, nodes, rules, per_worker, (others, volumes))
    return whom[0], whom[1], whom[2], (*flat[:at], replace(chosen, level=level), *flat[at + 1 :])


def _risers(skews: Sequence[Skew]) -> list[Skew]:
    """The spreads placed in levels that count only the nodes the workers' affinity admits."""
    return [k for k in skews if k.spread.rises]


def _rising(skews: Sequence[Skew]) -> Skew | None:
    """The one spread a gang's levels are counted by (`_levelled`), and its workers placed by.

    Of `_risers`, the first above one node (a zone's), else the first; None: none.
    """
    risers = _risers(skews)
    return next((k for k in risers if not k.spread.term.on_node), risers[0] if risers else None)


def _level(
    skew: Skew,
    nodes: Sequence[NodeCapacity],
    rules: NodeRules,
    per_worker: int,
    by: tuple[_Whom, Sequence[VolumeRule]],
) -> int:
    """The level every domain `skew` counts over reaches, its gang bound fewest-first.

    The least, over those domains, of its count plus the workers its nodes can take by
    every other rule (`by`: whom they concern, the claims' volumes; `_takes`); the least
    count with fewer domains than `minDomains`.
    """
    s = skew.spread
    keys = _spread_keys(rules)
    if not s.term.on_node:
        reach: dict[str, int] = {}
        for n in nodes:
            if _counts_over(s, n, rules, keys):
                value = n.labels[s.term.key]
                reach[value] = reach.get(value, skew.counted(n.labels, n.neighbours)) + _takes(
                    n, rules, per_worker, *by
                )
        return min(reach.values()) if len(reach) >= s.min_domains else skew.least
    level: int | None = None
    found = 0
    for n in nodes:
        if not _counts_over(s, n, rules, keys):
            continue
        found += 1
        count = skew.counted(n.labels, n.neighbours)
        if level is not None and count >= level:
            continue  # it reaches at least its count: no lower than the level found
        reach_n = count + _takes(n, rules, per_worker, *by)
        level = reach_n if level is None else min(level, reach_n)
        if level <= skew.least:
            break
    return skew.least if level is None or found < s.min_domains else max(level, skew.least)


def _takes(
    n: NodeCapacity,
    rules: NodeRules,
    per_worker: int,
    whom: _Whom,
    volumes: Sequence[VolumeRule],
) -> int:
    """How many workers with `rules` node `n` can take now (none where `admitting` refuses it)."""
    if not n.schedulable or _refusal(n, rules, volumes) is not None:
        return 0
    return _room(n, rules, per_worker, whom) // per_worker


def _refusal(n: NodeCapacity, rules: NodeRules, volumes: Sequence[VolumeRule]) -> str | None:
    """Why workers with `rules` mounting `volumes` may never use node `n` (`admitting`), or None.

    Its labels, taints or allocatable resources (`NodeRules.refuses`), or a volume's node
    affinity or zone (`VolumeRule.refuses`).
    """
    why = rules.refuses(n.name, n.labels, n.taints, (n.cpu_milli, n.host_memory_mib, n.others))
    for v in volumes if why is None else ():
        why = v.refuses(n.name, n.labels)
        if why is not None:
            break
    return why


def _capped(n: NodeCapacity, whom: _Whom) -> int | None:
    """How many workers their topology spread lets onto `n` (None: no limit; `Skew.room`)."""
    return _tightest(n, whom)[0]


def _tightest(n: NodeCapacity, whom: _Whom) -> tuple[int | None, Skew | None]:
    """`_capped`, and the topology spread constraint that sets it (None: none does).

    A constraint of one per node that lets some there sets no limit unless it is placed
    in levels (`Skew.level`; its gang is placed Spread): else its gang is placed
    StrictSpread, one worker per node (`Spread.one_per_node`), so the node's free GPUs
    stay as they are for choosing among nodes.
    """
    least: int | None = None
    which: Skew | None = None
    for skew in whom[3]:
        room = skew.room(n.labels, n.neighbours)
        if room and skew.spread.one_per_node and skew.level is None:
            continue
        if room is not None and (least is None or room < least):
            least, which = room, skew
    return least, which


def _blocked(n: NodeCapacity, rules: NodeRules, whom: _Whom) -> int:
    """What keeps workers with `rules` off `n` now: 0 nothing, 1 a host port, 2 pod affinity.

    Or their topology spread (2). `whom`: the workers, when a pod (anti-)affinity or
    spread may concern them (`_whom`).
    """
    return _kept_off(n, rules, whom, _capped(n, whom) if whom[3] else None)


def _kept_off(n: NodeCapacity, rules: NodeRules, whom: _Whom, cap: int | None) -> int:
    """`_blocked`, given `_capped`'s answer for `n`."""
    if rules.port_clash(n.host_ports) is not None:
        return 1
    if whom[0] is not None and (
        rules.shuns(n.neighbours, n.repels, whom[1]) is not None
        or whom[2].refuses(n.labels) is not None
        or cap == 0
    ):
        return 2
    return 0


def _cause(n: NodeCapacity, rules: NodeRules, per_worker: int, whom: _Whom) -> int:
    """Why workers with `rules` take fewer of `n`'s free GPUs than it has (`_blocked`'s codes).

    0: too little CPU or memory; 1: a host port; 2: pod affinity, or their topology
    spread lets fewer workers there (`_capped`).
    """
    cap = _capped(n, whom) if whom[3] else None
    why = _kept_off(n, rules, whom, cap)
    return 2 if why == 0 and cap is not None and cap * per_worker < n.free else why


def _shuns(
    nodes: Iterable[NodeCapacity],
    rules: NodeRules,
    per_worker: int,
    whom: _Whom,
    kept: Mapping[str, int] | None,
    *,
    shared: str = "",
) -> str:
    """Why a pod (anti-)affinity or topology spread keeps the workers off the first such node.

    The first with free GPUs (or lets fewer of them there: `_cause` 2). `nodes`: the
    type's; `kept`: those its rules admit (None: all). Else `shared`: how a domain is
    shared among the gang's own workers (`_within_domain`); '' when none is.
    """
    for n in nodes:
        if n.free <= 0 or (kept is not None and n.name not in kept):
            continue
        if _cause(n, rules, per_worker, whom) == 2:  # noqa: PLR2004
            why = rules.shuns(n.neighbours, n.repels, whom[1]) or whom[2].refuses(n.labels)
            skew = _tightest(n, whom)[1] if not why else None
            return why or (skew.why(n.labels, n.neighbours) if skew is not None else "")
    return shared


def _lacks(
    nodes: Iterable[NodeCapacity],
    rules: NodeRules,
    per_worker: int,
    whom: _Whom,
    kept: Mapping[str, int] | None,
) -> str:
    """What the first node whose resources or pod slots cut the workers' room lacks, in words.

    `nodes`: the type's; `kept`: those its rules admit (None: all). '' when none does.
    """
    for n in nodes:
        if n.free <= 0 or (kept is not None and n.name not in kept):
            continue
        if _room(n, rules, per_worker, whom) < n.free and _cause(n, rules, per_worker, whom) == 0:
            room, what = _fit(n, rules)
            if what == _PODS:
                return f"free pod slots for its workers ({n.name} takes {room} more pod(s))"
            if what.startswith(_VOLUMES):
                driver = what.removeprefix(_VOLUMES)
                used = attached_of(n.attached, driver)
                return (
                    f"room for volumes of CSI driver {driver} ({n.name} attaches {used} of "
                    f"{_limit(n.attach_limits, driver)}: node(s) exceed max volume count)"
                )
            if what:
                return f"free {what} for a worker: {rules.request_of(what)}"
    return ""


_PODS = "pods"
"""What `_fit` names when a node's pod slots left set its room."""
_VOLUMES = "volumes of "
"""What `_fit` names, before the CSI driver, when a driver's volume limit sets the room."""


def unblocked(
    capacity: Capacity,
    gpu_type: str,
    rules: NodeRules,
    nodes: Iterable[NodeCapacity],
    per_worker: int = 1,
) -> list[str]:
    """The names of `nodes` (of `gpu_type`, in `capacity`) no pod keeps workers with `rules` off.

    No pod there holds a host port they ask, and no pod (anti-)affinity keeps them off
    (`_blocked`); whom an affinity concerns is worked out once for the type (`per_worker`:
    the GPUs each worker takes, for a spread placed in levels).
    """
    rules = in_cluster(capacity, rules)
    whom = _whom(capacity, _index(capacity), gpu_type, rules, per_worker)
    return [n.name for n in nodes if not _blocked(n, rules, whom)]


def _room(n: NodeCapacity, rules: NodeRules, per_worker: int, whom: _Whom) -> int:
    """The free GPUs of `n` that workers with `rules` can take.

    CPU, memory, host ports and pod (anti-)affinity allowing.
    """
    cap = _capped(n, whom) if whom[3] else None
    if _kept_off(n, rules, whom, cap):
        return 0
    pods = _fit(n, rules)[0]
    room = n.free if pods is None else min(n.free, pods * per_worker)
    return room if cap is None else min(room, cap * per_worker)


def _fit(n: NodeCapacity, rules: NodeRules) -> tuple[int | None, str]:
    """How many workers with `rules` `n`'s free resources and pod slots hold, and what sets it.

    `NodeRules.fit_by`'s answer, or `_PODS` where the pod slots left are fewer; (None, '')
    when nothing limits them.
    """
    room, what = (
        rules.fit_by(n.cpu_free_milli, n.memory_free_mib, n.others_free)
        if rules.asks
        else (None, "")
    )
    if n.pods_free != UNBOUNDED and (room is None or n.pods_free < room):
        room, what = n.pods_free, _PODS
    for volumes in rules.attach if n.attach_limits else ():
        most = _limit(n.attach_limits, volumes.driver)
        fits = volumes.room(most, n.attached) if most is not None else None
        if fits is not None and (room is None or fits < room):
            room, what = fits, _VOLUMES + volumes.driver
    return room, what


def _limit(limits: Amounts, driver: str) -> int | None:
    """How many volumes of `driver` `limits` let a node attach (None: no limit)."""
    return next((most for name, most in limits if name == driver), None)


def _gpu_count(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        limits = (c.get("resources") or {}).get("limits") or {}
        total += int(str(limits.get(GPU_RESOURCE, 0)) or 0)
    return total


def cluster_capacity(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    ignore_pods: frozenset[str] = frozenset(),
    *,
    facts: ClusterFacts = NO_FACTS,
) -> tuple[NodeCapacity, ...]:
    """Per GPU node: model, total and free whole GPUs. `ignore_pods` ("ns/name") count as free.

    `facts`: what the cluster holds beyond its nodes and pods (claims' volumes,
    namespaces' labels; the nodes without GPUs that run pods are added here).
    """
    return cluster_model(nodes, pods, ignore_pods, facts=facts)[0]


def cluster_model(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    ignore_pods: frozenset[str] = frozenset(),
    placement: PlacementRules | None = None,
    facts: ClusterFacts = NO_FACTS,
) -> tuple[tuple[NodeCapacity, ...], ClusterCache]:
    """`cluster_capacity`, and the cluster model it sums up (with `placement`'s share rules).

    `placement`: the extender's rules (its co-location rules and the request mix it
    expects), so a share is placed on the model as the extender would place it.
    """
    nodes = list(nodes)
    cache = ClusterCache(
        colocation=placement.colocation if placement is not None else None,
        typical=placement.typical if placement is not None else None,
    )
    for node in nodes:
        cache.upsert_node(node_info(node))
    promised: dict[str, int] = {}  # GPU model -> GPUs of created but not yet bound workers
    waiting: list[tuple[str, Mapping[str, Any], str]] = []
    held: dict[str, _Held] = {}  # node -> what its pods hold there
    claimed: dict[str, tuple[str, Neighbour]] = {}  # ReadWriteOncePod claim -> its bound user
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        spec = pod.get("spec") or {}
        bound_to = spec.get("nodeName")
        if key in ignore_pods or (pod.get("status") or {}).get("phase") in DONE_PHASES:
            continue
        if meta.get("deletionTimestamp"):
            continue
        if not bound_to:
            if _binding(spec):
                waiting.append((key, pod, str(spec["nodeSelector"][GPU_PRODUCT_LABEL])))
            continue
        cache.record_bound(key, pod_holding(cache, key, pod, bound_to))
        held.setdefault(str(bound_to), _Held()).add(pod, facts)
        _mark_claims(claimed, key, pod, facts.volumes)
    for key, pod, model in waiting:  # after every bound pod: a plan holds what it names
        if not hold_planned(cache, key, pod):
            promised[model] = promised.get(model, 0) + max(1, _gpu_count(pod))
            continue
        plan = planned(pod)
        if plan is not None:
            held.setdefault(plan.node, _Held()).add(pod, facts)
    state = cache.state()
    out: list[NodeCapacity] = []
    outside: tuple[Place, ...] = tuple(
        ((node.get("metadata") or {}).get("labels") or {}, Crowd(on.neighbours), on.repels)
        for node in nodes
        if cache.nodes[node["metadata"]["name"]].gpu_count == 0
        and (on := held.get(node["metadata"]["name"])) is not None
    )
    shared = replace(facts, outside=outside, claimed=claimed)
    for node in nodes:
        meta = node.get("metadata") or {}
        info = cache.nodes[meta["name"]]
        if info.gpu_count == 0:
            continue
        i = cache.index(info.name)
        assert i is not None
        on = held.get(info.name) or _Held()
        slots, others = _allocatable(node)
        pods_free = slots if slots == UNBOUNDED else max(0, slots - sum(on.neighbours.values()))
        # NodeResourcesFit: a node with no pod slot left takes no worker ("Too many pods")
        free_gpus = state.first_free_gpus(i, info.gpu_count)
        idle = len(free_gpus) if pods_free == 0 else 0
        free_gpus = () if idle else free_gpus
        left, memory = state.gpu_left[i, : info.gpu_count], state.gpu_mem_left[i, : info.gpu_count]
        in_part = (left > 0) & (left < MILLI)
        partial = (
            tuple((int(m), int(g)) for m, g in zip(left[in_part], memory[in_part], strict=True))
            if in_part.any()
            else ()
        )
        out.append(
            NodeCapacity(
                name=info.name,
                gpu_model=info.gpu_model,
                total=info.gpu_count,
                free=len(free_gpus),
                schedulable=not info.unschedulable,
                memory_mib=info.gpu_memory_mib,
                zone=(meta.get("labels") or {}).get(ZONE_LABEL, ""),
                free_gpus=free_gpus,
                cpu_free_milli=max(0, int(state.cpu_left[i])),
                memory_free_mib=max(0, int(state.mem_left[i])),
                labels=meta.get("labels") or {},
                taints=node_taints(node),
                cpu_milli=info.cpu_milli,
                host_memory_mib=info.memory_mib,
                pods_free=pods_free,
                idle=idle,
                attach_limits=(limits := facts.limits.per_node.get(info.name, ())),
                attached=on.attached | facts.limits.attached.get(info.name, frozenset())
                if limits
                else frozenset(),
                others=others,
                others_free=tuple((name, value - on.asked.get(name, 0)) for name, value in others),
                host_ports=frozenset(on.ports),
                partial=partial,
                neighbours=Crowd(on.neighbours),
                repels=tuple(dict.fromkeys(on.repels)),
                facts=shared,
            )
        )
    return tuple(_minus_promised(out, promised)), cache


def cluster_without(
    read: Capacity,
    ignore_pods: frozenset[str],
    nodes: Sequence[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    facts: ClusterFacts = NO_FACTS,
) -> Capacity:
    """`cluster_capacity(nodes, pods, ignore_pods, facts=facts)`, reading only what changes.

    `read` is `cluster_capacity(nodes, pods, facts=facts)`: the same cluster with every
    pod. Only the nodes the ignored pods are bound to are read again, and the result
    is ordered as `cluster_capacity` orders it. The whole cluster is read again when
    that would not be the same: a worker of ours waits to bind somewhere (the GPUs
    it is planned on, or promised, depend on the rest of its type), or an ignored pod
    holds a `ReadWriteOncePod` claim or runs on a node without GPUs.
    """
    if not read:
        return cluster_capacity(nodes, pods, ignore_pods, facts=facts)
    whole = partial(cluster_capacity, nodes, pods, ignore_pods, facts=facts)
    known = {n.name for n in read}
    changed: set[str] = set()
    bound: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in DONE_PHASES or meta.get("deletionTimestamp"):
            continue
        on = spec.get("nodeName")
        if not on:
            if _binding(spec):
                return whole()  # a worker waiting to bind: planned or promised GPUs
            continue
        if f"{meta.get('namespace')}/{meta.get('name')}" in ignore_pods:
            if on not in known:
                return whole()
            changed.add(str(on))
        else:
            bound.setdefault(str(on), []).append(pod)
    if not changed:
        return read
    shared = facts_of(read)
    if any(user in ignore_pods for user, _ in shared.claimed.values()):
        return whole()
    again = cluster_capacity(
        [n for n in nodes if (n.get("metadata") or {}).get("name") in changed],
        [p for name in changed for p in bound.get(name, ())],
        facts=facts,
    )
    fresh = {n.name: replace(n, facts=shared) for n in again}
    order = {(n.get("metadata") or {}).get("name"): i for i, n in enumerate(nodes)}
    out = [fresh.get(n.name, n) for n in read]
    # as `_minus_promised` orders a cluster with nothing promised: most free first, then
    # in the nodes' order
    out.sort(key=lambda n: (-n.free, order[n.name]))
    return tuple(out)


def _binding(spec: Mapping[str, Any]) -> bool:
    """A pod spec of a worker of ours not bound yet (its GPUs are planned or promised)."""
    return not spec.get("nodeName") and (
        spec.get("schedulerName") == SCHEDULER_NAME
        and bool((spec.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL))
    )


def workers_binding(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a live worker of ours waits to bind (`cluster_without` then reads it all)."""
    return any(
        _binding(p.get("spec") or {})
        and (p.get("status") or {}).get("phase") not in DONE_PHASES
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        for p in pods
    )


def _allocatable(node: Mapping[str, Any]) -> tuple[int, Amounts]:
    """The pods `node` may run (UNBOUNDED: it states none), and its other resources.

    Its allocatable (else capacity) resources other than CPU, memory, pods and GPUs
    (`NodeCapacity.others`), as kube-scheduler's NodeResourcesFit reads them; one that
    does not parse is left out (the node has none of it).
    """
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    slots = UNBOUNDED
    others: list[tuple[str, int]] = []
    for name, raw in allocatable.items():
        if name in _NOT_OTHERS:
            if name == "pods":
                with contextlib.suppress(ValueError):
                    slots = int(str(raw))
            continue
        try:
            others.append((str(name), resource_amount(str(name), raw)))
        except QuantityError:
            continue
    return slots, tuple(sorted(others))


_NOT_OTHERS = frozenset({"cpu", "memory", "pods"}) | GPU_RESOURCES


def _mark_claims(
    claimed: dict[str, tuple[str, Neighbour]],
    key: str,
    pod: Mapping[str, Any],
    volumes: Mapping[str, VolumeRule] | None,
) -> None:
    """Note the `ReadWriteOncePod` claims bound pod `key` mounts (`ClusterFacts.claimed`)."""
    if not volumes:  # not known: nothing is checked
        return
    meta = pod.get("metadata") or {}
    for claim in claims_of(pod.get("spec") or {}):
        rule = volumes.get(f"{meta.get('namespace')}/{claim}")
        if rule is not None and rule.one_pod:
            me = neighbour(str(meta.get("namespace") or ""), meta.get("labels") or {})
            claimed[rule.claim] = (key, me)


@dataclass
class _Held:
    """What the pods on one node hold there beyond resources (`NodeCapacity`'s fields)."""

    ports: set[HostPort] = field(default_factory=set)
    neighbours: dict[Neighbour, int] = field(default_factory=dict)
    repels: list[PodTerm] = field(default_factory=list)
    asked: dict[str, int] = field(default_factory=dict)
    """What they request of the resources beyond CPU, memory and GPUs (`NodeCapacity.others`)."""
    attached: frozenset[tuple[str, str]] = frozenset()
    """The CSI volumes they mount (`node_fit.attached_by`), where some node limits them."""

    def add(self, pod: Mapping[str, Any], facts: ClusterFacts) -> None:
        """One more pod there: its host ports, it, its pod anti-affinity, its other requests.

        And its CSI volumes. `facts`: each namespace's labels (what its terms'
        `namespaceSelector`s read), where each claim is.
        """
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        self.ports.update(host_ports(spec))
        me = neighbour(str(meta.get("namespace") or ""), meta.get("labels") or {})
        self.neighbours[me] = self.neighbours.get(me, 0) + 1
        self.repels.extend(anti_among(pod_anti_terms(spec, me), facts.namespaces))
        if facts.limits.drivers:
            mine = attached_by(
                str(meta.get("namespace") or ""), spec, facts.volumes, meta.get("name") or ""
            )
            self.attached = self.attached.union(mine)
        try:
            asked = pod_requests(pod)
        except PodRequestError:  # the API server's to reject: it asks nothing here
            return
        for name, value in extra_requests(asked):
            self.asked[name] = self.asked.get(name, 0) + value


Placements: TypeAlias = tuple[tuple[str, tuple[int, ...]], ...]
"""(node, GPU indices) per worker of a gang, in rank order (empty indices: node only)."""


def take(
    capacity: Capacity,
    gpu_type: str,
    workers: int,
    per_worker: int,
    *,
    strategy: PlacementStrategy = PlacementStrategy.PACK,
    placements: Sequence[tuple[str, Sequence[int]]] = (),
    rules: NodeRules | None = None,
    topology: TopologyLevel = TopologyLevel.ANY,
    required: bool = True,
) -> tuple[tuple[NodeCapacity, ...], Placements]:
    """`capacity` after a gang starts, and where its workers go.

    With `placements` (node, GPU indices per worker, from a joint plan) those
    GPUs are taken and returned. Some of them may have been taken since the plan
    was made (`_still_free`), a pod on one of those nodes may hold a host port the
    workers ask (`rules`; the joint plan does not see the ports of the other jobs it
    starts with this one), or the workers' topology spread is placed in levels
    (`Skew.level`) and the plan leaves a domain more than `maxSkew` above the least
    (`_in_levels`; the joint plan does not model it): then, as without placements,
    each worker goes
    where the extender's gang rule puts it (`solver.slots.next_slot`, the gang's
    `strategy`) and takes the node's first free GPUs; those placements are
    returned, so the gang's pods can carry them (the extender honours them).
    If some worker fits nowhere, no placements are returned and the unplaced
    workers' GPUs are taken by count, from the largest free nodes first.
    `rules`: the workers go only on nodes these admit (`admitting`); the host ports
    they ask are held on the nodes they go to, and each worker is among its node's
    pods for pod anti-affinity (with its own terms: `NodeCapacity.neighbours`, `repels`).
    `topology`: the domain all workers share (`placement.topology`): they go only into
    the one `solver.slots.gang_domain` picks; when no domain holds them, none if it is
    `required`, else anywhere (a wish).
    """
    nodes = list(capacity)
    index = _index(capacity)
    if rules is not None:
        rules = in_cluster(capacity, rules)
    whom = _whom(capacity, index, gpu_type, rules, per_worker) if rules is not None else _NO_ONE
    if (
        placements
        and _still_free(nodes, placements, index.where)
        and _kept(nodes, index.nodes.get(gpu_type, ()), placements, rules, whom)
    ):
        taken, given, elsewhere = _take_placed(nodes, placements, rules, index.where, gpu_type)
        if not elsewhere:
            _remember(capacity, taken, index, gpu_type, rules)
        return taken, given
    levels = _rising(whom[3])  # the spread `_levelled` counts in levels: placed by it
    mine = index.positions.get(gpu_type, ())
    usable = mine
    room: dict[int, int] = {}  # free GPUs the workers can take, where node rules cut them
    if rules is not None and (
        _looks(rules)
        or whom[0] is not None
        or gpu_type in index.tainted
        or gpu_type in index.crowded
    ):
        by_name = {n.name: n.free for n in admitting(capacity, gpu_type, rules, per_worker).nodes}
        usable = tuple(i for i in mine if nodes[i].name in by_name)
        room = {i: by_name[nodes[i].name] for i in usable}
    if topology is not TopologyLevel.ANY:
        usable = _in_domain(
            nodes,
            usable,
            room,
            topology=topology,
            strategy=strategy,
            workers=workers,
            per_worker=per_worker,
            required=required,
        )
    asks = rules if rules is not None and rules.asks else None
    shared = rules is not None and bool(_shared_domains(rules, whom))
    where = {nodes[i].name: i for i in usable}
    used: Counter[str] = Counter()
    placed: list[tuple[str, tuple[int, ...]]] = []
    unplaced = 0
    for w in range(workers):
        fitting = _fitting(nodes, usable, room, per_worker)
        if levels is not None:  # fewest-first, so kube-scheduler binds every worker
            fitting = _fewest(levels, nodes, where, fitting, placed)
        slot = next_slot(fitting, used, strategy, (workers - w) * per_worker)
        if slot is None:
            unplaced += 1
            continue
        used[slot] += 1
        i = where[slot]
        n = nodes[i]
        gpus = n.free_gpus[:per_worker] if len(n.free_gpus) >= per_worker else ()
        n = _took(n, per_worker, asks, rules)
        if i in room:
            assert rules is not None
            room[i] = _left(n, rules, per_worker, whom, had=room[i], shared=shared)
        nodes[i] = n
        placed.append((slot, gpus))
    if unplaced:
        return tuple(_minus_promised(nodes, {gpu_type: unplaced * per_worker})), ()
    out = tuple(nodes)
    _remember(capacity, out, index, gpu_type, rules)  # only this type's nodes changed
    return out, tuple(placed)


def _remember(
    capacity: Capacity,
    out: tuple[NodeCapacity, ...],
    index: _Index,
    gpu_type: str,
    rules: NodeRules | None,
) -> None:
    """Remember `out`'s index (`_index`), made from `capacity`'s.

    A take changed only some of `gpu_type`'s nodes, in place, and the workers it
    placed carry `rules`.
    """
    if not isinstance(capacity, tuple):
        return
    after = tuple(out[i] for i in index.positions.get(gpu_type, ()))
    repelling, far = dict(index.repelling), index.far
    if rules is not None and rules.anti:
        repelling[gpu_type] = repelling.get(gpu_type, frozenset()) | set(rules.anti)
        far |= {t for t in rules.anti if not t.on_node}
    _Memo.last = (
        out,
        _Index(
            index.positions,
            index.nodes | {gpu_type: after},
            index.tainted,
            index.crowded,
            repelling,
            far,
            where=index.where,
        ),
    )
    _carry_admitted(index.nodes.get(gpu_type, ()), after)


def _fitting(
    nodes: Sequence[NodeCapacity], usable: Sequence[int], room: Mapping[int, int], per_worker: int
) -> list[tuple[str, int]]:
    """(name, free GPUs) of the `usable` nodes a worker of `per_worker` GPUs fits on now.

    `room`: the free GPUs the workers can take where node rules cut them (empty: no node
    rule cuts this type, its free GPUs count; most jobs, the fast path).
    """
    if room:
        return [
            (nodes[i].name, room[i])
            for i in usable
            if nodes[i].schedulable and room[i] >= per_worker
        ]
    return [
        (nodes[i].name, nodes[i].free)
        for i in usable
        if nodes[i].schedulable and nodes[i].free >= per_worker
    ]


def _fewest(
    skew: Skew,
    nodes: Sequence[NodeCapacity],
    where: Mapping[str, int],
    fitting: Sequence[tuple[str, int]],
    placed: Sequence[tuple[str, Sequence[int]]],
) -> list[tuple[str, int]]:
    """Those of `fitting` whose node (or domain) a spread placed in levels counts fewest in.

    Its gang's workers `placed` so far counted: on `kubernetes.io/hostname` each node's
    pods hold them (`_marked`), above one node they are added to their domain's count.
    Placing each worker there keeps every domain within `maxSkew` of the least as they
    bind one after another (kube-scheduler's PodTopologySpread); the gang's strategy
    then picks among them.
    """
    key = skew.spread.term.key
    if skew.spread.term.on_node:
        counts = [
            skew.counted(nodes[where[n]].labels, nodes[where[n]].neighbours) for n, _ in fitting
        ]
    else:
        mine = Counter(nodes[where[n]].labels.get(key) for n, _ in placed)
        counts = [
            skew.counted(nodes[where[n]].labels, nodes[where[n]].neighbours)
            + mine[nodes[where[n]].labels.get(key)]
            for n, _ in fitting
        ]
    least = min(counts, default=0)
    return [f for f, c in zip(fitting, counts, strict=True) if c == least]


def _in_domain(
    nodes: Sequence[NodeCapacity],
    usable: Sequence[int],
    room: Mapping[int, int],
    *,
    topology: TopologyLevel,
    strategy: PlacementStrategy,
    workers: int,
    per_worker: int,
    required: bool,
) -> tuple[int, ...]:
    """Those of `usable` in the `topology` domain the gang goes into.

    When no domain holds it: none if `required`, else all of `usable`. `room`: the
    free GPUs the workers can take where node rules cut them (else `free`).
    """
    fitting = [(nodes[i].name, room.get(i, nodes[i].free)) for i in usable if nodes[i].schedulable]
    domains = {
        nodes[i].name: domain_of(nodes[i].name, nodes[i].labels, topology) or "" for i in usable
    }
    chosen = gang_domain(fitting, domains, strategy, workers, per_worker)
    if chosen is None and not required:
        return tuple(usable)
    return tuple(i for i in usable if chosen is not None and domains[nodes[i].name] == chosen)


def _kept(
    nodes: Sequence[NodeCapacity],
    mine: Sequence[NodeCapacity],
    placements: Sequence[tuple[str, Sequence[int]]],
    rules: NodeRules | None,
    whom: _Whom,
) -> bool:
    """Whether `take` keeps a joint plan's `placements` (of `mine`, the type's nodes).

    No pod there keeps the workers off (`_placed_where_blocked`), and a spread counted
    in levels, if one is (only one), lets kube-scheduler bind them (`_in_levels`); with
    more they are placed again.
    """
    if _placed_where_blocked(nodes, placements, rules, whom):
        return False
    counted = [k for k in whom[3] if k.level is not None]
    if not counted:
        return True
    return (
        rules is not None and len(counted) == 1 and _in_levels(mine, placements, counted[0], rules)
    )


def _in_levels(
    nodes: Sequence[NodeCapacity],
    placements: Sequence[tuple[str, Sequence[int]]],
    skew: Skew,
    rules: NodeRules,
) -> bool:
    """Whether kube-scheduler binds a gang placed so under its spread in levels (`Skew.level`).

    Each domain (of `nodes`, the type's) that gets workers ends at most `maxSkew` above
    the least final count of a domain the constraint counts over (0 with fewer than
    `minDomains`): bound fewest-first, each worker then passes PodTopologySpread in
    turn. A node it does not count over (without its key) refuses them.
    """
    s = skew.spread
    keys = _spread_keys(rules)
    final: dict[str, int] = {}
    domain: dict[str, str] = {}
    for n in nodes:
        if _counts_over(s, n, rules, keys):
            d = domain[n.name] = n.name if s.term.on_node else n.labels[s.term.key]
            if d not in final:
                final[d] = skew.counted(n.labels, n.neighbours)
    for name, _ in placements:
        if name not in domain:
            return False
        final[domain[name]] += 1
    least = min(final.values()) if len(final) >= s.min_domains else 0
    return all(final[domain[name]] <= least + s.skew for name, _ in placements)


def _still_free(
    nodes: Sequence[NodeCapacity],
    placements: Sequence[tuple[str, Sequence[int]]],
    where: Mapping[str, int],
) -> bool:
    """Whether every GPU `placements` names is free in `nodes` (`where`: position by name).

    A plan's placements were made on the capacity its own starts left; the pass may
    have given those GPUs to a job before this one that the plan did not place (one
    it left out, or one whose workers it did not place: the gang rule put it on what
    was left). Then the workers are placed again, never on GPUs already taken.
    """
    asked: Counter[str] = Counter()
    for name, gpus in placements:
        i = where.get(name)
        if i is None:
            return False
        free = nodes[i].free_gpus
        if free and not set(gpus) <= set(free):
            return False
        asked[name] += len(gpus)
    return all(nodes[where[name]].free >= n for name, n in asked.items())


def _placed_where_blocked(
    nodes: Sequence[NodeCapacity],
    placements: Sequence[tuple[str, Sequence[int]]],
    rules: NodeRules | None,
    whom: _Whom,
) -> bool:
    """Whether a pod on a node of `placements` keeps the workers off it (`_blocked`).

    A host port they ask, or a pod (anti-)affinity: the joint plan does not see the
    other jobs it starts in the same pass.
    """
    if rules is None or (not rules.host_ports and whom[0] is None):
        return False
    on = {name for name, _ in placements}
    return any(_blocked(n, rules, whom) for n in nodes if n.name in on)


def _take_placed(
    nodes: list[NodeCapacity],
    placements: Sequence[tuple[str, Sequence[int]]],
    rules: NodeRules | None,
    where: Mapping[str, int],
    gpu_type: str,
) -> tuple[tuple[NodeCapacity, ...], Placements, bool]:
    """`take` with the workers' nodes and GPUs given (a joint plan's, or the fleet plan's).

    `where`: each node's position by name. The last value says whether a node not of
    `gpu_type` was taken from.
    """
    elsewhere = False
    for name, gpus in placements:
        i = where.get(name)
        if i is None:
            continue
        n = nodes[i]
        elsewhere |= n.gpu_model != gpu_type
        rest = tuple(g for g in n.free_gpus if g not in set(gpus))
        n = replace(n, free=max(0, n.free - len(gpus)), free_gpus=rest)
        nodes[i] = _marked(_spent(n, rules if rules is not None and rules.asks else None), rules)
    return tuple(nodes), tuple((name, tuple(gpus)) for name, gpus in placements), elsewhere


def _took(
    n: NodeCapacity, per_worker: int, asks: NodeRules | None, rules: NodeRules | None
) -> NodeCapacity:
    """`n` after one worker took its first free GPUs, its CPU and memory (`_marked`).

    `asks`: the workers' rules when they request CPU, memory or another resource (None:
    they request none).
    """
    n = replace(n, free=n.free - per_worker, free_gpus=n.free_gpus[per_worker:])
    return _marked(_spent(n, asks), rules)


def _spent(n: NodeCapacity, asks: NodeRules | None) -> NodeCapacity:
    """`n` after one more worker took a pod slot, and what `asks` requests.

    `asks`: the workers' rules when they request CPU, memory or another resource (None:
    they request none).
    """
    if n.pods_free != UNBOUNDED:
        n = replace(n, pods_free=max(0, n.pods_free - 1))
    if asks is not None:
        n = replace(
            n,
            cpu_free_milli=_less(n.cpu_free_milli, asks.cpu_milli),
            memory_free_mib=_less(n.memory_free_mib, asks.memory_mib),
            others_free=tuple(
                (name, max(0, free - amount_of(asks.extra, name))) for name, free in n.others_free
            )
            if asks.extra
            else n.others_free,
        )
    return n


def _marked(n: NodeCapacity, rules: NodeRules | None) -> NodeCapacity:
    """`n` with one more worker of `rules` there.

    Its host ports held, it among the pods pod anti-affinity reads, its CSI volumes
    attached, its own anti-affinity terms in force there.
    """
    if rules is None:
        return n
    if rules.host_ports:
        n = replace(n, host_ports=n.host_ports.union(rules.host_ports))
    if rules.who is not None:
        n = replace(n, neighbours=n.neighbours.plus(rules.who))
    if rules.attach and n.attach_limits:
        n = replace(n, attached=n.attached | _mounted(rules.attach, len(n.attached)))
    new = tuple(t for t in rules.anti if t not in n.repels)
    return replace(n, repels=n.repels + new) if new else n


def _mounted(attach: Iterable[Attach], seen: int) -> set[tuple[str, str]]:
    """The volumes one more worker mounting `attach` attaches.

    Its own volumes get handles of their own, numbered from `seen` (the node's count of
    attached volumes).
    """
    out: set[tuple[str, str]] = set()
    for volumes in attach:
        out.update((volumes.driver, h) for h in volumes.shared)
        out.update((volumes.driver, f"\0#{seen + k}") for k in range(volumes.own))
        seen += volumes.own
    return out


def _carry_admitted(before: Sequence[NodeCapacity], after: Sequence[NodeCapacity]) -> None:
    """`admitting`'s answers for `after` (a take changed a few of `before`'s nodes).

    Made from `before`'s, for everything asked of it (`_Asked`): the next
    job finds its answer without looking at every node again.
    """
    held = _ADMITTED.get(id(before))
    if held is None or held[0] is not before:
        return
    changed = [(k, a) for k, (b, a) in enumerate(zip(before, after, strict=True)) if b is not a]
    carried: dict[_Asked, Usable] = {}
    # a copy (one C-level step): another thread's decision may add an answer meanwhile
    for (rules, per_worker, whom, volumes), seen in tuple(held[1].items()):
        if _shared_domains(rules, whom) or any(k.level is not None for k in whom[3]):
            continue  # a change anywhere in a domain, or to the level: asked again
        kept = list(seen.nodes)
        cut = [seen.short, seen.blocked, seen.shunned]  # as in `admitting`
        for k, new in changed:
            pos = k if seen.positions is None else seen.positions.get(new.name)
            if pos is None:  # refused by its labels or taints: still so
                continue
            if kept[pos].free < before[k].free:
                cut[_cause(before[k], rules, per_worker, whom)] -= 1
            room = _room(new, rules, per_worker, whom)
            if room < new.free:
                cut[_cause(new, rules, per_worker, whom)] += 1
                kept[pos] = replace(new, free=room, free_gpus=new.free_gpus[:room])
            else:
                kept[pos] = new
        shunning = (
            _Once(partial(_shuns, after, rules, per_worker, whom, seen.positions))
            if cut[2]
            else None
        )
        carried[rules, per_worker, whom, volumes] = Usable(
            tuple(kept),
            seen.refused,
            cut[0],
            cut[1],
            cut[2],
            positions=seen.positions,
            full=seen.full,  # a take fills no node with untouched GPUs: it takes them
            shunning=shunning,
            lacking=_Once(partial(_lacks, after, rules, per_worker, whom, seen.positions))
            if cut[0]
            else None,
        )
    if len(_ADMITTED) >= _ADMITTED_KEPT:
        _ADMITTED.clear()
    _ADMITTED[id(after)] = (after, carried)


def _less(free: int, asked: int) -> int:
    return free if free == UNBOUNDED else max(0, free - asked)


def _minus_promised(nodes: list[NodeCapacity], promised: dict[str, int]) -> list[NodeCapacity]:
    """Treat GPUs promised to started-but-unbound gangs as taken (largest free nodes first)."""
    result = []
    left = dict(promised)
    for node in sorted(nodes, key=lambda n: -n.free):
        take = min(node.free, left.get(node.gpu_model, 0))
        if not take:
            result.append(node)
            continue
        left[node.gpu_model] -= take
        result.append(replace(node, free=node.free - take, free_gpus=node.free_gpus[take:]))
    return result
