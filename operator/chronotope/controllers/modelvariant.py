"""ModelVariant reconciliation, in the InferencePipeline controller's shape.

`reconcile` runs for one ModelVariant, but a variant is served by its serving
group: the base's replicas shared by the group's variants. So the pass groups
the namespace's variants (`workloads.variants`), and the group's pass (plan,
placement ConfigMap, Service, Deployment: `workloads.serving_group`) runs
only when the group's inputs changed (its variants' specs and generations,
the GPU types and counts of the nodes, the GPUs free now for it, the live
rates, the group's pods, its queue's room) or its last apply is older than
`refresh_s`. It is planned first on a GPU type whose free GPUs hold it within
what its queue admits now (its own pods' counted free:
`variants.free_serving_gpus`, the one cluster model;
`training_quota.serving_room`), so it does not wait for GPUs other work holds,
or for quota, while another type's idle. `GroupMemo` keeps the last result per
group, so the other variants' passes read their status from it. The
variant then gets its status and its events: one per distinct waiting
reason, one when it starts serving, one per placement change. A group's
GPUs hold its namespace's `default` LocalQueue's quota: a new group is built,
and a running group takes a new plan, only when its Deployment fits that
queue now or fits its nominal quota once the TrainingJobs that borrowed it give
it back (`ReclaimingQuota` event); otherwise a new group waits and a running
one keeps its last plan (`QuotaExceeded` event).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, Protocol, TypeAlias

from chronotope.controllers.reads import Reads
from chronotope.controllers.trainingjob import Outcome
from chronotope.solver.model import Reason
from chronotope.solver.online import PlacementRules
from chronotope.workloads.capacity import FreeGpus
from chronotope.workloads.placement import parse_doc
from chronotope.workloads.quota import StopCause
from chronotope.workloads.serving_group import (
    GroupResult,
    config_map_name,
    failed_status,
    serve_group,
)
from chronotope.workloads.training_quota import (
    DEFAULT_LOCAL_QUEUE,
    QuotaView,
    ServingRoom,
    reclaim_words,
    serving_admission,
    serving_demand,
    serving_holders,
    serving_reclaim,
    serving_room,
)
from chronotope.workloads.variants import (
    ServingGroup,
    free_serving_gpus,
    free_summary,
    gpu_pool,
    group_variants,
    replica_request,
)

__all__ = ["GroupMemo", "VariantOps", "reconcile"]

Key = tuple[str, str]
"""(namespace, serving group)"""
_Now: TypeAlias = tuple[dict[str, FreeGpus], ServingRoom | None]
"""The GPUs free now for a group, and its queue's room (`GroupMemo._now`)."""


class VariantOps(Reads, Protocol):
    """What `reconcile` reads from and writes to the cluster."""

    def variants(self, namespace: str) -> list[dict[str, Any]]:
        """The ModelVariants of a namespace."""
        ...

    def pods(self, namespace: str, group: str) -> list[dict[str, Any]]:
        """The serving group's pods."""
        ...

    def apply(self, objects: Sequence[dict[str, Any]]) -> None:
        """Create or update the objects, in order."""
        ...


@dataclass
class _Entry:
    fingerprint: str
    at: datetime
    result: GroupResult
    pending: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)


class GroupMemo:
    """The last pass of every serving group, shared by its variants' passes (thread-safe).

    `on_pass(namespace, result)` is called after each group pass (the
    operator's metrics). `passes` counts them.
    """

    def __init__(
        self,
        refresh_s: float = 30.0,
        rate_ttl_s: float = 5.0,
        on_pass: Callable[[str, GroupResult], None] | None = None,
        placement: PlacementRules | None = None,
    ) -> None:
        """Re-apply a group at least every `refresh_s`; reuse a live rate for `rate_ttl_s`.

        The GPUs free now for a group, and its queue's room, are read once per
        `rate_ttl_s` too.

        `placement`: how the extender places pods (how many of a group's GPU shares it
        puts on one GPU; `variants.gpu_pool`).
        """
        self.placement = placement or PlacementRules()
        self.refresh_s = refresh_s
        self.rate_ttl_s = rate_ttl_s
        self.on_pass = on_pass
        self.passes = 0
        self._lock = threading.Lock()
        self._group_locks: dict[Key, threading.Lock] = {}
        self._entries: dict[Key, _Entry] = {}
        self._rates: dict[tuple[str, ...], tuple[datetime, float | str]] = {}
        self._seen_now: dict[Key, tuple[datetime, frozenset[str], _Now]] = {}

    def _group_lock(self, key: Key) -> threading.Lock:
        with self._lock:
            return self._group_locks.setdefault(key, threading.Lock())

    def _rate(
        self, ops: VariantOps, key: tuple[str, ...], address: str | None, now: datetime
    ) -> float | str:
        with self._lock:
            hit = self._rates.get(key)
        if hit is not None and (now - hit[0]).total_seconds() < self.rate_ttl_s:
            return hit[1]
        value = ops.query_rate(address, key[-1])
        with self._lock:
            self._rates[key] = (now, value)
        return value

    def rates(
        self, ops: VariantOps, namespace: str, group: ServingGroup, now: datetime
    ) -> dict[str, float | str]:
        """Live rates of the group's variants that read theirs from Prometheus."""
        out: dict[str, float | str] = {}
        for m in group.members:
            source = m.spec.traffic.prometheus
            if source is not None:
                key = (namespace, m.name, source.address or "", source.query)
                out[m.name] = self._rate(ops, key, source.address, now)
        return out

    def _now(
        self,
        ops: VariantOps,
        key: Key,
        nodes: Sequence[Mapping[str, Any]],
        pods: Sequence[Mapping[str, Any]],
        now: datetime,
    ) -> tuple[dict[str, FreeGpus], ServingRoom | None]:
        """The GPUs free now for the group `key` (its `pods`' counted free), and its queue's room.

        The room: what the namespace's `default` LocalQueue's Queue could ever hold,
        and admits the group now (`training_quota.serving_room`; None: quotas off).
        Read once per `rate_ttl_s`: the cluster model costs tens of ms on a large
        cluster, and every variant of the group asks each timer round.
        """
        own = frozenset(f"{key[0]}/{(p.get('metadata') or {}).get('name')}" for p in pods)
        with self._lock:
            hit = self._seen_now.get(key)
        if hit is not None and hit[1] == own and (now - hit[0]).total_seconds() < self.rate_ttl_s:
            return hit[2]
        every = ops.pods_matching()
        free = free_serving_gpus(nodes, every, own, self.placement)
        view = QuotaView.parse(ops.queues(), ops.local_queues(), ops.namespaces())
        room = None
        if view.on:
            holders = serving_holders(view, ops.training_jobs(), every, _holder_key(*key))
            room = serving_room(view, key[0], DEFAULT_LOCAL_QUEUE, now=holders)
        with self._lock:
            self._seen_now[key] = (now, own, (free, room))
        return free, room

    def serve(
        self, ops: VariantOps, namespace: str, group: ServingGroup, variant: str, now: datetime
    ) -> tuple[GroupResult, list[tuple[str, str, str]]]:
        """The group's current result (a new pass if its inputs changed), and `variant`'s events."""
        key = (namespace, group.name)
        with self._group_lock(key):
            rates = self.rates(ops, namespace, group, now)
            nodes, pods = ops.nodes(), ops.pods(namespace, group.name)
            free, room = self._now(ops, key, nodes, pods, now)
            fp = fingerprint(group, nodes, pods, rates, self.placement, free=free, room=room)
            with self._lock:
                entry = self._entries.get(key)
            fresh = entry is not None and (now - entry.at).total_seconds() < self.refresh_s
            if entry is None or entry.fingerprint != fp or not fresh:
                cm = ops.config_map(namespace, config_map_name(group.name)) or {}
                group_pass = partial(
                    serve_group,
                    group,
                    namespace,
                    nodes=nodes,
                    pods=pods,
                    previous_doc=parse_doc(cm.get("data")),
                    rates=rates,
                    now=now,
                    rules=self.placement,
                    free=free,
                    room=room,
                )
                result = _within_quota(ops, namespace, group, group_pass, now, running=bool(pods))
                if result.objects:
                    ops.apply(result.objects)
                members = {m.name for m in group.members}
                pending = {
                    v: e for v, e in (entry.pending if entry else {}).items() if v in members
                }
                for v, events in result.events.items():
                    pending[v] = [*pending.get(v, []), *events]
                entry = _Entry(fp, now, result, pending)
                with self._lock:
                    self._entries[key] = entry
                    self.passes += 1
                if self.on_pass is not None:
                    self.on_pass(namespace, result)
            self._forget_stale(now)
            # the group lock is held: no other pass of this group touches `pending`
            return entry.result, entry.pending.pop(variant, [])

    def _forget_stale(self, now: datetime) -> None:
        """Drop groups and rates not seen for ten refresh periods (their variants are gone)."""
        horizon = 10 * max(self.refresh_s, self.rate_ttl_s)
        with self._lock:
            self._entries = {
                k: e for k, e in self._entries.items() if (now - e.at).total_seconds() <= horizon
            }
            self._rates = {
                k: v for k, v in self._rates.items() if (now - v[0]).total_seconds() <= horizon
            }
            self._seen_now = {
                k: v for k, v in self._seen_now.items() if (now - v[0]).total_seconds() <= horizon
            }


def _within_quota(
    ops: VariantOps,
    namespace: str,
    group: ServingGroup,
    group_pass: Callable[..., GroupResult],
    now: datetime,
    *,
    running: bool,
) -> GroupResult:
    """The group's pass as its queue's quota allows (`_quota_held`).

    A group whose Deployment fits once the borrowers give back its queue's lent
    quota is applied (`ReclaimingQuota`); otherwise a new group that does not fit
    builds nothing and its variants wait, and a running one keeps its last plan
    and grows no further.
    """
    result = group_pass()
    held, reclaim = _quota_held(ops, namespace, group, result)
    if held is None:
        return result
    if reclaim is not None:  # its pods reserve the quota it lent; the queue loop stops borrowers
        words = reclaim_words(*reclaim)
        events = {
            m.name: [*result.events.get(m.name, []), ("Normal", "ReclaimingQuota", words)]
            for m in group.members
        }
        return replace(result, events=events)
    if running:
        return group_pass(hold=Reason(code="QuotaExceeded", message=f"not scaling up: {held}"))
    why = Reason(code="QuotaExceeded", message=f"waiting for quota: {held}")
    deployments = [o for o in result.objects if o.get("kind") == "Deployment"]
    demand = serving_demand(namespace, deployments)  # the admission cycle keeps its place
    statuses = {
        m.name: failed_status(m.generation, why, now) | {"quotaDemand": demand}
        for m in group.members
    }
    return replace(result, objects=(), statuses=statuses, events={})


def _quota_held(
    ops: VariantOps, namespace: str, group: ServingGroup, result: GroupResult
) -> tuple[str | None, tuple[str, Mapping[str, StopCause]] | None]:
    """Why quota holds the group's new Deployment back (None: it fits), and whom a reclaim stops.

    The group's pods count against the LocalQueue `default` of its namespace
    (`training_quota.serving_workloads`), its own pods never against itself. A
    group's Deployment (new, or a running group's new plan) is applied only when
    its GPUs fit that queue now, or fit its nominal quota once the borrowed
    TrainingJobs of the cohort give back what it lent (`training_quota.serving_reclaim`:
    its pods then take the quota and the queue loop stops them), as an
    InferencePipeline's is. Quotas are off until a Queue exists.
    """
    if not result.objects:
        return None, None
    view = QuotaView.parse(ops.queues(), ops.local_queues(), ops.namespaces())
    if not view.on:
        return None, None
    key = _holder_key(namespace, group.name)
    # every namespace's serving pods hold quota in the cohort
    holders = serving_holders(view, ops.training_jobs(), ops.pods_matching(), key)
    deployments = [o for o in result.objects if o.get("kind") == "Deployment"]
    held = serving_admission(view, holders, local_queue=DEFAULT_LOCAL_QUEUE, objects=deployments)
    if held is None:
        return None, None
    return held, serving_reclaim(
        view, holders, local_queue=DEFAULT_LOCAL_QUEUE, objects=deployments
    )


def _holder_key(namespace: str, group: str) -> str:
    """The group's key among the serving workloads that hold quota."""
    return f"{namespace}/serving-group:{group}"


def fingerprint(
    group: ServingGroup,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    rates: Mapping[str, float | str],
    rules: PlacementRules | None = None,
    *,
    free: Mapping[str, FreeGpus] | None = None,
    room: ServingRoom | None = None,
) -> str:
    """A digest of everything a group pass reads; equal digests give equal passes.

    `free`: the GPUs free now per type; what of them the plan reads (`free_summary`).
    `room`: what its queue could ever hold and admits now.
    """
    request = replica_request(group.members)
    pool = gpu_pool(nodes, request, rules)
    pod_rows = []
    for p in pods:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        conditions = status.get("conditions") or []
        ready = [c.get("status") for c in conditions if c.get("type") == "Ready"]
        pod_rows.append(
            (
                meta.get("name"),
                (p.get("spec") or {}).get("nodeName"),
                status.get("phase"),
                ready,
                bool(meta.get("deletionTimestamp")),
            )
        )
    facts = {
        "members": [
            (m.name, m.uid, m.generation, m.spec.model_dump(mode="json")) for m in group.members
        ],
        "owners": [(m.name, m.uid) for m in group.owners],
        "gpus": sorted((t, perf.memory_mib, n) for t, (perf, n) in pool.items()),
        "free": free_summary(request, {t: f for t, f in (free or {}).items() if t in pool}),
        "room": None
        if room is None
        else [room.queue, sorted(room.ceilings.items()), sorted((room.now or {}).items())],
        "pods": sorted(pod_rows, key=lambda r: str(r[0])),
        # two significant digits: Prometheus noise does not re-plan every pass
        "rates": {k: v if isinstance(v, str) else float(f"{v:.2g}") for k, v in rates.items()},
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def reconcile(
    obj: Mapping[str, Any], ops: VariantOps, now: datetime, memo: GroupMemo | None = None
) -> Outcome:
    """One pass over one ModelVariant; see the module docstring."""
    meta = obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    out = Outcome()
    if meta.get("deletionTimestamp"):
        return out
    others = [v for v in ops.variants(namespace) if (v.get("metadata") or {}).get("name") != name]
    grouping = group_variants([*others, obj])
    if name in grouping.failed:
        status = failed_status(meta.get("generation"), grouping.failed[name], now)
    else:
        group = grouping.groups[grouping.group_of[name]]
        result, events = (memo or GroupMemo()).serve(ops, namespace, group, name, now)
        status = result.statuses[name]
        out.events.extend(events)
    out.events[:0] = _status_events(obj.get("status") or {}, status)
    out.status = status
    return out


def _status_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """One event when the variant starts serving, one per distinct reason it is not."""
    phase, why = new.get("phase"), new.get("whyWaiting")
    if phase == "Serving" and old.get("phase") != "Serving":
        where = f"{new.get('servingReplica')} ({new.get('node')}, {new.get('gpuType')})"
        return [("Normal", "Serving", f"serving on {where}, delta resident on the GPU")]
    if why and why != old.get("whyWaiting"):
        ready: Mapping[str, Any] = next(
            (c for c in new.get("conditions") or [] if c["type"] == "Ready"), {}
        )
        kind = "Warning" if phase == "Failed" else "Normal"
        return [(kind, str(ready.get("reason") or phase), str(why))]
    return []
