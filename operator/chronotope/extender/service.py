"""The extender's decisions, on the one cluster model, with the policy the simulator measures.

`ExtenderService` answers kube-scheduler's filter, prioritize and bind calls.
Filter is the whole decision: the online policy (`solver.policies`, default
`chronotope`) chooses a node and GPUs among the nodes kube-scheduler sends,
on the cluster cache (`solver.cache.ClusterCache`, the arrays the simulator
uses), and the choice is assumed at once, as kube-scheduler's Reserve does.
Filter then passes only the chosen node, so kube-scheduler's tie-break among
equal scores never overrides the policy, and the next pod's filter already
sees this pod's GPUs taken. Bind writes exactly the assumed GPUs; it asks the
binder to write the assignment and the Binding, and forgets the assumption if
that fails.

Gang members pass only where their gang's reservation holds a slot; a pod
the batch planner placed goes to its planned node and GPUs, or, when they no
longer fit, wherever the policy puts it (and says so). Shares are placed
under the co-location rules (`solver.colocation`, held by the cache): a node
they refuse fails with their reason, and a BestEffort share beside a High one
is bound with the compute percent the rules allow, which the assignment
carries to the device plugin with the share's priority and profile. A share
whose profile is missing or unreadable is placed as unknown, with a warning
event. Node and pod events
from the watch-fed cache keep the model true; on restart it is rebuilt from
bound pods, whose assignment annotations are the truth.

No Kubernetes client here: the binder is a narrow seam (`BindFn`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chronotope.extender.gang import Gang, GangBook, gang_of
from chronotope.sharing.assignment import (
    BindRequest,
    GpuAssignment,
    gpu_uuid,
    new_handshake,
    share_class,
)
from chronotope.sharing.labels import DONE_PHASES
from chronotope.solver.cache import ClusterCache, Holding
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.model import MILLI, Placement, PodRequest, Reason
from chronotope.solver.policies import Policy
from chronotope.workloads.cluster_feed import hold_planned, node_info, pod_holding
from chronotope.workloads.podreq import (
    PlannedPlacement,
    planned,
    planned_gang,
    pod_key,
    pod_request,
    profile_warning,
)

__all__ = ["BindFn", "EventFn", "ExtenderService", "FilterOutcome", "PodFetchFn"]

log = logging.getLogger(__name__)

_PLAN = "plan:"
"""Cache key prefix of an unfiltered pod's planned GPUs (`ExtenderService._hold_plan`)."""

BindFn = Callable[[BindRequest], None]
"""Enact a binding; raises on failure."""
PodFetchFn = Callable[[str, str], Mapping[str, Any]]
"""(namespace, name) -> pod dict, used when bind arrives for a pod never filtered here."""
EventFn = Callable[[str, str, str], None]
"""(pod key "namespace/name", reason, message): post an Event; called under the lock, must
not block (the CLI hands it to a worker thread)."""


@dataclass(frozen=True)
class FilterOutcome:
    """One filter answer: the nodes that pass, and why each other node fails.

    `failed` may clear (GPUs busy now), `unresolvable` will not; `error`, when set,
    fails the whole call.
    """

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    error: str = ""


def _no_event(key: str, reason: str, message: str) -> None:
    del key, reason, message


@dataclass
class ExtenderService:
    """Answers kube-scheduler's filter, prioritize and bind calls; see the module docstring."""

    bind_fn: BindFn
    fetch_pod: PodFetchFn
    cache: ClusterCache = field(default_factory=ClusterCache)
    policy: Policy = field(default_factory=Chronotope)
    clock: Callable[[], float] = time.monotonic
    event_fn: EventFn = _no_event
    _lock: threading.RLock = field(default_factory=threading.RLock)
    gangs: GangBook = field(default_factory=GangBook)
    _requests: dict[str, PodRequest] = field(default_factory=dict)
    _gang_of: dict[str, Gang] = field(default_factory=dict)
    _plans: dict[str, PlannedPlacement] = field(default_factory=dict)
    _chosen: dict[str, str] = field(default_factory=dict)
    """Node the policy chose for a pod at its last filter (prioritize scores it alone)."""
    _said: dict[str, str] = field(default_factory=dict)
    """The last "fits no node" line logged per pod: the same line is not logged again."""
    _warned: set[str] = field(default_factory=set)
    """Pods whose profile fallback was already reported (once per pod)."""
    _members: dict[str, set[str]] = field(default_factory=dict)
    """Gang key -> the pods known here of that gang (`_gang_of`, by gang)."""
    _plan_held: dict[str, str] = field(default_factory=dict)
    """Unfiltered pods whose plan holds their planned GPUs: pod key -> gang key ('' for none)."""
    _plan_gangs: dict[str, set[str]] = field(default_factory=dict)
    """The same by gang: gang key -> its members' pod keys."""

    # ------------------------------------------------------------------ filter
    def filter(self, pod: Mapping[str, Any], node_names: list[str]) -> FilterOutcome:
        """Pass the pod's chosen (and assumed) node, or its gang's slots; say why others fail.

        A pod the batch planner placed tries its planned node and GPUs first; a gang
        member passes only where its gang holds a slot (the first member reserves them
        all); otherwise the policy chooses among `node_names`. An invalid pod request
        fails every node as unresolvable.
        """
        key = pod_key(pod)
        try:
            req = pod_request(pod)
            gang = gang_of(pod)
            plan = planned(pod)
            gang_plan = planned_gang(pod) if gang is not None and gang.size > 1 else None
        except ValueError as exc:  # PodRequestError is a ValueError too
            reason = f"invalid pod request: {exc}"
            return FilterOutcome([], {}, dict.fromkeys(node_names, reason))
        self._requests[key] = req
        with self._lock:
            self._warn_profile(key, pod)
            now = self.clock()
            self.cache.expire(now)
            self.gangs.expire(self.cache, now)
            self.cache.observe(key, req)
            self._release_plans(key, gang)
            if gang is not None:
                self._join(key, gang)
            if plan is not None:
                self._plans[key] = plan
            if plan is not None and (gang is None or gang.size == 1):
                outcome = self._filter_planned(key, plan, req, node_names, now)
                if outcome is not None:
                    return outcome
            if gang is not None:
                outcome = self._filter_gang(key, gang, req, node_names, now, gang_plan=gang_plan)
                if outcome is not None:
                    return outcome
            placed = self.cache.place(key, req, node_names, self.policy, now)
        return self._outcome(key, req, placed)

    def _join(self, key: str, gang: Gang) -> None:
        self._gang_of[key] = gang
        self._members.setdefault(gang.key, set()).add(key)

    def _hold_plan(self, key: str, pod: Mapping[str, Any]) -> None:
        """An unbound pod not yet filtered here: its plan holds its planned GPUs (lock held).

        The operator's pass counts those GPUs taken (`workloads.capacity`) from the pod's
        creation, so another pod's placement here (a fallback, a gang the rule places, a
        pod without a plan) must not take them before the pod comes to be filtered.
        """
        if key in self._requests or key in self._plan_held:
            return  # filtered: its own assumption or its gang's slots hold what it takes
        if not hold_planned(self.cache, _PLAN + key, pod, self.clock()):
            return
        self.cache.confirm(_PLAN + key)  # held until the pod is filtered, bound or deleted
        try:
            gang = gang_of(pod)
        except ValueError:
            gang = None
        self._plan_held[key] = "" if gang is None else gang.key
        if gang is not None:
            self._plan_gangs.setdefault(gang.key, set()).add(key)

    def _release_plans(self, key: str, gang: Gang | None) -> None:
        """The pod is filtered: its plan's hold, and those of its gang's members, end (lock held).

        The first member's filter reserves the whole gang on its plan (or places it by
        the gang rule), so no member's plan holds GPUs on its own any more.
        """
        self._drop_plan(key)
        if gang is not None:
            for other in list(self._plan_gangs.get(gang.key, ())):
                self._drop_plan(other)

    def _drop_plan(self, key: str) -> None:
        gang_key = self._plan_held.pop(key, None)
        if gang_key is None:
            return
        self.cache.forget(_PLAN + key)
        members = self._plan_gangs.get(gang_key)
        if members is not None:
            members.discard(key)
            if not members:
                del self._plan_gangs[gang_key]

    def _warn_profile(self, key: str, pod: Mapping[str, Any]) -> None:
        """Log and post, once per pod, that its share's profile fell back to unknown."""
        if key in self._warned:
            return
        warning = profile_warning(pod)
        if warning is None:
            return
        self._warned.add(key)
        log.warning("pod %s: %s", key, warning)
        self.event_fn(key, "GpuProfileUnknown", warning)

    def _outcome(
        self, key: str, req: PodRequest, placed: Placement | dict[str, Reason]
    ) -> FilterOutcome:
        if isinstance(placed, Placement):
            self._chosen[key] = placed.node
            self._said.pop(key, None)
            return FilterOutcome([placed.node], {}, {})
        self._chosen.pop(key, None)
        failed = {n: f.message for n, f in placed.items() if not f.unresolvable}
        unresolvable = {n: f.message for n, f in placed.items() if f.unresolvable}
        line = f"pod {key} ({req.describe_gpus()}) fits no node: {_summarise(placed)}"
        if self._said.get(key) != line:  # kube-scheduler retries the pod: say it once
            self._said[key] = line
            log.info("%s", line)
        return FilterOutcome([], failed, unresolvable)

    def _filter_planned(
        self, key: str, plan: PlannedPlacement, req: PodRequest, node_names: list[str], now: float
    ) -> FilterOutcome | None:
        """A pod the batch planner placed goes to its planned node and GPUs, if they still fit.

        If they do not, returns None and the policy places the pod (with an event saying so).
        """
        if plan.node not in node_names:
            why = f"kube-scheduler ruled out the planned node {plan.node}"
        else:
            choice = self.cache.assume(key, plan.node, req, now, plan.gpus)
            if not isinstance(choice, Reason):
                self._chosen[key] = plan.node
                return FilterOutcome([plan.node], {}, {})
            why = f"planned node {plan.node} no longer fits: {choice.message}"
        self._plans.pop(key, None)
        message = f"{why}; placed by the {self.policy.name} policy instead"
        log.info("pod %s: %s", key, message)
        self.event_fn(key, "PlanFallback", message)
        return None

    def _filter_gang(
        self,
        key: str,
        gang: Gang,
        req: PodRequest,
        node_names: list[str],
        now: float,
        *,
        gang_plan: Sequence[PlannedPlacement] | None,
    ) -> FilterOutcome | None:
        """Members pass only where the gang holds a slot; the first member reserves them all.

        With the whole gang's plan on the pod, the slots are the planned nodes and
        GPUs; if they no longer fit, the gang rule places the gang (and an event says
        so). A member with a plan passes on its own planned node while a slot is free there.
        """
        allowed = self.gangs.allowed_nodes(gang, key)
        if allowed is None and gang_plan is not None:
            why = self.gangs.reserve_planned(self.cache, gang, req, node_names, now, plan=gang_plan)
            if why is not None:
                message = f"{why}; gang {gang.key} placed by the gang rule instead"
                log.info("pod %s: %s", key, message)
                self.event_fn(key, "PlanFallback", message)
            allowed = self.gangs.allowed_nodes(gang, key)
        if allowed is None:
            why = self.gangs.reserve(self.cache, gang, req, node_names, now)
            if why is not None:
                log.info("pod %s waits: %s", key, why)
                return FilterOutcome([], dict.fromkeys(node_names, why), {})
            allowed = self.gangs.allowed_nodes(gang, key)
            if allowed is None:
                return None  # the rest of the gang is bound: a plain placement
        self._chosen.pop(key, None)
        plan = self._plans.get(key)
        if plan is not None and plan.node in allowed:
            allowed = {plan.node}
        passed = [n for n in node_names if n in allowed]
        elsewhere = f"GPUs for gang {gang.key} are reserved on other nodes"
        return FilterOutcome(passed, {n: elsewhere for n in node_names if n not in allowed}, {})

    # ------------------------------------------------------------------ prioritize
    def prioritize(self, pod: Mapping[str, Any], node_names: list[str]) -> dict[str, int]:
        """10 for the node the policy chose at filter (gang members: their reserved slots)."""
        key = pod_key(pod)
        chosen = self._chosen.get(key)
        if chosen is not None:
            return {n: 10 if n == chosen else 0 for n in node_names}
        gang = self._gang_of.get(key)
        with self._lock:
            allowed = None if gang is None else self.gangs.allowed_nodes(gang, key)
        if allowed is not None:
            return {n: 10 if n in allowed else 0 for n in node_names}
        return dict.fromkeys(node_names, 0)

    # ------------------------------------------------------------------ bind
    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod; returns '' on success or the error text for kube-scheduler."""
        key = f"{namespace}/{name}"
        self._chosen.pop(key, None)
        if key in self._requests:
            req = self._requests.pop(key)
        else:  # filtered by an earlier extender process, or never filtered
            try:
                req = pod_request(self.fetch_pod(namespace, name))
            except Exception as exc:
                return f"cannot read pod {key}: {exc}"
        gang = self._gang_of.get(key)
        with self._lock:
            gpus = self._hold_for_bind(key, req, gang, node)
        if isinstance(gpus, str):
            return gpus
        holding = self.cache.holdings.get(key)
        assignment = _assignment(node, gpus, req, holding) if req.num_gpus else None
        try:
            self.bind_fn(BindRequest(namespace, name, uid, node, assignment))
        except Exception as exc:
            with self._lock:  # only this try's holding, not a newer try's
                self.cache.forget(key, only=(node, gpus))
                if gang is not None:
                    self.gangs.unclaim(self.cache, gang, key, req, self.clock())
            log.warning("bind %s -> %s failed: %s", key, node, exc)
            return str(exc)
        with self._lock:
            self.cache.confirm(key)
            if gang is not None:
                self.gangs.bound(gang, key)
        log.info("bound %s to %s GPUs %s", key, node, assignment.gpu_indices if assignment else ())
        return ""

    def _hold_for_bind(
        self, key: str, req: PodRequest, gang: Gang | None, node: str
    ) -> tuple[int, ...] | str:
        """The GPUs this bind writes (lock held): the filter's assumption, else chosen now."""
        now = self.clock()
        held = self.cache.holdings.get(key)
        if held is not None and not held.bound and not held.binding and held.node == node:
            self.cache.binding(key)
            return held.gpu_indices
        plan = self._plans.get(key)
        mine = plan.gpus if plan is not None and plan.node == node else None
        if gang is not None and not self.gangs.claim(self.cache, gang, key, node, mine):
            return f"gang {gang.key} holds no slot on {node}"
        if plan is not None and plan.node == node and plan.gpus is not None:
            choice: tuple[int, ...] | Reason = self.cache.assume(key, node, req, now, plan.gpus)
        else:  # no assumption (a gang member, a restart since filter): the policy's GPUs there
            placed = self.cache.place(key, req, [node], self.policy, now)
            choice = placed.gpu_indices if isinstance(placed, Placement) else placed[node]
        if isinstance(choice, Reason):
            return f"node {node} can no longer take {key}: {choice.message}"
        self.cache.binding(key)
        return choice

    def runs_plugin(self, node: str) -> bool:
        """Whether the cache knows `node` to run Chronotope's device plugin (the binder asks)."""
        with self._lock:
            entry = self.cache.nodes.get(node)
            return entry is not None and entry.device_plugin

    # ------------------------------------------------------------------ cache feed
    def on_node(self, event: str, node: Mapping[str, Any]) -> None:
        """Apply one node watch event: DELETED removes the node, any other adds or updates it."""
        meta = node.get("metadata", {})
        with self._lock:
            if event == "DELETED":
                self.cache.remove_node(meta["name"])
                return
            self.cache.upsert_node(node_info(node))

    def sync_nodes(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        """Match a full node list: drop nodes not in it, add or update the rest."""
        with self._lock:
            present = {n["metadata"]["name"] for n in nodes}
            for name in list(self.cache.nodes):
                if name not in present:
                    self.cache.remove_node(name)
            for node in nodes:
                self.on_node("ADDED", node)

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        """Apply one pod watch event.

        A deleted or finished pod is forgotten: its holding, gang membership and
        what its filter left; once no member of its gang is left, so is the gang's
        reservation. A pod on a node is recorded as bound there, and as a
        bound member of its gang; a pod not yet on a node holds its plan's GPUs
        until it is filtered (`_hold_plan`).
        """
        key = pod_key(pod)
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        with self._lock:
            if event == "DELETED" or status.get("phase") in DONE_PHASES:
                self._drop_plan(key)
                self.cache.forget(key)
                self._requests.pop(key, None)
                self._said.pop(key, None)
                self._warned.discard(key)
                self._plans.pop(key, None)
                self._chosen.pop(key, None)
                gang = self._gang_of.pop(key, None)
                if gang is not None:
                    self.gangs.forget_member(self.cache, gang, key)
                    members = self._members.get(gang.key, set())
                    members.discard(key)
                    if not members:
                        # the last member known here left (a re-planned gang's pods are
                        # deleted): its unclaimed slots would hold GPUs until they expire
                        self._members.pop(gang.key, None)
                        self.gangs.drop(self.cache, gang.key)
                return
            node = spec.get("nodeName")
            if not node:
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    self._drop_plan(key)
                else:
                    self._hold_plan(key, pod)
                return
            self._drop_plan(key)
            held = self.cache.holdings.get(key)
            if held is not None and held.bound and held.node == node:
                return  # status updates of a pod already counted
            self.cache.record_bound(key, pod_holding(self.cache, key, pod, node))
            try:
                gang = gang_of(pod)
            except ValueError:
                gang = None
            if gang is not None:  # a restarted extender still knows who is bound
                self._join(key, gang)
                self.gangs.bound(gang, key)

    def sync_pods(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """Match a full pod list: forget bound pods not in it, then apply each as ADDED.

        Assumptions and gang slots are not pods and are kept; plans are held afresh.
        """
        with self._lock:
            for key in list(self._plan_held):
                self._drop_plan(key)
            present = {pod_key(p) for p in pods}
            for key, holding in list(self.cache.holdings.items()):
                if holding.bound and key not in present and not key.startswith("gang:"):
                    self.cache.forget(key)
            for pod in pods:
                self.on_pod("ADDED", pod)


def _assignment(
    node: str, gpus: tuple[int, ...], req: PodRequest, holding: Holding | None
) -> GpuAssignment:
    """What the binder writes: the GPUs and, for a share, what the cache holds for it.

    The held share is the request's, or less where the co-location rules bound
    a BestEffort share's compute; a share that states a priority carries it and
    its profile.
    """
    if not req.is_share:
        return GpuAssignment(
            node, gpus, tuple(gpu_uuid(node, i) for i in gpus), None, None, new_handshake()
        )
    milli = req.gpu_milli if holding is None else holding.gpu_milli
    priority = profile = None
    if req.gpu_priority is not None:
        priority, profile = share_class(req.gpu_priority, req.gpu_profile)
    return GpuAssignment(
        node=node,
        gpu_indices=gpus,
        gpu_uuids=tuple(gpu_uuid(node, i) for i in gpus),
        memory_mib=req.gpu_memory_mib,
        compute_percent=milli * 100 // MILLI,
        handshake=new_handshake(),
        priority=priority,
        profile=profile,
    )


def _summarise(reasons: Mapping[str, Reason]) -> str:
    counts: dict[str, int] = {}
    for why in reasons.values():
        counts[why.message] = counts.get(why.message, 0) + 1
    return "; ".join(f"{n} node(s): {m}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1]))
