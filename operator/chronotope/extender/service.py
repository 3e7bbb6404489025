"""The extender's decisions, tied to the live ledger and a binder.

`ExtenderService` answers kube-scheduler's filter, prioritize and bind calls.
Filter and prioritize only read the ledger (microseconds, under one lock);
bind chooses the GPUs and holds them in the ledger *before* any API call
(assume), so a concurrent filter or bind already sees them taken. kube-scheduler
binds asynchronously: it starts the next pod's cycle while the previous pod's
bind is still on its way, so a filter first waits (up to `inflight_wait_s`)
until every other GPU pod that passed filter has reached bind and its GPUs are
assumed; otherwise two shares that belong on one GPU each open a GPU. It asks
the binder to write the assignment and the Binding, and forgets the
assumption if that fails. Node and pod events from the watch-fed cache keep
the ledger true; on restart the ledger is rebuilt from bound pods' assignment
annotations, which are the truth.

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
from chronotope.extender.ledger import MILLI, GpuRequest, Ledger, NoFit
from chronotope.extender.podreq import Plan, PodRequestError, planned, pod_gpu_request
from chronotope.sharing.assignment import (
    DEVICE_PLUGIN,
    BindRequest,
    GpuAssignment,
    gpu_uuid,
    new_handshake,
)
from chronotope.sharing.labels import (
    DONE_PHASES,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
)

__all__ = ["BindFn", "ExtenderService", "FilterOutcome", "PodFetchFn"]

log = logging.getLogger(__name__)

BindFn = Callable[[BindRequest], None]
"""Enact a binding; raises on failure."""
PodFetchFn = Callable[[str, str], Mapping[str, Any]]
"""(namespace, name) -> pod dict, used when bind arrives for a pod never filtered here."""


@dataclass(frozen=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    error: str = ""


@dataclass
class ExtenderService:
    bind_fn: BindFn
    fetch_pod: PodFetchFn
    ledger: Ledger = field(default_factory=Ledger)
    clock: Callable[[], float] = time.monotonic
    _lock: threading.RLock = field(default_factory=threading.RLock)
    gangs: GangBook = field(default_factory=GangBook)
    _requests: dict[str, GpuRequest | None] = field(default_factory=dict)
    _gang_of: dict[str, Gang] = field(default_factory=dict)
    _plans: dict[str, Plan] = field(default_factory=dict)
    _versions: dict[str, str] = field(default_factory=dict)
    """resourceVersion of the pod kube-scheduler sent to filter: the binder's precondition."""
    _scores: dict[str, dict[str, int]] = field(default_factory=dict)
    """Scores of the nodes the last filter passed, per pod: prioritize only looks them up."""
    inflight_wait_s: float = 1.0
    """How long a filter waits for other pods between filter and bind (then gives up on them)."""
    _inflight: dict[str, float] = field(default_factory=dict)
    """GPU pods that passed filter and whose bind has not assumed GPUs yet -> give-up time."""
    _settled: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._settled = threading.Condition(self._lock)

    # ------------------------------------------------------------------ filter
    def filter(self, pod: Mapping[str, Any], node_names: list[str]) -> FilterOutcome:
        key = _key(pod)
        try:
            req = pod_gpu_request(pod)
            gang = gang_of(pod)
            plan = planned(pod)
        except ValueError as exc:  # PodRequestError is a ValueError too
            reason = f"invalid GPU request: {exc}"
            return FilterOutcome([], {}, dict.fromkeys(node_names, reason))
        self._requests[key] = req
        version = (pod.get("metadata") or {}).get("resourceVersion")
        if version:
            self._versions[key] = str(version)
        if req is None:
            return FilterOutcome(list(node_names), {}, {})
        with self._lock:
            self._await_inflight(key)
        outcome = self._filter_gpu(key, req, gang, plan, node_names)
        with self._lock:
            # A gang member's GPUs are already held by its gang's reservation.
            reserved = gang is not None and self.gangs.allowed_nodes(gang, key) is not None
            if outcome.passed and not reserved:
                self._inflight[key] = time.monotonic() + self.inflight_wait_s
            else:  # a retry that no longer fits holds nobody up
                self._settle(key)
        return outcome

    def _await_inflight(self, key: str) -> None:
        """Wait (lock held; released while waiting) till no other pod is between filter and bind."""
        while True:
            now = time.monotonic()
            for other, give_up in list(self._inflight.items()):
                if other != key and give_up <= now:
                    del self._inflight[other]
                    log.info(
                        "no bind came for %s within %.1fs; filtering on",
                        other,
                        self.inflight_wait_s,
                    )
            waits = [t - now for k, t in self._inflight.items() if k != key]
            if not waits:
                return
            self._settled.wait(timeout=min(waits))

    def _settle(self, key: str) -> None:
        """The pod reached bind (its GPUs are assumed) or left: filters may go on (lock held)."""
        if self._inflight.pop(key, None) is not None:
            self._settled.notify_all()

    def _filter_gpu(
        self,
        key: str,
        req: GpuRequest,
        gang: Gang | None,
        plan: Plan | None,
        node_names: list[str],
    ) -> FilterOutcome:
        if plan is not None:
            self._plans[key] = plan
            return self._filter_planned(plan, req, node_names)
        if gang is not None:
            self._gang_of[key] = gang
            outcome = self._filter_gang(key, gang, req, node_names)
            if outcome is not None:
                return outcome
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        with self._lock:
            self.ledger.expire(self.clock())
            scores: dict[str, int] = {}
            for name in node_names:
                fit = self.ledger.fit(name, req)
                if isinstance(fit, NoFit):
                    (unresolvable if fit.unresolvable else failed)[name] = fit.message
                else:
                    passed.append(name)
                    scores[name] = self._score(name, req)
        if passed:
            self._scores[key] = scores
        else:
            log.info(
                "pod %s (%s) fits no node: %s",
                key,
                req.describe(),
                _summarise({**failed, **unresolvable}),
            )
        return FilterOutcome(passed, failed, unresolvable)

    def _filter_planned(self, plan: Plan, req: GpuRequest, node_names: list[str]) -> FilterOutcome:
        """A pod the batch planner placed goes to its planned node (and GPUs) or waits."""
        elsewhere = f"the batch plan puts this pod on {plan.node}"
        failed = {n: elsewhere for n in node_names if n != plan.node}
        if plan.node not in node_names:
            return FilterOutcome([], failed, {})
        with self._lock:
            self.ledger.expire(self.clock())
            fit = (
                self.ledger.fit(plan.node, req)
                if plan.gpus is None
                else self.ledger.fit_exact(plan.node, req, plan.gpus)
            )
        if isinstance(fit, NoFit):
            failed[plan.node] = f"planned node: {fit.message}"
            return FilterOutcome([], failed, {})
        return FilterOutcome([plan.node], failed, {})

    def _filter_gang(
        self, key: str, gang: Gang, req: GpuRequest, node_names: list[str]
    ) -> FilterOutcome | None:
        """Members pass only where the gang holds a slot; the first member reserves them all."""
        with self._lock:
            now = self.clock()
            self.ledger.expire(now)
            self.gangs.expire(self.ledger, now)
            allowed = self.gangs.allowed_nodes(gang, key)
            if allowed is None:
                why = self.gangs.reserve(self.ledger, gang, req, node_names, now)
                if why is not None:
                    log.info("pod %s waits: %s", key, why)
                    return FilterOutcome([], dict.fromkeys(node_names, why), {})
                allowed = self.gangs.allowed_nodes(gang, key)
                if allowed is None:
                    return None  # the rest of the gang is bound: a plain placement
        passed = [n for n in node_names if n in allowed]
        elsewhere = f"GPUs for gang {gang.key} are reserved on other nodes"
        return FilterOutcome(passed, {n: elsewhere for n in node_names if n not in allowed}, {})

    # ------------------------------------------------------------------ prioritize
    def prioritize(self, pod: Mapping[str, Any], node_names: list[str]) -> dict[str, int]:
        """Scores 0..10: pack GPU work onto nodes already in use, keep whole GPUs whole."""
        key = _key(pod)
        req = self._requests.get(key)
        if req is None:
            try:
                req = pod_gpu_request(pod)
            except PodRequestError:
                return dict.fromkeys(node_names, 0)
        if req is None:
            return dict.fromkeys(node_names, 0)
        scores = self._scores.pop(key, None)
        if scores is not None:  # scored while filtering, in the same scheduling cycle
            return {name: scores.get(name, 0) for name in node_names}
        with self._lock:
            return {
                name: 0 if isinstance(self.ledger.fit(name, req), NoFit) else self._score(name, req)
                for name in node_names
            }

    def _score(self, name: str, req: GpuRequest) -> int:
        """Score of a node that fits `req`."""
        node = self.ledger.nodes.get(name)
        if node is None or not node.gpus:
            return 0
        total = len(node.gpus)
        if req.is_share:
            # a partly used GPU that fits is best (no whole GPU gets broken);
            # the tighter the fit, the better
            best = min(
                (
                    g.free_milli
                    for g in node.gpus
                    if g.used_milli > 0 and g.free_milli >= req.share_milli
                ),
                default=None,
            )
            if best is not None:
                return 10 - min(4, (best - req.share_milli) * 4 // MILLI)
            return 5 - min(5, 5 * len(node.free_whole()) // total)
        free_after = len(node.free_whole()) - req.count
        return 10 - (10 * free_after) // total

    # ------------------------------------------------------------------ bind
    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod; returns '' on success or the error text for kube-scheduler."""
        key = f"{namespace}/{name}"
        self._scores.pop(key, None)  # prioritize is skipped when one node passes
        if key in self._requests:
            req = self._requests.pop(key)
        else:  # filtered by an earlier extender process, or never filtered
            try:
                req = pod_gpu_request(self.fetch_pod(namespace, name))
            except Exception as exc:
                return f"cannot read pod {key}: {exc}"
        gang = self._gang_of.get(key)
        assignment = None
        with self._lock:
            self._settle(key)  # below, under the same lock hold, its GPUs are assumed
            if req is not None:
                if gang is not None and not self.gangs.claim(self.ledger, gang, key, node):
                    return f"gang {gang.key} holds no slot on {node}"
                plan = self._plans.get(key)
                gpus = plan.gpus if plan is not None and plan.node == node else None
                choice = self.ledger.assume(key, node, req, self.clock(), gpus)
        if req is not None:
            if isinstance(choice, NoFit):
                return f"node {node} can no longer take {key}: {choice.message}"
            assignment = _assignment(node, choice, req)
        try:
            self.bind_fn(
                BindRequest(namespace, name, uid, node, assignment, self._versions.pop(key, None))
            )
        except Exception as exc:
            with self._lock:
                if assignment is not None:  # only this try's GPUs, not a newer try's
                    self.ledger.forget(key, only=(node, assignment.gpu_indices))
                if gang is not None and req is not None:
                    self.gangs.unclaim(self.ledger, gang, key, req, self.clock())
            log.warning("bind %s -> %s failed: %s", key, node, exc)
            return str(exc)
        with self._lock:
            self.ledger.confirm(key)
            if gang is not None:
                self.gangs.bound(gang, key)
        log.info("bound %s to %s GPUs %s", key, node, assignment.gpu_indices if assignment else ())
        return ""

    def runs_plugin(self, node: str) -> bool:
        with self._lock:
            entry = self.ledger.nodes.get(node)
            return entry is not None and entry.device_plugin

    # ------------------------------------------------------------------ cache feed
    def on_node(self, event: str, node: Mapping[str, Any]) -> None:
        meta = node.get("metadata", {})
        with self._lock:
            if event == "DELETED":
                self.ledger.remove_node(meta["name"])
                return
            labels = meta.get("labels") or {}
            capacity = (node.get("status") or {}).get("capacity") or {}
            self.ledger.upsert_node(
                meta["name"],
                labels.get(GPU_PRODUCT_LABEL, ""),
                int(capacity.get(GPU_RESOURCE, 0) or 0),
                int(labels.get(GPU_MEMORY_LABEL, 0) or 0),
                unschedulable=bool((node.get("spec") or {}).get("unschedulable", False)),
                device_plugin=DEVICE_PLUGIN in (meta.get("annotations") or {}),
            )

    def sync_nodes(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            present = {n["metadata"]["name"] for n in nodes}
            for name in list(self.ledger.nodes):
                if name not in present:
                    self.ledger.remove_node(name)
            for node in nodes:
                self.on_node("ADDED", node)

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        key = _key(pod)
        status = pod.get("status") or {}
        spec = pod.get("spec") or {}
        with self._lock:
            if event == "DELETED" or status.get("phase") in DONE_PHASES:
                self._settle(key)
                self.ledger.forget(key)
                self._requests.pop(key, None)
                self._plans.pop(key, None)
                self._scores.pop(key, None)
                gang = self._gang_of.pop(key, None)
                if gang is not None:
                    self.gangs.forget_member(self.ledger, gang, key)
                return
            node = spec.get("nodeName")
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if not node:
                return
            try:
                assignment = GpuAssignment.from_annotations(annotations)
            except ValueError:
                return  # bound without a GPU assignment: not ours to account
            milli = MILLI if assignment.compute_percent is None else assignment.compute_percent * 10
            self.ledger.record_bound(
                key, node, assignment.gpu_indices, milli, assignment.memory_mib or 0
            )
            try:
                gang = gang_of(pod)
            except ValueError:
                gang = None
            if gang is not None:  # a restarted extender still knows who is bound
                self._gang_of[key] = gang
                self.gangs.bound(gang, key)

    def sync_pods(self, pods: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            present = {_key(p) for p in pods}
            for key, holding in list(self.ledger.holdings.items()):
                if holding.bound and key not in present and not key.startswith("gang:"):
                    self.ledger.forget(key)
            for pod in pods:
                self.on_pod("ADDED", pod)


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def _assignment(node: str, gpus: tuple[int, ...], req: GpuRequest) -> GpuAssignment:
    return GpuAssignment(
        node=node,
        gpu_indices=gpus,
        gpu_uuids=tuple(gpu_uuid(node, i) for i in gpus),
        memory_mib=req.memory_mib if req.is_share else None,
        compute_percent=req.share_milli * 100 // MILLI if req.is_share else None,
        handshake=new_handshake(),
    )


def _summarise(reasons: Mapping[str, str]) -> str:
    counts: dict[str, int] = {}
    for message in reasons.values():
        counts[message] = counts.get(message, 0) + 1
    return "; ".join(f"{n} node(s): {m}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1]))
