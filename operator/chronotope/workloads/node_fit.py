"""Which nodes a workload's pods may land on: kube-scheduler's NodeAffinity and TaintToleration.

A TrainingJob's worker pods carry its template's `nodeSelector`, required node
affinity and tolerations (`workloads.gang` only adds the GPU type's selector).
kube-scheduler filters every node by them before our extender sees it, so a
plan on a node they rule out never binds: the gang waits until the stuck rule
re-plans it, on the same node again. The decisions therefore plan a job only
on the nodes its pods may use (`NodeRules.admits`), with kube-scheduler's
rules (`k8s.io/component-helpers/scheduling/corev1`):

- every `nodeSelector` pair (except the GPU product label, which the planner
  sets) must be among the node's labels;
- `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`: at
  least one of its `nodeSelectorTerms` matches (a term's `matchExpressions` on
  labels and `matchFields` on `metadata.name` all hold; an empty term matches
  nothing); operators In, NotIn, Exists, DoesNotExist, Gt, Lt;
- every `NoSchedule` and `NoExecute` taint is tolerated (`PreferNoSchedule` is
  a preference, not a filter); a toleration with no key and `Exists` tolerates
  every taint, one with no effect every effect. A taint on `nvidia.com/gpu`
  counts as tolerated by workers that ask for whole GPUs: the API server's
  ExtendedResourceToleration admission plugin (on in GKE and most GPU
  clusters) adds that toleration to every pod that requests the resource.

And NodeResourcesFit: a node holds only as many pods as its free CPU, memory and
every other resource they request (allocatable less what bound pods request;
extended resources, `ephemeral-storage`, hugepages; a node that lists none of one
has none) allow (`NodeRules.fit_by`), so a node with free GPUs but too little CPU
for a worker does not count them for it; its pod slots left (`capacity`) likewise.
And NodeVolumeLimits: a node attaches at most its CSINode's count of a driver's
volumes (`volume_limits`, `NodeRules.attach`, `Attach.room`).

And NodePorts: a pod asking host ports (`ports[].hostPort` of its containers and
of its init containers that run all along, `restartPolicy: Always`; with
`hostNetwork: true` every container port is a host port, as the API server
defaults it) fits a node only where no pod bound there holds one of them
(`host_ports`, `port_clash`: kube-scheduler's `HostPortInfo.CheckConflict`, an
unset host IP is 0.0.0.0 and clashes with every IP, an unset protocol is TCP).
Two workers of one gang asking the same port never share a node, so such a
gang is placed strictly spread (`job_spec`); so is a gang whose workers keep off
each other's nodes by a required pod anti-affinity on `kubernetes.io/hostname`
that matches their own labels (`avoids_itself`: the common "one worker per node"
idiom). And InterPodAffinity on `kubernetes.io/hostname`: a node is no place for
the workers when their required pod anti-affinity selects a pod there, or a pod
there has one that selects them (`pod_anti_terms`), or when their required pod
affinity is met by no pod there (`pod_affinity_terms`; unless no pod anywhere
meets it and they meet it themselves: the first of a series goes anywhere, and
a gang whose workers meet their own affinity is packed onto one node,
`seeks_itself`). `NodeRules.shuns` decides; the pods of each node are
`capacity.NodeCapacity.neighbours`. Terms on another topology key (a zone, a
rack) keep the workers in or out of whole domains of that label, from the pods
of every node, GPU or not (`domains`). A term's `namespaceSelector` naming
labels is read against the namespaces' labels (`PodTerm.among`, as kube-scheduler
merges the namespaces it selects into those the term lists); a gang's zone
anti-affinity to itself lets each zone take one of its workers (`capacity`'s
`_shared_domains`). And PodTopologySpread (`spread_terms`, `Skew`): a constraint
counts the pods it selects per domain of its topology key (the pods of each node
are a `Crowd`), and a node is refused where its domain's count, plus one if it
selects the workers, is more than `maxSkew` above the least; it lets the workers
it selects into a domain while the count stays within `maxSkew` of the least (a
gang it selects on `kubernetes.io/hostname` with `maxSkew: 1` is placed Spread,
fewest-first, `job_spec`; on another key, `capacity` shares each domain out among the
gang's own workers; a gang placed Pack or Spread takes its nodes or domains in
levels, `levelled`).
And the API server's RuntimeClass admission: a pod's RuntimeClass adds its node
selector, tolerations and overhead (`runtime_rules`, `NodeRules.run_by`).

Preferred (soft) node and pod affinity are not filters and are left to
kube-scheduler's scoring. Pure: plain dicts in, answers out.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from math import ceil
from typing import Any, NamedTuple, TypeAlias

from chronotope.api.quantity import QuantityError, cpu_milli, memory_mib, parse_quantity
from chronotope.api.v1alpha1.trainingjob import (
    AVOID_MAX,
    PlacementStrategy,
    TopologyLevel,
    TrainingJobSpec,
)
from chronotope.sharing.labels import GPU_PRODUCT_LABEL, GPU_RESOURCE, HOSTNAME_LABEL, ZONE_LABEL
from chronotope.solver.model import UNBOUNDED
from chronotope.solver.slots import DOMAIN_LABELS
from chronotope.workloads.cluster_feed import CONDITION_TAINTS
from chronotope.workloads.podreq import PodRequestError, extra_requests, pod_requests

__all__ = [
    "ANY_HOST_IP",
    "CPU_OR_MEMORY",
    "EPHEMERAL",
    "NOBODY",
    "NO_LIMITS",
    "NO_PROVISIONER",
    "VOLUME_ZONE_LABELS",
    "Amounts",
    "Attach",
    "Crowd",
    "Domains",
    "Ephemeral",
    "HostPort",
    "NamespaceLabels",
    "Neighbour",
    "NodeRules",
    "Place",
    "PodTerm",
    "RuntimeRule",
    "Skew",
    "Spread",
    "Taint",
    "VolumeLimits",
    "VolumeRule",
    "amount_of",
    "anti_among",
    "apart",
    "attached_by",
    "attached_of",
    "avoiding",
    "avoids_itself",
    "claim_class",
    "claims_of",
    "domains",
    "ephemeral_claims",
    "host_ports",
    "job_rules",
    "labelled",
    "levelled",
    "namespace_labels",
    "near_among",
    "neighbour",
    "next_avoid",
    "node_taints",
    "pod_affinity_terms",
    "pod_anti_terms",
    "port_clash",
    "quantity_words",
    "runtime_rules",
    "seeks_itself",
    "seeks_itself_within",
    "spread_terms",
    "spreads_itself",
    "template_apart",
    "template_pods",
    "volume_limits",
    "volume_rules",
]

FILTER_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects kube-scheduler's TaintToleration filter enforces."""

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True)
class Taint:
    """A node taint (`spec.taints[]`)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        """As kubectl writes it: `key=value:Effect`."""
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """The filtering taints (NoSchedule, NoExecute) of a node object, in its order.

    Not the taints Kubernetes puts on for a node's conditions or a cordon
    (`cluster_feed.CONDITION_TAINTS`): those say the node takes no pod *now*, which
    `node_schedulable` answers; a job waits for such a node, it is not refused by it.
    """
    out = []
    for t in (node.get("spec") or {}).get("taints") or []:
        if not isinstance(t, Mapping) or t.get("effect") not in FILTER_EFFECTS:
            continue
        if t.get("key") in CONDITION_TAINTS:
            continue
        out.append(Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"])))
    return tuple(out)


ANY_HOST_IP = "0.0.0.0"
"""A host port's IP when it names none: it binds every address of the node."""


@dataclass(frozen=True, order=True)
class HostPort:
    """One host port a pod takes on its node (kube-scheduler's `HostPortInfo` entry)."""

    port: int
    protocol: str = "TCP"
    ip: str = ANY_HOST_IP

    def __str__(self) -> str:
        """As kubectl shows a port: `7777/TCP`, with its IP when it names one."""
        on = f" on {self.ip}" if self.ip != ANY_HOST_IP else ""
        return f"{self.port}/{self.protocol}{on}"


def host_ports(spec: object) -> tuple[HostPort, ...]:
    """The host ports a pod with this spec takes (`GetHostPorts`); malformed ones state none.

    Its containers' ports with a `hostPort`, and those of its init containers that
    run all along (`restartPolicy: Always`); with `hostNetwork: true`, a port with
    no `hostPort` takes its `containerPort` (the API server's defaulting).
    """
    if not isinstance(spec, Mapping):
        return ()
    host_network = spec.get("hostNetwork") is True
    containers = [
        c
        for c in spec.get("initContainers") or []
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    ]
    containers += [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    out: set[HostPort] = set()
    for c in containers:
        ports = c.get("ports")
        for p in ports if isinstance(ports, list) else []:
            if not isinstance(p, Mapping):
                continue
            raw = p.get("hostPort") or (p.get("containerPort") if host_network else 0)
            try:
                port = int(raw or 0)
            except (TypeError, ValueError):
                continue
            if port > 0:
                out.add(
                    HostPort(
                        port, str(p.get("protocol") or "TCP"), str(p.get("hostIP") or ANY_HOST_IP)
                    )
                )
    return tuple(sorted(out))


def port_clash(wanted: Iterable[HostPort], used: Iterable[HostPort]) -> HostPort | None:
    """The first of the `wanted` host ports a node whose pods hold `used` cannot give; or None.

    kube-scheduler's `HostPortInfo.CheckConflict`: the same protocol and port on
    the same IP, or on any IP when either side binds every address (0.0.0.0).
    """
    taken = list(used)
    if not taken:
        return None
    for w in wanted:
        for u in taken:
            if (u.port, u.protocol) != (w.port, w.protocol):
                continue
            if ANY_HOST_IP in (w.ip, u.ip) or w.ip == u.ip:
                return w
    return None


_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

NamespaceLabels: TypeAlias = Mapping[str, Mapping[str, str]]
"""Each namespace's labels by its name (`namespace_labels`): what a `namespaceSelector` reads."""

Neighbour: TypeAlias = tuple[str, frozenset[tuple[str, str]]]
"""A pod as a pod (anti-)affinity term sees it: its namespace and labels."""


def neighbour(namespace: str, labels: Mapping[Any, Any]) -> Neighbour:
    """A pod of `namespace` with `labels` as a pod (anti-)affinity term sees it."""
    return namespace, frozenset((str(k), str(v)) for k, v in labels.items())


class Crowd(Mapping[Neighbour, int]):
    """The pods on one node as pod (anti-)affinity and topology spread read them.

    How many pods of each namespace and labels (`Neighbour`) run there: affinity asks
    whether one does (iterating yields each kind once), topology spread how many a
    selector counts (`count`). Immutable and hashable, as the node it describes.
    """

    __slots__ = ("_counts", "_hash")

    def __init__(self, counts: Mapping[Neighbour, int] | None = None) -> None:
        """From each kind's count (None: no pod)."""
        self._counts: dict[Neighbour, int] = {p: k for p, k in (counts or {}).items() if k > 0}
        self._hash: int | None = None

    def __getitem__(self, pod: Neighbour) -> int:
        """How many pods like `pod` run there."""
        return self._counts[pod]

    def __iter__(self) -> Iterator[Neighbour]:
        """Each kind of pod there, once."""
        return iter(self._counts)

    def __len__(self) -> int:
        """How many kinds of pod run there."""
        return len(self._counts)

    def __eq__(self, other: object) -> bool:
        """Equal counts of equal pods."""
        if isinstance(other, Crowd):
            return self._counts == other._counts
        return NotImplemented

    def __hash__(self) -> int:
        """Of its counts, worked out once."""
        if self._hash is None:
            self._hash = hash(frozenset(self._counts.items()))
        return self._hash

    def __repr__(self) -> str:
        """Its counts."""
        return f"Crowd({self._counts!r})"

    def plus(self, pod: Neighbour, k: int = 1) -> Crowd:
        """The crowd with `k` more pods like `pod`."""
        return Crowd({**self._counts, pod: self._counts.get(pod, 0) + k})

    def count(self, term: PodTerm) -> int:
        """How many of its pods `term` selects."""
        total = 0
        for p, k in self._counts.items():
            if term.selects(p):
                total += k
        return total


NOBODY = Crowd()
"""A node with no pod."""


@dataclass(frozen=True)
class PodTerm:
    """A required pod affinity or anti-affinity term: whom it selects, and where.

    kube-scheduler's `AffinityTerm`: a pod is selected when it is in one of
    `namespaces` (None: every namespace, an empty `namespaceSelector`) and its
    labels meet every requirement of the label selector; `key` is its topology key
    (the pods it concerns are those on nodes with the same value of that label).
    """

    selector: tuple[_Requirement, ...]
    namespaces: frozenset[str] | None
    key: str = HOSTNAME_LABEL
    spaces: tuple[_Requirement, ...] | None = None
    """Its `namespaceSelector` when that names labels, not yet read against the
    namespaces' labels (`among`); `namespaces` then holds those it lists by name."""

    @property
    def on_node(self) -> bool:
        """It is on `kubernetes.io/hostname`: it concerns one node's pods."""
        return self.key == HOSTNAME_LABEL

    def selects(self, pod: Neighbour) -> bool:
        """Whether the term selects the pod `pod` (namespace, labels); never before `among`."""
        namespace, labels = pod
        if self.spaces is not None:
            return False
        if self.namespaces is not None and namespace not in self.namespaces:
            return False
        have = dict(labels)
        return all(r.holds(have.get(r.key)) for r in self.selector)

    def among(self, namespaces: NamespaceLabels | None) -> PodTerm | None:
        """The term with its `namespaceSelector` read against `namespaces`' labels.

        kube-scheduler's `mergeAffinityTermNamespacesIfNotEmpty`: the namespaces it
        selects join those it lists. None when it has such a selector and the labels
        are not known (`namespaces` None): it cannot be read.
        """
        if self.spaces is None:
            return self
        if namespaces is None:
            return None
        chosen = {
            name
            for name, labels in namespaces.items()
            if all(r.holds(labels.get(r.key)) for r in self.spaces)
        }
        return PodTerm(self.selector, frozenset(chosen | (self.namespaces or set())), self.key)


def anti_among(terms: Iterable[PodTerm], namespaces: NamespaceLabels | None) -> tuple[PodTerm, ...]:
    """Pod anti-affinity terms read against `namespaces` (`PodTerm.among`); unreadable: left out."""
    return tuple(t for t in (t.among(namespaces) for t in terms) if t is not None)


def near_among(terms: Sequence[PodTerm], namespaces: NamespaceLabels | None) -> tuple[PodTerm, ...]:
    """Pod affinity terms read against `namespaces`; none when one cannot be (unmodelled)."""
    out = [t.among(namespaces) for t in terms]
    return () if None in out else tuple(t for t in out if t is not None)


def pod_anti_terms(spec: object, pod: Neighbour) -> tuple[PodTerm, ...]:
    """The required pod anti-affinity terms of a pod spec, on any topology key.

    `pod`: the pod's own namespace (a term naming no namespaces and no
    `namespaceSelector` is for it) and labels (its `matchLabelKeys` and
    `mismatchLabelKeys` read them, as the API server merges them into the selector).
    A term whose `namespaceSelector` names labels is read against the namespaces'
    labels later (`PodTerm.among`, `anti_among`). A missing selector (it selects
    nothing) or a malformed part is left out.
    """
    return tuple(t for t in _pod_terms(spec, pod, "podAntiAffinity") if t is not None)


def pod_affinity_terms(spec: object, pod: Neighbour) -> tuple[PodTerm, ...]:
    """The required pod affinity terms of a pod spec, when all are read here; else none.

    As `pod_anti_terms` reads them (`near_among` reads a `namespaceSelector`); one
    that cannot be read (no selector, a malformed part) leaves the pod's affinity
    unmodelled: no term is returned.
    """
    terms = _pod_terms(spec, pod, "podAffinity")
    return () if None in terms else tuple(t for t in terms if t is not None)


def _pod_terms(
    spec: object, pod: Neighbour, kind: str, key: str | None = None
) -> list[PodTerm | None]:
    """The required terms of `kind` (podAffinity, podAntiAffinity) on topology `key`.

    None where a term is on another key (`key` None: any) or unreadable.
    """
    if not isinstance(spec, Mapping):
        return []
    affinity = spec.get("affinity")
    part = affinity.get(kind) if isinstance(affinity, Mapping) else None
    raw = (
        part.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(part, Mapping)
        else None
    )
    out: list[PodTerm | None] = []
    for term in raw if isinstance(raw, list) else []:
        where = term.get("topologyKey") if isinstance(term, Mapping) else None
        if not isinstance(term, Mapping) or not where or (key is not None and where != key):
            out.append(None)
            continue
        selector = _label_selector(term.get("labelSelector"))
        keys = _keys(term.get("matchLabelKeys"), pod[1], "In")
        not_keys = _keys(term.get("mismatchLabelKeys"), pod[1], "NotIn")
        known, namespaces, spaces = _term_namespaces(term, pod[0])
        if selector is None or keys is None or not_keys is None or not known:
            out.append(None)
            continue
        out.append(PodTerm((*selector, *keys, *not_keys), namespaces, str(where), spaces))
    return out


def _keys(
    raw: object, labels: frozenset[tuple[str, str]], operator: str
) -> list[_Requirement] | None:
    """`matchLabelKeys` (`In`) or `mismatchLabelKeys` (`NotIn`) as requirements on `labels`."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        return None
    have = dict(labels)
    return [_Requirement(str(k), operator, (have[str(k)],)) for k in raw if str(k) in have]


def _term_namespaces(
    term: Mapping[str, Any], own: str
) -> tuple[bool, frozenset[str] | None, tuple[_Requirement, ...] | None]:
    """Whether a term's namespaces can be read, which (None: every one), and its selector.

    kube-scheduler's `getNamespacesFromPodAffinityTerm`: no `namespaces` and no
    `namespaceSelector` is the pod's own namespace; an empty selector, every one; a
    selector naming labels is returned to be read against the namespaces' labels
    (`PodTerm.among`), with the namespaces the term lists.
    """
    listed = term.get("namespaces") or []
    chosen = term.get("namespaceSelector")
    if not isinstance(listed, list):
        return False, None, None
    if chosen is None:
        return True, frozenset(map(str, listed)) if listed else frozenset({own}), None
    spaces = _label_selector(chosen)
    if spaces is None:
        return False, None, None
    if not spaces:
        return True, None, None
    return True, frozenset(map(str, listed)), spaces


@dataclass(frozen=True)
class Spread:
    """A topology spread constraint kube-scheduler filters by (`spread_terms`)."""

    term: PodTerm
    """The pods it counts (those its selector selects in the pod's own namespace), and
    its topology key (`PodTerm.key`)."""
    skew: int = 1
    """Its `maxSkew`."""
    own: bool = False
    """Its selector selects the pod itself (kube-scheduler's `selfMatchNum` is 1)."""
    honor_taints: bool = False
    """`nodeTaintsPolicy: Honor`: a node whose taints the pod does not tolerate (a
    cordoned one too) is not among the nodes it counts over (default Ignore)."""
    every_node: bool = False
    """`nodeAffinityPolicy: Ignore`: every node counts, not only those the pod's node
    selector and affinity admit (default Honor)."""
    min_domains: int = 1
    """`minDomains`: with fewer domains to count over, the least count is taken as 0."""
    levels: bool = False
    """It selects its gang's workers, placed Pack or Spread (`levelled`): kube-scheduler,
    binding them one after another, lets a domain (a node, a zone) take more once every
    domain it counts has risen, so the plan counts what each takes up to the level they
    all reach (`Skew.level`), cuts each to it, and places the workers fewest-first."""

    @property
    def rises(self) -> bool:
        """Placed in levels (`levels`) over only the nodes its pod's affinity admits.

        With `nodeAffinityPolicy: Ignore` it counts nodes the workers never take, which
        never rise: the least count stays its level.
        """
        return self.levels and not self.every_node

    @property
    def one_per_node(self) -> bool:
        """It puts one of its pods on a node (`maxSkew` 1 on `kubernetes.io/hostname`, `own`).

        Two of them share no node while a node it counts over runs fewer: a gang it
        selects is placed Spread, fewest-first (`spreads_itself`, `levelled`).
        """
        return self.own and self.term.on_node and self.skew == 1

    def __str__(self) -> str:
        """The constraint as its reasons name it."""
        return f"topology spread (maxSkew {self.skew} on {self.term.key})"


def spread_terms(spec: object, pod: Neighbour) -> tuple[Spread, ...]:
    """The pod's topology spread constraints that kube-scheduler filters by.

    Those with `whenUnsatisfiable: DoNotSchedule` (`ScheduleAnyway` only scores): each
    counts the pods its `labelSelector` (and `matchLabelKeys`, with the pod's own
    values) selects in the pod's own namespace, per domain of its `topologyKey`, and
    refuses a node where the count of its domain, plus one if it selects the pod
    itself, is more than `maxSkew` above the least count of a domain (`Skew`,
    counted by `capacity`).
    """
    raw = spec.get("topologySpreadConstraints") if isinstance(spec, Mapping) else None
    out: list[Spread] = []
    for c in raw if isinstance(raw, list) else []:
        if not isinstance(c, Mapping) or c.get("whenUnsatisfiable") != "DoNotSchedule":
            continue
        key, skew = c.get("topologyKey"), c.get("maxSkew")
        if not isinstance(key, str) or not key or not isinstance(skew, int) or skew < 1:
            continue
        selector = _label_selector(c.get("labelSelector"))
        keys = _keys(c.get("matchLabelKeys"), pod[1], "In")
        least = c.get("minDomains")
        if selector is not None and keys is not None:
            term = PodTerm((*selector, *keys), frozenset({pod[0]}), key)
            out.append(
                Spread(
                    term,
                    skew=skew,
                    own=term.selects(pod),
                    honor_taints=c.get("nodeTaintsPolicy") == "Honor",
                    every_node=c.get("nodeAffinityPolicy") == "Ignore",
                    min_domains=least if isinstance(least, int) and least > 1 else 1,
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Skew:
    """A topology spread constraint counted in one cluster: what it lets a node take.

    kube-scheduler's PodTopologySpread filter: a node is refused when the pods the
    constraint counts in its domain, plus one if it selects the pod itself, are more
    than `maxSkew` above the least count of a domain it counts over. So pods it
    selects may go to a domain while its count stays within `maxSkew` of `least`:
    `room` of them (a gang's workers, bound one after another, only raise the least
    count); a pod it does not select goes where the count is within `maxSkew` of it.
    """

    spread: Spread
    least: int
    """The least count of a domain it counts over (0 with fewer than `minDomains`)."""
    counts: tuple[tuple[str, int], ...] = ()
    """The count of each domain, by its value (on `kubernetes.io/hostname`, each node's
    pods are read instead: `Crowd.count`)."""
    level: int | None = None
    """For a constraint placed in levels (`Spread.levels`): the least, over the domains
    it counts, of a domain's count plus the workers its nodes can take
    (`capacity._levelled`); the count no domain's stays below once the gang is bound
    fewest-first, so a domain may take workers up to `maxSkew` above it. None: `least`
    bounds them."""

    @cached_property
    def _by(self) -> dict[str, int]:
        return dict(self.counts)

    @cached_property
    def _hashed(self) -> int:
        return hash((self.spread, self.least, self.counts, self.level))

    def __hash__(self) -> int:
        """Of its fields, worked out once (it keys `capacity`'s memo on every ask)."""
        return self._hashed

    def counted(self, labels: Mapping[str, str], crowd: Crowd) -> int:
        """The pods it counts in the domain of a node with `labels` and pods `crowd`."""
        term = self.spread.term
        return crowd.count(term) if term.on_node else self._by.get(labels.get(term.key, ""), 0)

    def room(self, labels: Mapping[str, str], crowd: Crowd) -> int | None:
        """How many pods with the constraint a node with `labels` and pods `crowd` may take.

        None: no limit from it (it does not select them, and the node's domain is
        within `maxSkew` of the least).
        """
        over = self.counted(labels, crowd) - (self.least if self.level is None else self.level)
        if self.spread.own:
            return max(0, self.spread.skew - over)
        return 0 if over > self.spread.skew else None

    def why(self, labels: Mapping[str, str], crowd: Crowd) -> str:
        """The constraint's count on a node, in words (for a node it refuses or limits)."""
        term = self.spread.term
        where = "there" if term.on_node else f"in its {term.key} domain {labels.get(term.key)}"
        room = self.room(labels, crowd)
        said = (
            f"its workers' {self.spread} counts {self.counted(labels, crowd)} pod(s) {where}, "
            f"the fewest in a domain is {self.least}"
        )
        if self.level is not None and self.level > self.least:
            said += f", and every domain it counts reaches {self.level}"
        return said if not room else f"{said} (room for {room} worker(s))"


def spreads_itself(spec: object, labels: Mapping[str, str], namespace: str = "") -> bool:
    """Whether pods with this spec, `labels` and `namespace` spread one per node (`spread_terms`).

    One of their topology spread constraints of `maxSkew` 1 on `kubernetes.io/hostname`
    selects them: two of them may share no node while a node they count over runs
    fewer of them.
    """
    own = neighbour(namespace, labels)
    return any(s.one_per_node for s in spread_terms(spec, own))


def apart(spec: object, labels: Mapping[str, str], namespace: str, *, spread: bool) -> str | None:
    """Why pods with this spec, `labels` and `namespace` may share no node, in words; or None.

    They ask host ports (`host_ports`), or their pod anti-affinity keeps them apart
    (`avoids_itself`); with `spread`, or their topology spread constraint puts one on a
    node (`spreads_itself`: while a node it counts over runs fewer of them).
    """
    ports = host_ports(spec)
    if ports:
        return f"its workers ask host port(s) {', '.join(map(str, ports))}"
    if avoids_itself(spec, labels, namespace):
        return (
            "a required pod anti-affinity on kubernetes.io/hostname matches its workers' own labels"
        )
    if spread and spreads_itself(spec, labels, namespace):
        return (
            "a topology spread constraint (maxSkew 1 on kubernetes.io/hostname) matches its "
            "workers' own labels"
        )
    return None


def template_apart(template: Mapping[str, Any] | None) -> str | None:
    """`apart` (spread included) for a pod template whose metadata names its namespace."""
    who = template_pods(template)
    if who is None:
        return None
    return apart((template or {}).get("spec"), dict(who[1]), who[0], spread=True)


def template_pods(template: Mapping[str, Any] | None) -> Neighbour | None:
    """The namespace and labels of a pod template's pods, when its metadata names a namespace.

    As `job_spec` names them (the job's namespace, its labels and job label): what pod
    (anti-)affinity and topology spread select.
    """
    meta = (template or {}).get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    if not isinstance(meta.get("namespace"), str):
        return None
    labels = meta.get("labels")
    return neighbour(meta["namespace"], labels if isinstance(labels, Mapping) else {})


def avoids_itself(spec: object, labels: Mapping[str, str], namespace: str = "") -> bool:
    """Whether pods with this spec, `labels` and `namespace` may not share a node with each other.

    One of their required pod anti-affinity terms on `kubernetes.io/hostname`
    (`pod_anti_terms`) selects their own labels in their own namespace.
    """
    own = neighbour(namespace, labels)
    return any(t.on_node and t.selects(own) for t in pod_anti_terms(spec, own))


def seeks_itself(spec: object, labels: Mapping[str, str], namespace: str = "") -> bool:
    """Whether pods with this spec, `labels` and `namespace` must share a node with each other.

    Their required pod affinity on `kubernetes.io/hostname` (`pod_affinity_terms`) is
    met by their own labels in their own namespace: once one runs, the others may go
    only where a pod that meets it runs.
    """
    own = neighbour(namespace, labels)
    terms = pod_affinity_terms(spec, own)
    return bool(terms) and all(t.on_node and t.selects(own) for t in terms)


def seeks_itself_within(
    spec: object, labels: Mapping[str, str], namespace: str = ""
) -> TopologyLevel | None:
    """The domain pods with this spec must share with each other, above one node; or None.

    Every term of their required pod affinity is on one topology key (a zone, rack or
    NVLink domain label) and is met by their own labels in their own namespace: once
    one runs, kube-scheduler puts the others only in its domain (`seeks_itself` is the
    same on `kubernetes.io/hostname`).
    """
    own = neighbour(namespace, labels)
    for level, key in DOMAIN_LABELS.items():
        terms = _pod_terms(spec, own, "podAffinity", key)
        if terms and None not in terms and all(t is not None and t.selects(own) for t in terms):
            return level
    return None


def _label_selector(selector: object) -> tuple[_Requirement, ...] | None:
    """A label selector (`matchLabels`, `matchExpressions`) as requirements; None: none selected.

    A missing or malformed selector selects nothing; an empty one every pod.
    """
    if not isinstance(selector, Mapping):
        return None
    match = selector.get("matchLabels") or {}
    raw = selector.get("matchExpressions") or []
    if not isinstance(match, Mapping) or not isinstance(raw, list):
        return None
    out = [_Requirement(str(k), "In", (str(v),)) for k, v in match.items()]
    for r in raw:
        if not isinstance(r, Mapping) or r.get("operator") not in _SELECTOR_OPERATORS:
            return None
        values = r.get("values") or []
        if not r.get("key") or not isinstance(values, list):
            return None
        out.append(_Requirement(str(r["key"]), str(r["operator"]), tuple(map(str, values))))
    return tuple(out)


@dataclass(frozen=True)
class _Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"  # an empty key tolerates everything only so
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class _Requirement:
    key: str
    operator: str
    values: tuple[str, ...]

    def holds(self, value: str | None) -> bool:
        op = self.operator
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        # Gt / Lt: one integer value, compared with the label's integer value
        if value is None or len(self.values) != 1:
            return False
        try:
            have, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound

    def __str__(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} ({','.join(self.values)})"


@dataclass(frozen=True)
class _Term:
    labels: tuple[_Requirement, ...]
    fields: tuple[_Requirement, ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.labels and not self.fields:
            return False
        return all(r.holds(labels.get(r.key)) for r in self.labels) and all(
            r.holds(name if r.key == "metadata.name" else None) for r in self.fields
        )


class Attach(NamedTuple):
    """The CSI volumes of one driver each pod of a template mounts (`NodeRules.attach`)."""

    driver: str
    shared: tuple[str, ...]
    """The handles of the volumes its pods share (one per node, however many pods)."""
    own: int
    """The volumes each pod has of its own (generic ephemeral volumes)."""

    def room(self, most: int, attached: Collection[tuple[str, str]]) -> int | None:
        """How many of its pods fit a node that may attach `most` of the driver's volumes.

        kube-scheduler's NodeVolumeLimits: the node's volumes of the driver (`attached`:
        driver and handle of each) and the pod's new ones may not exceed its CSINode's
        `allocatable.count`. None: no limit.
        """
        left = (
            most
            - attached_of(attached, self.driver)
            - sum(1 for h in self.shared if (self.driver, h) not in attached)
        )
        if left < 0:
            return 0
        return left // self.own if self.own else None


def attached_of(attached: Iterable[tuple[str, str]], driver: str) -> int:
    """How many of the volumes (driver, handle) `attached` are `driver`'s."""
    return sum(1 for d, _ in attached if d == driver)


Amounts: TypeAlias = tuple[tuple[str, int], ...]
"""Resources by name, sorted, each in `podreq.resource_amount`'s units."""

CPU_OR_MEMORY = "CPU or memory"
"""What `NodeRules.fit_by` names when a node's free CPU or memory sets its room."""


def amount_of(amounts: Amounts, resource: str) -> int:
    """How much of `resource` `amounts` holds (0 when it lists none)."""
    for name, value in amounts:
        if name == resource:
            return value
    return 0


def quantity_words(value: int) -> str:
    """A base-unit amount as a quantity: whole GiB, MiB or KiB as such, else the number."""
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


@dataclass(frozen=True)
class NodeRules:
    """What a pod template says about the nodes its pods may run on."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[_Term, ...] | None = None
    """The required node affinity's terms (ORed); None when it states none."""
    tolerations: tuple[_Toleration, ...] = ()
    whole_gpus: bool = True
    """The pods ask for whole `nvidia.com/gpu` GPUs (the admission plugin tolerates that taint)."""
    cpu_milli: int = 0
    """CPU one pod requests (kube-scheduler's NodeResourcesFit sums its containers)."""
    memory_mib: int = 0
    """Memory one pod requests."""
    extra: Amounts = ()
    """Every other resource one pod requests (extended resources other than GPUs,
    `ephemeral-storage`, hugepages; `podreq.extra_requests`): a node must have as much
    of each free (NodeResourcesFit; one that lists none has none)."""
    host_ports: tuple[HostPort, ...] = ()
    """The host ports one pod takes on its node (`host_ports`)."""
    anti: tuple[PodTerm, ...] = ()
    """Its pods' required pod anti-affinity (`pod_anti_terms`)."""
    near: tuple[PodTerm, ...] = ()
    """Its pods' required pod affinity (`pod_affinity_terms`)."""
    spread: tuple[Spread, ...] = ()
    """Its pods' topology spread constraints kube-scheduler filters by (`spread_terms`)."""
    claims: tuple[str, ...] = ()
    """The PersistentVolumeClaims its pods mount (`claims_of`), by name in their namespace."""
    ephemeral: tuple[tuple[str, str], ...] = ()
    """Its pods' generic ephemeral volumes' StorageClasses and claim templates
    (`ephemeral_claims`)."""
    runtime: str = ""
    """The RuntimeClass its pods name (`runtimeClassName`), until `run_by` adds what it
    says ('' for none, or once added)."""
    attach: tuple[Attach, ...] = ()
    """The CSI volumes its pods mount of each driver some node limits (`attaching`)."""
    who: Neighbour | None = field(default=None, compare=False)
    """Its pods' namespace and labels (what other pods' anti-affinity selects), when the
    template's metadata names a namespace (`job_spec` adds the job's). Not compared:
    jobs of equal templates have equal rules; a decision that reads it keys on it."""

    @classmethod
    def of_template(cls, template: Mapping[str, Any] | None, *, whole_gpus: bool) -> NodeRules:
        """The rules of a pod template (`{"spec": {...}}`); malformed parts state nothing.

        The API server rejects a malformed pod when the workers are created, and the
        controller reports that; here it only must not make a node look forbidden.
        """
        who = template_pods(template)
        spec = (template or {}).get("spec")
        if not isinstance(spec, Mapping):
            return cls(whole_gpus=whole_gpus, who=who)
        selector = spec.get("nodeSelector")
        pairs: tuple[tuple[str, str], ...] = ()
        if isinstance(selector, Mapping):
            pairs = tuple(
                sorted((str(k), str(v)) for k, v in selector.items() if str(k) != GPU_PRODUCT_LABEL)
            )
        try:
            asked = pod_requests({"spec": spec})
        except PodRequestError:
            asked = {}
        return cls(
            selector=pairs,
            terms=_terms(spec.get("affinity")),
            tolerations=tuple(_tolerations(spec.get("tolerations"))),
            whole_gpus=whole_gpus,
            cpu_milli=asked.get("cpu", 0),
            memory_mib=asked.get("memory", 0),
            extra=extra_requests(asked),
            host_ports=host_ports(spec),
            anti=pod_anti_terms(spec, who) if who is not None else (),
            near=pod_affinity_terms(spec, who) if who is not None else (),
            spread=spread_terms(spec, who) if who is not None else (),
            claims=claims_of(spec),
            ephemeral=ephemeral_claims(spec),
            runtime=str(spec.get("runtimeClassName") or ""),
            who=who,
        )

    def among(self, namespaces: NamespaceLabels | None) -> NodeRules:
        """The rules with their pod (anti-)affinity's `namespaceSelector`s read (`PodTerm.among`).

        `namespaces`: each namespace's labels (None: not known; an anti-affinity term
        with such a selector is then left out, and an affinity with one is unmodelled).
        """
        if not any(t.spaces is not None for t in (*self.anti, *self.near)):
            return self
        return replace(
            self, anti=anti_among(self.anti, namespaces), near=near_among(self.near, namespaces)
        )

    def run_by(self, runtimes: Mapping[str, RuntimeRule] | None) -> NodeRules:
        """The rules once the API server's RuntimeClass admission added its RuntimeClass's.

        Its `scheduling.nodeSelector` pairs join the pods' node selector, its
        tolerations theirs, its `overhead` their CPU and memory. Unchanged when it names
        none, or the classes are not known; one that is missing, or whose selector
        conflicts with the pods', is `runtime_refusal`'s.
        """
        if not self.runtime or runtimes is None:
            return self
        rule = runtimes.get(self.runtime)
        if rule is None:
            return self
        return replace(
            self,
            selector=tuple(sorted(set(self.selector) | set(rule.selector))),
            tolerations=self.tolerations + rule.tolerations,
            cpu_milli=self.cpu_milli + rule.cpu_milli,
            memory_mib=self.memory_mib + rule.memory_mib,
            runtime="",
        )

    def attaching(self, volumes: Iterable[VolumeRule], limited: Collection[str]) -> NodeRules:
        """The rules with the CSI volumes their pods mount (`attach`) of the `limited` drivers.

        `volumes`: where its claims may be used (`volumes`), each counted as
        kube-scheduler's NodeVolumeLimits counts it (`VolumeRule.attach`).
        """
        shared: dict[str, set[str]] = {}
        own: dict[str, int] = {}
        for v in volumes:
            if v.attach is None or v.attach[0] not in limited:
                continue
            driver, handle = v.attach
            shared.setdefault(driver, set())
            if handle:
                shared[driver].add(handle)
            else:
                own[driver] = own.get(driver, 0) + 1
        attach = tuple(
            Attach(d, tuple(sorted(handles)), own.get(d, 0))
            for d, handles in sorted(shared.items())
        )
        return replace(self, attach=attach) if attach != self.attach else self

    def runtime_refusal(self, runtimes: Mapping[str, RuntimeRule] | None) -> str | None:
        """Why the API server rejects its pods for their RuntimeClass, or None.

        The RuntimeClass admission plugin refuses a pod whose RuntimeClass does not
        exist, or whose node selector gives one of the class's keys another value.
        """
        if not self.runtime or runtimes is None:
            return None
        rule = runtimes.get(self.runtime)
        if rule is None:
            return f"RuntimeClass {self.runtime} not found"
        mine = dict(self.selector)
        for key, value in rule.selector:
            if key in mine and mine[key] != value:
                return (
                    f"its nodeSelector {key}={mine[key]} conflicts with RuntimeClass "
                    f"{self.runtime}'s {key}={value}"
                )
        return None

    @property
    def selects(self) -> bool:
        """It narrows nodes by their labels or names (a selector or a required affinity)."""
        return bool(self.selector) or self.terms is not None

    def volumes(self, rules: Mapping[str, VolumeRule] | None) -> tuple[VolumeRule, ...]:
        """Where the claims its pods mount may be used, from `rules` (`volume_rules`).

        None when the cluster's claims are not known here (nothing is checked); a claim
        `rules` lacks is missing. Read only with `who` (the pods' namespace) known. And
        where each generic ephemeral volume's claim may be (its class's rule, once the
        classes are known; a class `rules` lacks does not exist).
        """
        if rules is None or self.who is None:
            return ()
        keys = (f"{self.who[0]}/{c}" for c in self.claims)
        out = [
            rules.get(k) or VolumeRule(k, refusal=f"PersistentVolumeClaim {k} not found")
            for k in keys
        ]
        if EPHEMERAL in rules:  # the classes are known
            for c, template in self.ephemeral:
                rule = rules.get(EPHEMERAL + c)
                if rule is None:
                    rule = VolumeRule(
                        EPHEMERAL + c,
                        refusal=f"StorageClass {c} of a generic ephemeral volume not found",
                    )
                out.append(rule.made.rule(template) if rule.made is not None else rule)
        return tuple(out)

    @property
    def asks(self) -> bool:
        """Its pods request CPU, memory or another resource (a node's free share may bind)."""
        return self.cpu_milli > 0 or self.memory_mib > 0 or bool(self.extra)

    def port_clash(self, used: Iterable[HostPort]) -> HostPort | None:
        """The first host port its pods ask that a node whose pods hold `used` cannot give."""
        return port_clash(self.host_ports, used) if self.host_ports else None

    def shuns(
        self,
        neighbours: Iterable[Neighbour],
        repels: Iterable[PodTerm],
        first: bool = False,
    ) -> str | None:
        """Why its pods may not join a node's pods (InterPodAffinity), or None.

        The terms on `kubernetes.io/hostname` (those on other keys: `domains`).
        `neighbours`: the pods there; `repels`: their required pod anti-affinity terms.
        `first`: no pod anywhere meets its pods' required pod affinity and they meet it
        themselves (the first of a series: any node will do). Read only with `who`
        known. Topology spread counts pods: `Skew`.
        """
        if self.who is None:
            return None
        here = any(t.on_node for t in self.near)
        if here and not first and not any(self.meets_near(p) for p in neighbours):
            return "no pod there matches its workers' required pod affinity"
        if any(t.on_node and t.selects(p) for t in self.anti for p in neighbours):
            return "a pod there matches its workers' pod anti-affinity"
        if any(t.on_node and t.selects(self.who) for t in repels):
            return "a pod there has a pod anti-affinity that matches its workers"
        return None

    def meets_near(self, pod: Neighbour) -> bool:
        """Whether `pod` meets every term of its pods' required pod affinity (`near`)."""
        return bool(self.near) and all(t.selects(pod) for t in self.near)

    def untolerated(self, taints: Iterable[Taint]) -> Taint | None:
        """The first of `taints` its pods do not tolerate (TaintToleration), or None.

        A taint on `nvidia.com/gpu` counts as tolerated by pods asking whole GPUs (the
        ExtendedResourceToleration admission plugin adds that toleration).
        """
        for taint in taints:
            if self.whole_gpus and taint.key == GPU_RESOURCE:
                continue
            if not any(t.tolerates(taint) for t in self.tolerations):
                return taint
        return None

    def fit_by(
        self, cpu_free_milli: int, memory_free_mib: int, others: Amounts = ()
    ) -> tuple[int | None, str]:
        """How many of its pods a node's free CPU, memory and `others` hold, and what sets it.

        None: no limit; then `CPU_OR_MEMORY`, a resource's name, or '' (no limit).
        `others`: the node's free amounts of the other resources (`extra`); one it does
        not list it has none of (kube-scheduler's NodeResourcesFit).
        """
        room: int | None = None
        what = ""
        for asked, free in ((self.cpu_milli, cpu_free_milli), (self.memory_mib, memory_free_mib)):
            if asked > 0 and free != UNBOUNDED:
                n = max(0, free) // asked
                if room is None or n < room:
                    room, what = n, CPU_OR_MEMORY
        for name, asked in self.extra:
            n = max(0, amount_of(others, name)) // asked
            if room is None or n < room:
                room, what = n, name
        return room, what

    def request_of(self, resource: str) -> str:
        """What one pod requests of `resource` (or of CPU and memory: `CPU_OR_MEMORY`), in words."""
        if resource == CPU_OR_MEMORY:
            return f"{self.cpu_milli}m CPU, {self.memory_mib} MiB"
        return f"{quantity_words(amount_of(self.extra, resource))} {resource}"

    def refuses(
        self,
        name: str,
        labels: Mapping[str, str],
        taints: Iterable[Taint],
        allocatable: tuple[int, int, Amounts] | None = None,
    ) -> str | None:
        """Why the pods may not run on this node (kube-scheduler's words, short), or None.

        `allocatable`: the node's (CPU milli, memory MiB, other resources) for pods; a
        node where not even one pod fits, with every other pod gone, refuses it for good.
        """
        for key, value in self.selector:
            if labels.get(key) != value:
                return f"nodeSelector {key}={value}"
        if self.terms is not None and not any(t.matches(name, labels) for t in self.terms):
            if any(t.matches("", labels) for t in self.terms):
                return "node affinity excluding it by name"  # status.avoidNodes, most often
            return "required node affinity"
        taint = self.untolerated(taints)
        if taint is not None:
            return f"taint {taint} not tolerated"
        if allocatable is not None and self.asks:
            fit, what = self.fit_by(*allocatable)
            if fit == 0:
                return f"allocatable {what} below one worker's request ({self.request_of(what)})"
        for s in self.spread:  # PodTopologySpread: a node without the key is no domain
            if not s.term.on_node and s.term.key not in labels:
                return f"no {s.term.key} label for its workers' {s}"
        return None


@dataclass(frozen=True)
class RuntimeRule:
    """What a RuntimeClass adds to its pods (the API server's RuntimeClass admission)."""

    selector: tuple[tuple[str, str], ...] = ()
    """Its `scheduling.nodeSelector` pairs (merged into the pods' node selector)."""
    tolerations: tuple[_Toleration, ...] = ()
    """Its `scheduling.tolerations` (added to the pods')."""
    cpu_milli: int = 0
    """Its `overhead.podFixed` CPU (kube-scheduler's NodeResourcesFit counts it)."""
    memory_mib: int = 0
    """Its `overhead.podFixed` memory."""


def runtime_rules(classes: Iterable[Mapping[str, Any]]) -> dict[str, RuntimeRule]:
    """A `RuntimeRule` per RuntimeClass name, from RuntimeClass objects (malformed parts: none)."""
    out: dict[str, RuntimeRule] = {}
    for k in classes:
        scheduling = k.get("scheduling") or {}
        selector = scheduling.get("nodeSelector") if isinstance(scheduling, Mapping) else None
        fixed = (k.get("overhead") or {}).get("podFixed") or {}
        try:
            cpu, memory = cpu_milli(fixed.get("cpu", 0)), memory_mib(fixed.get("memory", 0))
        except QuantityError:
            cpu, memory = 0, 0
        out[str((k.get("metadata") or {}).get("name"))] = RuntimeRule(
            tuple(sorted((str(a), str(b)) for a, b in selector.items()))
            if isinstance(selector, Mapping)
            else (),
            tuple(_tolerations(scheduling.get("tolerations")))
            if isinstance(scheduling, Mapping)
            else (),
            cpu,
            memory,
        )
    return out


def claims_of(spec: object) -> tuple[str, ...]:
    """The claim names of a pod spec's `persistentVolumeClaim` volumes, in order, once each."""
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    out: list[str] = []
    for v in volumes if isinstance(volumes, list) else []:
        claim = v.get("persistentVolumeClaim") if isinstance(v, Mapping) else None
        name = claim.get("claimName") if isinstance(claim, Mapping) else None
        if isinstance(name, str) and name and name not in out:
            out.append(name)
    return tuple(out)


VOLUME_ZONE_LABELS = (
    ZONE_LABEL,
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
)
"""The PersistentVolume labels kube-scheduler's VolumeZone filter matches nodes by."""


@dataclass(frozen=True)
class VolumeRule:
    """Where pods mounting one PersistentVolumeClaim may run.

    kube-scheduler's VolumeBinding filter for a bound claim (the node meets the
    PersistentVolume's required `nodeAffinity`) and its VolumeZone filter (the node's
    zone and region labels are among the volume's); a claim that is missing or being
    deleted fits no node. An unbound claim whose StorageClass binds at once (or that
    names none) fits no node until it is bound; one whose class waits for the first
    consumer may go where a PersistentVolume it could bind to may be used, or where
    the class's `allowedTopologies` allow it to provision one and its CSI driver, if
    it reports capacity, has room (`_Storage`; not a class with no provisioner,
    `kubernetes.io/no-provisioner`: local volumes are static).
    """

    claim: str
    """`namespace/name`."""
    volume: str = ""
    """Where its volume comes from, in words: `PersistentVolume NAME` it is bound to, or
    `StorageClass NAME` that provisions it ('' when neither states anything)."""
    terms: tuple[_Term, ...] | None = None
    """The volume's required node affinity (ORed; None: it states none)."""
    zones: tuple[tuple[str, frozenset[str]], ...] = ()
    """The volume's zone and region labels: the values a node's label must be one of."""
    refusal: str | None = None
    """Why it fits no node (missing, being deleted), or None."""
    one_pod: bool = False
    """Its access mode is `ReadWriteOncePod`: one pod at a time may use it (kube-scheduler's
    VolumeRestrictions), so it holds one worker of a gang at most."""
    made: Ephemeral | None = field(default=None, compare=False, repr=False)
    """A generic ephemeral volume's class: the rule of each claim template (`Ephemeral`)."""
    attach: tuple[str, str] | None = None
    """The CSI driver and volume handle kube-scheduler's NodeVolumeLimits counts it as on
    a node: its PersistentVolume's `csi`; unbound, its class's provisioner and a handle
    of its own ('' for a generic ephemeral volume's claim: one per pod). None: not
    counted (not a CSI volume; in-tree volumes migrated to CSI are not translated)."""

    def refuses(self, name: str, labels: Mapping[str, str]) -> str | None:
        """Why pods mounting it may not run on node `name` with `labels`, or None."""
        if self.refusal is not None:
            return self.refusal
        if self.terms is not None and not any(t.matches(name, labels) for t in self.terms):
            return f"volume node affinity conflict ({self.volume})"
        for key, values in self.zones:
            if labels.get(key) not in values:
                return f"volume zone conflict ({self.volume}: {key})"
        return None


def volume_rules(
    claims: Iterable[Mapping[str, Any]],
    volumes: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]] | None = None,
    drivers: Iterable[Mapping[str, Any]] = (),
    capacities: Iterable[Mapping[str, Any]] = (),
) -> dict[str, VolumeRule]:
    """A `VolumeRule` per PersistentVolumeClaim (`namespace/name`), from the objects.

    `classes`: the StorageClasses (None: not known; an unbound claim states nothing);
    `drivers` and `capacities`: the CSIDrivers and CSIStorageCapacities (`_Storage`).
    """
    by_name = {str((v.get("metadata") or {}).get("name")): v for v in volumes}
    by_class: dict[str, list[Mapping[str, Any]]] = {}
    for v in by_name.values():
        by_class.setdefault(_volume_class(v), []).append(v)
    kinds = None
    out: dict[str, VolumeRule] = {}
    storage = _Storage.of(drivers, capacities)
    if classes is not None:
        kinds = {str((k.get("metadata") or {}).get("name")): k for k in classes}
        out |= _ephemeral_rules(kinds, by_class, storage)
    for c in claims:
        meta = c.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        out[key] = _claim_rule(c, key, by_name, by_class, kinds, storage=storage)
        if "ReadWriteOncePod" in ((c.get("spec") or {}).get("accessModes") or ()):
            out[key] = replace(out[key], one_pod=True)
    return out


def _claim_rule(
    c: Mapping[str, Any],
    key: str,
    by_name: Mapping[str, Mapping[str, Any]],
    by_class: Mapping[str, Sequence[Mapping[str, Any]]],
    kinds: Mapping[str, Mapping[str, Any]] | None,
    *,
    storage: _Storage,
) -> VolumeRule:
    """The `VolumeRule` of claim `c` (`key`: namespace/name), from the volumes and classes."""
    meta = c.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return VolumeRule(key, refusal=f"PersistentVolumeClaim {key} is being deleted")
    bound = str((c.get("spec") or {}).get("volumeName") or "")
    pv = by_name.get(bound)
    if not bound and kinds is not None:
        name = claim_class(c)
        return _unbound(c, name, kinds, by_class.get(name, ()) if name else (), storage)
    if pv is None:  # not known, or its volume not yet seen: binding under way
        return VolumeRule(key, attach=_by_class(kinds, claim_class(c), key))
    labels = (pv.get("metadata") or {}).get("labels") or {}
    zones = tuple(
        (k, frozenset(str(labels[k]).split("__"))) for k in VOLUME_ZONE_LABELS if labels.get(k)
    )
    csi = (pv.get("spec") or {}).get("csi") or {}
    attach = (str(csi["driver"]), str(csi.get("volumeHandle") or "")) if csi.get("driver") else None
    return VolumeRule(key, f"PersistentVolume {bound}", _volume_terms(pv), zones, attach=attach)


def _by_class(
    kinds: Mapping[str, Mapping[str, Any]] | None, name: str, key: str
) -> tuple[str, str] | None:
    """How NodeVolumeLimits counts claim `key` of class `name` with no volume known yet.

    As a volume of the class's provisioner with a handle of its own (kube-scheduler's
    `getCSIDriverInfoFromSC`); None without a known class (`key` '': a generic ephemeral
    volume's claim, one per pod).
    """
    kind = kinds.get(name) if kinds is not None and name else None
    provisioner = str((kind or {}).get("provisioner") or "")
    return (provisioner, _OWN_HANDLE + key if key else "") if provisioner else None


_OWN_HANDLE = "\0"
"""Starts the handle of a volume not provisioned yet (no CSI volume handle does)."""


@dataclass(frozen=True)
class VolumeLimits:
    """How many CSI volumes each node may attach, and those attached outside its pods.

    kube-scheduler's NodeVolumeLimits reads each node's CSINode (a driver's
    `allocatable.count`) and the VolumeAttachments to it (`volume_limits`).
    """

    per_node: Mapping[str, Amounts] = field(default_factory=dict)
    """Per node, the drivers its CSINode limits and how many volumes each may attach."""
    attached: Mapping[str, frozenset[tuple[str, str]]] = field(default_factory=dict)
    """Per node, the CSI volumes (driver, handle) VolumeAttachments attach there."""
    drivers: frozenset[str] = frozenset()
    """The drivers some node limits (a template mounting none of theirs is not counted)."""


def volume_limits(
    csi_nodes: Iterable[Mapping[str, Any]],
    attachments: Iterable[Mapping[str, Any]],
    volumes: Iterable[Mapping[str, Any]],
) -> VolumeLimits:
    """The `VolumeLimits` the CSINodes, VolumeAttachments and PersistentVolumes state.

    A VolumeAttachment counts as its attacher's volume of its PersistentVolume's CSI
    handle (one without an attacher, a PersistentVolume name, or a CSI volume is not
    counted, as kube-scheduler skips it).
    """
    per_node: dict[str, Amounts] = {}
    for c in csi_nodes:
        limits = tuple(
            sorted(
                (str(d["name"]), int((d.get("allocatable") or {})["count"]))
                for d in (c.get("spec") or {}).get("drivers") or []
                if d.get("name") and (d.get("allocatable") or {}).get("count") is not None
            )
        )
        if limits:
            per_node[str((c.get("metadata") or {}).get("name"))] = limits
    handles: dict[str, str] = {}
    for v in volumes:
        csi = (v.get("spec") or {}).get("csi") or {}
        if csi.get("volumeHandle"):
            handles[str((v.get("metadata") or {}).get("name"))] = str(csi["volumeHandle"])
    attached: dict[str, set[tuple[str, str]]] = {}
    for a in attachments:
        spec = a.get("spec") or {}
        handle = handles.get(str((spec.get("source") or {}).get("persistentVolumeName")))
        if spec.get("attacher") and spec.get("nodeName") and handle:
            attached.setdefault(str(spec["nodeName"]), set()).add((str(spec["attacher"]), handle))
    drivers = frozenset(d for limits in per_node.values() for d, _ in limits)
    return VolumeLimits(per_node, {n: frozenset(v) for n, v in attached.items()}, drivers)


NO_LIMITS = VolumeLimits()
"""No node limits CSI volumes (or the CSINodes are not known)."""


def attached_by(
    namespace: str, spec: object, volumes: Mapping[str, VolumeRule] | None, pod: str = ""
) -> Iterator[tuple[str, str]]:
    """The CSI volumes (driver, handle) a pod in `namespace` mounts (`VolumeRule.attach`).

    Its claims, and its generic ephemeral volumes' claims (named `pod-volume`), as
    `volumes` knows them; '' handles (not provisioned yet) are left out.
    """
    if not volumes:
        return
    names = list(claims_of(spec))
    raw = spec.get("volumes") if isinstance(spec, Mapping) and pod else None
    for v in raw if isinstance(raw, list) else []:
        if isinstance(v, Mapping) and v.get("ephemeral") and v.get("name"):
            names.append(f"{pod}-{v['name']}")
    for name in names:
        rule = volumes.get(f"{namespace}/{name}")
        if rule is not None and rule.attach is not None and rule.attach[1]:
            yield rule.attach


def claim_class(claim: Mapping[str, Any]) -> str:
    """The claim's StorageClass name ('' for none): the beta annotation, else the field.

    As kube-scheduler reads it (`storagehelpers.GetPersistentVolumeClaimClass`).
    """
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if _BETA_CLASS in annotations:
        return str(annotations[_BETA_CLASS] or "")
    return str((claim.get("spec") or {}).get("storageClassName") or "")


_BETA_CLASS = "volume.beta.kubernetes.io/storage-class"

NO_PROVISIONER = "kubernetes.io/no-provisioner"
"""The provisioner of a StorageClass whose volumes are made by hand (local volumes)."""


def _volume_class(volume: Mapping[str, Any]) -> str:
    """A PersistentVolume's StorageClass name ('' for none), the beta annotation first."""
    annotations = (volume.get("metadata") or {}).get("annotations") or {}
    if _BETA_CLASS in annotations:
        return str(annotations[_BETA_CLASS] or "")
    return str((volume.get("spec") or {}).get("storageClassName") or "")


def _may_bind(claim: Mapping[str, Any], volume: Mapping[str, Any]) -> bool:
    """Whether unbound `claim` could bind to `volume` (of its class), node aside.

    kube-scheduler's `FindMatchingVolume`: a volume being deleted will not do; one
    reserved for the claim (`claimRef`) will; one reserved for another will not; else
    its size covers the claim's request, its access modes include the claim's, its
    volume mode is the claim's, and the claim's `selector` selects its labels.
    """
    meta, spec = claim.get("metadata") or {}, claim.get("spec") or {}
    v_meta, v_spec = volume.get("metadata") or {}, volume.get("spec") or {}
    if v_meta.get("deletionTimestamp"):
        return False
    ref = v_spec.get("claimRef")
    if isinstance(ref, Mapping):
        return (ref.get("namespace"), ref.get("name")) == (meta.get("namespace"), meta.get("name"))
    try:
        requests = (spec.get("resources") or {}).get("requests") or {}
        asked = parse_quantity(requests.get("storage", 0))
        size = parse_quantity((v_spec.get("capacity") or {}).get("storage", 0))
    except QuantityError:
        return False
    modes = v_spec.get("accessModes") or []
    if size < asked or not set(spec.get("accessModes") or []) <= set(modes):
        return False
    if (spec.get("volumeMode") or "Filesystem") != (v_spec.get("volumeMode") or "Filesystem"):
        return False
    chosen = spec.get("selector")
    if chosen is None:
        return True
    wanted = _label_selector(chosen)
    have = v_meta.get("labels") or {}
    return wanted is not None and all(r.holds(have.get(r.key)) for r in wanted)


def _unbound(
    claim: Mapping[str, Any],
    name: str,
    classes: Mapping[str, Mapping[str, Any]],
    volumes: Iterable[Mapping[str, Any]],
    storage: _Storage,
) -> VolumeRule:
    """The rule of an unbound claim of StorageClass `name` ('' for none).

    kube-scheduler's VolumeBinding: a claim whose class binds at once (`Immediate`, the
    default, or no class: bound only to an existing volume) keeps its pods unscheduled
    until it is bound. Under `WaitForFirstConsumer` its pods go where one of the class's
    `volumes` it could bind to may be used (`_may_bind`; their node affinity), or
    where the class may provision one (`allowedTopologies`, ORed terms of `In`
    requirements; none: anywhere; and where its CSI driver has room, `_Storage`)
    unless it has no provisioner; nowhere else.
    """
    meta = claim.get("metadata") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    if not name:
        return VolumeRule(key, refusal=f"PersistentVolumeClaim {key} is not bound yet")
    kind = classes.get(name)
    if kind is None:
        return VolumeRule(
            key, refusal=f"StorageClass {name} of PersistentVolumeClaim {key} not found"
        )
    if kind.get("volumeBindingMode") != "WaitForFirstConsumer":
        return VolumeRule(
            key, refusal=f"PersistentVolumeClaim {key} is not bound yet (StorageClass {name})"
        )
    what = f"PersistentVolumeClaim {key}"
    rule = _first_consumer(claim, key, what, kind, volumes, storage=storage)
    return replace(rule, attach=_by_class(classes, name, key))


def _first_consumer(
    claim: Mapping[str, Any],
    key: str,
    what: str,
    kind: Mapping[str, Any],
    volumes: Iterable[Mapping[str, Any]],
    *,
    storage: _Storage | None = None,
) -> VolumeRule:
    """Where an unbound `claim` of `WaitForFirstConsumer` class `kind` lets its pods go.

    Where one of the class's `volumes` it could bind to may be used, or where the class
    may provision one (and its CSI driver reports room for the claim, `storage`);
    `what` names the claim in the refusal when neither is anywhere.
    """
    name = str((kind.get("metadata") or {}).get("name"))
    where = [_volume_terms(v) for v in volumes if _may_bind(claim, v)]
    provisioner = str(kind.get("provisioner") or "")
    room: tuple[tuple[_Requirement, ...], ...] | None = None
    if provisioner and provisioner != NO_PROVISIONER:
        room = storage.room(provisioner, name, claim) if storage is not None else None
        if room is None:
            where.append(_provisions(kind))
        elif room:
            where.append(_within(_provisions(kind), room))
    if not where:
        said = f"no PersistentVolume of StorageClass {name} is available for {what}"
        if room is not None:
            said += f", nor a CSIStorageCapacity of the class with room for {_asked(claim)}"
        return VolumeRule(key, refusal=said)
    if None in where:  # one may be used, or provisioned, anywhere
        return VolumeRule(key)
    volume = f"StorageClass {name}" + (" and its CSI driver's capacity" if room else "")
    return VolumeRule(key, volume, tuple(t for ts in where if ts for t in ts))


def _asked(claim: Mapping[str, Any]) -> str:
    """The storage a claim requests, as written."""
    return str(
        (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {})["storage"]
    )


def _within(
    allowed: tuple[_Term, ...] | None, room: tuple[tuple[_Requirement, ...], ...]
) -> tuple[_Term, ...] | None:
    """Nodes `allowed` (ORed terms; None: any) that one of `room`'s node selectors selects."""
    if any(not r for r in room):  # one selects every node
        return allowed
    if allowed is None:
        return tuple(_Term(r, ()) for r in room)
    return tuple(_Term(a.labels + r, a.fields) for a in allowed for r in room)


@dataclass(frozen=True)
class _Storage:
    """What CSI drivers report of their free storage (kube-scheduler's VolumeBinding).

    For a claim its pods' node must provision, of a StorageClass whose provisioner is a
    CSIDriver with `storageCapacity: true`, the node must be in the `nodeTopology` of
    a CSIStorageCapacity of that class whose `maximumVolumeSize` (else `capacity`)
    covers the claim's request (`hasEnoughCapacity`).
    """

    drivers: frozenset[str] = frozenset()
    """The CSIDrivers that report capacity (`spec.storageCapacity: true`)."""
    pools: tuple[tuple[str, int, tuple[_Requirement, ...]], ...] = ()
    """Per CSIStorageCapacity with a `nodeTopology`: its class, its limit in bytes and
    its node selector (empty: every node)."""

    @classmethod
    def of(
        cls, drivers: Iterable[Mapping[str, Any]], capacities: Iterable[Mapping[str, Any]]
    ) -> _Storage:
        """From the CSIDriver and CSIStorageCapacity objects (malformed ones state nothing)."""
        opted = frozenset(
            str((d.get("metadata") or {}).get("name"))
            for d in drivers
            if (d.get("spec") or {}).get("storageCapacity") is True
        )
        pools: list[tuple[str, int, tuple[_Requirement, ...]]] = []
        for c in capacities:
            limit = c.get("maximumVolumeSize") or c.get("capacity")
            selector = _label_selector(c.get("nodeTopology"))
            if limit is None or selector is None:  # no nodeTopology: unavailable
                continue
            try:
                pools.append(
                    (str(c.get("storageClassName")), ceil(parse_quantity(limit)), selector)
                )
            except QuantityError:
                continue
        return cls(opted, tuple(pools))

    def room(
        self, provisioner: str, name: str, claim: Mapping[str, Any]
    ) -> tuple[tuple[_Requirement, ...], ...] | None:
        """The node selectors of the pools of class `name` with room for `claim`.

        None when nothing is checked: its `provisioner` is no CSIDriver reporting
        capacity, or the claim requests no storage.
        """
        requests = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
        if provisioner not in self.drivers or "storage" not in requests:
            return None
        try:
            asked = ceil(parse_quantity(requests["storage"]))  # as Quantity.Value() rounds
        except QuantityError:
            return None
        return tuple(sel for kind, limit, sel in self.pools if kind == name and limit >= asked)


EPHEMERAL = "ephemeral:"
"""`volume_rules`' key prefix for a generic ephemeral volume's claim, by its StorageClass
(`EPHEMERAL` alone: one that names none, of the default class)."""

_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


def _ephemeral_rules(
    classes: Mapping[str, Mapping[str, Any]],
    by_class: Mapping[str, Sequence[Mapping[str, Any]]],
    storage: _Storage,
) -> dict[str, VolumeRule]:
    """Where a generic ephemeral volume's claim, made with each pod, lets the pod go.

    Per StorageClass: under `WaitForFirstConsumer` the claim its template makes is
    read as any unbound claim of the class (`_first_consumer`: where a volume of the
    class it could bind to may be used, or the class may provision one), when a
    template asks (`VolumeRule.made`, `Ephemeral`); a class that binds at once
    provisions before the pod is placed, wherever, so nothing is known. The key
    `EPHEMERAL` is the default class's (the newest marked default, as the
    DefaultStorageClass admission picks it; none: nothing is known).
    """
    out: dict[str, VolumeRule] = {}
    for name, kind in classes.items():
        key = EPHEMERAL + name
        if kind.get("volumeBindingMode") != "WaitForFirstConsumer":
            out[key] = VolumeRule(key)
            continue
        out[key] = VolumeRule(key, made=Ephemeral(key, kind, by_class.get(name, ()), storage))
    defaults = sorted(
        (str((k.get("metadata") or {}).get("creationTimestamp") or ""), name)
        for name, k in classes.items()
        if ((k.get("metadata") or {}).get("annotations") or {}).get(_DEFAULT_CLASS) == "true"
    )
    out[EPHEMERAL] = out[EPHEMERAL + defaults[-1][1]] if defaults else VolumeRule(EPHEMERAL)
    return out


class Ephemeral:
    """The `VolumeRule` of each claim template of one `WaitForFirstConsumer` StorageClass.

    A generic ephemeral volume's claim is made with its pod from the template, so it is
    read as that unbound claim (its size, access and volume modes, selector), each
    template once.
    """

    __slots__ = ("_key", "_kind", "_seen", "_storage", "_volumes")

    def __init__(
        self,
        key: str,
        kind: Mapping[str, Any],
        volumes: Sequence[Mapping[str, Any]],
        storage: _Storage,
    ) -> None:
        """For the class `kind` (its rule's `key`), its volumes and its driver's `storage`."""
        self._key, self._kind, self._volumes, self._storage = key, kind, volumes, storage
        self._seen: dict[str, VolumeRule] = {}

    def rule(self, template: str) -> VolumeRule:
        """Where the claim of `template` (its spec as JSON, `ephemeral_claims`) may be."""
        hit = self._seen.get(template)
        if hit is None:
            name = str((self._kind.get("metadata") or {}).get("name"))
            claim = {"metadata": {}, "spec": json.loads(template)}
            what = f"a generic ephemeral volume of StorageClass {name}"
            hit = _first_consumer(
                claim, self._key, what, self._kind, self._volumes, storage=self._storage
            )
            hit = self._seen[template] = replace(
                hit, attach=_by_class({name: self._kind}, name, "")
            )
        return hit


def ephemeral_claims(spec: object) -> tuple[tuple[str, str], ...]:
    """A pod spec's generic ephemeral volumes' claim templates, one per volume.

    Each volume makes a claim of its own (two of one template are two volumes: CSI
    attach limits count both). Each as its StorageClass ('' for a template that
    names none: the default class) and its spec as JSON; one that names the empty
    class (no class: bound only to a volume of none) is left out.
    """
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    out: list[tuple[str, str]] = []
    for v in volumes if isinstance(volumes, list) else []:
        ephemeral = v.get("ephemeral") if isinstance(v, Mapping) else None
        template = ephemeral.get("volumeClaimTemplate") if isinstance(ephemeral, Mapping) else None
        claim = template.get("spec") if isinstance(template, Mapping) else None
        if not isinstance(claim, Mapping):
            continue
        name = claim.get("storageClassName")
        if name == "":
            continue
        out.append((str(name or ""), json.dumps(claim, sort_keys=True, default=str)))
    return tuple(out)


def _volume_terms(volume: Mapping[str, Any]) -> tuple[_Term, ...] | None:
    """A PersistentVolume's required node affinity (ORed terms; None: any node)."""
    required = ((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required")
    return _terms({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}})


def _provisions(kind: Mapping[str, Any]) -> tuple[_Term, ...] | None:
    """Where a StorageClass may provision a volume (`allowedTopologies`; None: anywhere)."""
    allowed = kind.get("allowedTopologies")
    if not isinstance(allowed, list) or not allowed:
        return None
    raw = [
        {
            "matchExpressions": [
                {"key": e.get("key"), "operator": "In", "values": e.get("values")}
                for e in (t.get("matchLabelExpressions") or [])
                if isinstance(e, Mapping)
            ]
        }
        for t in allowed
        if isinstance(t, Mapping)
    ]
    return _terms(
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": raw}
            }
        }
    )


def namespace_labels(namespaces: Iterable[Mapping[str, Any]]) -> NamespaceLabels:
    """Each Namespace's labels by its name, from Namespace objects (what selectors read)."""
    out: dict[str, Mapping[str, str]] = {}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        out[str(meta.get("name"))] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return out


Place: TypeAlias = tuple[Mapping[str, str], Crowd, Iterable[PodTerm]]
"""A node as pod (anti-)affinity on a topology domain reads it: its labels, its pods and
their required pod anti-affinity terms."""


@dataclass(frozen=True)
class Domains:
    """The zones or racks a required pod (anti-)affinity keeps pods in or out of.

    Its terms on a topology key other than `kubernetes.io/hostname`, as kube-scheduler's
    InterPodAffinity reads them: a pod's affinity term on key K is met on a node whose
    K label has the value of a node running a pod that meets all its affinity terms (a
    node without the label meets none); its anti-affinity term, or an anti-affinity
    term of a running pod that selects it, rules out every node with the K value of
    that pod's node. Made by `domains` for one pod template and cluster.
    """

    only: tuple[tuple[str, frozenset[str]], ...] = ()
    """Per key of its affinity: the values where a pod meets it."""
    barred: frozenset[tuple[str, str]] = frozenset()
    """(key, value): the domains its anti-affinity, or a running pod's, rules out."""

    def refuses(self, labels: Mapping[str, str]) -> str | None:
        """Why a node with `labels` is no place for the pods, or None."""
        for key, values in self.only:
            if labels.get(key) not in values:
                return f"no pod in its {key} domain matches its workers' required pod affinity"
        for key, value in self.barred:
            if labels.get(key) == value:
                return f"pod anti-affinity rules out its {key} domain {value}"
        return None


def domains(rules: NodeRules, places: Iterable[Place], *, first: bool) -> Domains:
    """Where pods with `rules` may go by their terms on keys other than `kubernetes.io/hostname`.

    `places`: every node with pods (`Place`), GPUs or none; `first`: no pod meets their
    required pod affinity and they meet it themselves (no affinity holds them).
    """
    who = rules.who
    if who is None:
        return Domains()
    near = {t.key for t in rules.near if not t.on_node} if not first else set()
    anti = [t for t in rules.anti if not t.on_node]
    only: dict[str, set[str]] = {k: set() for k in near}
    barred: set[tuple[str, str]] = set()
    for labels, pods, repels in places:
        keys = [k for k in near if k in labels and labels[k] not in only[k]]
        ts = [t for t in anti if t.key in labels and (t.key, labels[t.key]) not in barred]
        if keys or ts:
            for p in pods:
                if keys and rules.meets_near(p):
                    for k in keys:
                        only[k].add(labels[k])
                    keys = []
                for t in ts:
                    if t.selects(p):
                        barred.add((t.key, labels[t.key]))
        for t in repels:
            if not t.on_node and t.key in labels and t.selects(who):
                barred.add((t.key, labels[t.key]))
    return Domains(tuple(sorted((k, frozenset(v)) for k, v in only.items())), frozenset(barred))


def labelled(template: Mapping[str, Any], label: str) -> dict[str, Any]:
    """A pod template whose pods run only on nodes that carry `label` (any value).

    A `label Exists` requirement is added to every term of its required node affinity
    (one new term when it states none; an empty term stays empty), as `avoiding` adds
    its exclusions: the plan and kube-scheduler then leave out nodes without it.
    """
    return _every_term(template, "matchExpressions", [{"key": label, "operator": "Exists"}])


def avoiding(template: Mapping[str, Any], nodes: Iterable[str]) -> dict[str, Any]:
    """A pod template whose pods may not run on `nodes` (required node affinity, by name).

    Each node becomes a `matchFields` `metadata.name NotIn` requirement (kube-scheduler
    takes one value per field requirement) added to every term of the template's
    required node affinity, or to one new term when it states none; an empty term
    stays empty (it matches nothing, and must go on matching nothing). So the plan
    leaves the nodes out (`NodeRules`), and kube-scheduler does too for the pods.
    """
    names = list(dict.fromkeys(nodes))
    if not names:
        return dict(template)
    exclude = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in names]
    return _every_term(template, "matchFields", exclude)


def _every_term(template: Mapping[str, Any], part: str, added: list[Any]) -> dict[str, Any]:
    """`template` with `added` requirements in `part` of every required node affinity term."""
    spec = dict(template.get("spec") or {})
    affinity = dict(spec.get("affinity") or {})
    node = dict(affinity.get("nodeAffinity") or {})
    required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    raw = required.get("nodeSelectorTerms")
    if not isinstance(raw, list) or not raw:
        terms: list[Any] = [{part: added}]
    else:
        terms = [
            {**t, part: [*(t.get(part) or []), *added]}
            if isinstance(t, Mapping) and (t.get("matchExpressions") or t.get("matchFields"))
            else t
            for t in raw
        ]
    required["nodeSelectorTerms"] = terms
    node["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node
    spec["affinity"] = affinity
    return {**template, "spec": spec}


def next_avoid(avoided: Iterable[str], stuck_on: Iterable[str], usable: Iterable[str]) -> list[str]:
    """The nodes a job avoids after its gang got stuck waiting on `stuck_on`.

    `avoided`: the nodes it avoided for that plan; `usable`: every node its
    workers may use by its own rules (its GPU types, template), free or not. The
    list never rules all of those out: when it would, the job starts over with
    only the nodes just seen to fail (and with none, when those are all the nodes
    it has: it waits for them, as before). At most `AVOID_MAX`, the latest kept.
    """
    stuck = list(dict.fromkeys(stuck_on))
    out = list(dict.fromkeys([*(n for n in avoided if n not in stuck), *stuck]))
    left = set(usable)
    if not left - set(out):
        out = stuck if left - set(stuck) else []
    return out[-AVOID_MAX:]


def _terms(affinity: object) -> tuple[_Term, ...] | None:
    if not isinstance(affinity, Mapping):
        return None
    node = affinity.get("nodeAffinity")
    if not isinstance(node, Mapping):
        return None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(required, Mapping):
        return None
    raw = required.get("nodeSelectorTerms")
    if not isinstance(raw, list) or not raw:
        return None
    terms = []
    for term in raw:
        if not isinstance(term, Mapping):
            return None
        labels = _requirements(term.get("matchExpressions"))
        fields = _requirements(term.get("matchFields"))
        if labels is None or fields is None:
            return None
        terms.append(_Term(labels, fields))
    return tuple(terms)


def _requirements(raw: object) -> tuple[_Requirement, ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        return None
    out = []
    for r in raw:
        if not isinstance(r, Mapping) or r.get("operator") not in _OPERATORS or not r.get("key"):
            return None
        values = r.get("values") or []
        if not isinstance(values, list):
            return None
        out.append(_Requirement(str(r["key"]), str(r["operator"]), tuple(map(str, values))))
    return tuple(out)


def _tolerations(raw: object) -> Iterable[_Toleration]:
    if not isinstance(raw, list):
        return
    for t in raw:
        if not isinstance(t, Mapping):
            continue
        operator = str(t.get("operator") or "Equal")
        yield _Toleration(
            str(t.get("key") or ""), operator, str(t.get("value") or ""), str(t.get("effect") or "")
        )


def job_rules(spec: TrainingJobSpec) -> NodeRules:
    """The rules of a TrainingJob's workers (its template; whole GPUs unless it shares).

    Remembered per template object: a pass asks this of each job several times, on
    copies of its spec that share the template (`model_copy`).
    """
    whole = spec.gpu.shared is None
    placement = spec.placement
    even = placement.strategy in _EVEN and (
        not placement.required or placement.topology is TopologyLevel.ANY
    )
    key = (id(spec.template), whole, even)
    hit = _RULES.get(key)
    if hit is not None and hit[0] is spec.template:  # held here: its id is not reused
        return hit[1]
    rules = NodeRules.of_template(spec.template, whole_gpus=whole)
    if even:
        rules = levelled(rules)
    if len(_RULES) >= _RULES_KEPT:
        _RULES.clear()
    _RULES[key] = (spec.template, rules)
    return rules


_EVEN = (PlacementStrategy.PACK, PlacementStrategy.SPREAD)
"""Strategies under which a gang's own spread is counted in levels (`levelled`)."""


def levelled(rules: NodeRules) -> NodeRules:
    """`rules` for a gang whose own topology spread is counted in levels (`Spread.levels`).

    Those of its topology spread constraints that select its workers. For a job placed
    Pack or Spread that requires no topology domain (`job_rules`): StrictSpread and
    StrictPack place one a node or all on one, and a job within one domain leaves the
    other domains' nodes as they are (the least count is the bound; `job_spec` places
    one of `maxSkew` 1 per node StrictSpread).
    """
    spread = tuple(replace(s, levels=True) if s.own else s for s in rules.spread)
    return rules if spread == rules.spread else replace(rules, spread=spread)


_RULES: dict[tuple[int, bool, bool], tuple[Mapping[str, Any], NodeRules]] = {}
_RULES_KEPT = 8192
