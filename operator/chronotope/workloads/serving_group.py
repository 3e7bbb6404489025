"""One pass over a serving group: plan, placement contract, objects, variant status (pure).

`serve_group` takes what the controller read (the group, the nodes, the
group's pods, the placement ConfigMap's previous document, the live rates)
and returns what to write: the ConfigMap, a Service and a Deployment
(`schedulerName: chronotope`, the planned GPU type, one replica per planned
slot), every member's status, and a `Placed` event per variant whose
placement changed. The Deployment's pod template does not depend on where
deltas sit, so a re-plan that only moves deltas restarts nothing: the model
servers read the mounted ConfigMap.

The objects are owned by every variant of the group, so the garbage
collector removes them once the last variant is deleted, and not before.
A group that cannot be planned now (say its GPU type's nodes are NotReady)
keeps its last plan, with the reason in `why`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from chronotope.api.v1alpha1.modelvariant import Residency, VariantPhase
from chronotope.planners.llmcost import Tier
from chronotope.planners.variants import GroupPlan, Placement, plan_group
from chronotope.sharing.labels import GPU_PRODUCT_LABEL, SCHEDULER_NAME
from chronotope.solver.model import Reason
from chronotope.solver.online import PlacementRules
from chronotope.workloads.capacity import FreeGpus
from chronotope.workloads.placement import (
    JSON_KEY,
    SERVING,
    TEXT_KEY,
    PodView,
    assign_slots,
    placement_doc,
    plan_from_doc,
    pod_views,
    render_text,
)
from chronotope.workloads.podreq import gpu_resources
from chronotope.workloads.queue_room import QueueRoom
from chronotope.workloads.training_status import condition
from chronotope.workloads.variants import Member, ServingGroup, group_input, replica_request

__all__ = [
    "GROUP_LABEL",
    "SERVER_PORT",
    "VARIANT_SERVER_IMAGE",
    "GroupResult",
    "config_map_name",
    "failed_status",
    "object_name",
    "serve_group",
]

GROUP_LABEL = "chronotope.dev/serving-group"
SERVER_PORT = 8080
VARIANT_SERVER_IMAGE = "registry.example/chronotope/variant-server:0.1"
"""The model server of a serving group: base + deltas, batched across variants (DeltaZip)."""
PLACEMENT_MOUNT = "/etc/chronotope/placement"
_MAX_NAME = 63
_KEPT = "; kept, no new plan: "
_RESIDENT_REASON = {
    Tier.GPU: "ResidentOnGpu",
    Tier.HOST: "InHostMemory",
    Tier.DISK: "OnDisk",
}


@dataclass(frozen=True)
class GroupResult:
    """What one group pass decided: the plan (or why none), objects, statuses, events."""

    group: str
    plan: GroupPlan | Reason
    doc: dict[str, Any] | None
    objects: tuple[dict[str, Any], ...]
    """ConfigMap, Service, Deployment, in the order to apply them (none without a plan)."""
    statuses: dict[str, dict[str, Any]]
    events: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    """Variant -> events its next pass posts (placement changes)."""


def object_name(group: str) -> str:
    """The Deployment's and Service's name (a Service name must start with a letter)."""
    return group if group[0].isalpha() else f"g-{group}"[:_MAX_NAME].rstrip("-")


def config_map_name(group: str) -> str:
    """The placement ConfigMap's name."""
    return f"{group}-placement"


def serve_group(
    group: ServingGroup,
    namespace: str,
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    previous_doc: Mapping[str, Any] | None,
    rates: Mapping[str, float | str],
    now: datetime,
    hold: Reason | None = None,
    rules: PlacementRules | None = None,
    free: Mapping[str, FreeGpus] | None = None,
    room: QueueRoom | None = None,
) -> GroupResult:
    """One pass over the group; see the module docstring.

    `hold`: why the group may not take a new plan now (its queue's quota does not
    admit it): the last plan is kept, as when no plan can be made, and each member
    gets one `QuotaExceeded` event when the reason is new. `rules`: how the extender
    places pods (`variants.gpu_pool`). `free`: the GPUs free now per type, its own
    pods' counted free (`variants.free_serving_gpus`); `room`: what its queue could
    ever hold, and admits now (`training_quota.serving_room`). It is planned on a type
    both hold first (`variants.fit_now`).
    """
    previous = plan_from_doc(previous_doc)
    if hold is None:
        live = {k: v for k, v in rates.items() if not isinstance(v, str)}
        planned: GroupPlan | Reason = plan_group(
            group_input(group, nodes, live, previous, rules, free=free, room=room)
        )
    else:
        planned = hold
    why_not: Reason | None = None
    if isinstance(planned, Reason):
        if previous is None or not previous.replicas:
            statuses = {
                m.name: _with_traffic(failed_status(m.generation, planned, now), m, rates, now)
                for m in group.members
            }
            return GroupResult(group.name, planned, None, (), statuses)
        why_not = planned
        kept = {m.name for m in group.members}
        planned = replace(
            previous,
            placements={v: p for v, p in previous.placements.items() if v in kept},
            why=f"{previous.why.split(_KEPT)[0]}{_KEPT}{planned.message}",
        )
    plan = planned
    views = pod_views(pods)
    before = [r.get("pod") for r in (previous_doc or {}).get("replicas") or []]
    slots = assign_slots(len(plan.replicas), before, list(views))
    doc = placement_doc(
        plan, group.base, members=group.members, slots=slots, pods=views, previous=previous_doc
    )
    statuses = {
        m.name: _with_traffic(
            _variant_status(m, plan, doc=doc, views=views, now=now, why_not=why_not),
            m,
            rates,
            now,
        )
        for m in group.members
    }
    events = {} if why_not else _placed_events(plan, previous_doc)
    if hold is not None and previous is not None and hold.message not in previous.why:
        events = {m.name: [("Normal", hold.code, hold.message)] for m in group.members}
    return GroupResult(
        group.name, plan, doc, group_objects(group, namespace, plan, doc), statuses, events
    )


def _with_traffic(
    status: dict[str, Any], member: Member, rates: Mapping[str, float | str], now: datetime
) -> dict[str, Any]:
    """Add the LiveTraffic condition of a variant whose traffic comes from Prometheus."""
    if member.spec.traffic.prometheus is None or member.name not in rates:
        return status
    rate = rates[member.name]
    if isinstance(rate, str):
        ok, reason = False, "PrometheusUnreachable"
        message = f"planned on expectedQPS ({member.spec.traffic.expected_qps:g}): {rate}"
    else:
        ok, reason = True, "LiveRate"
        message = f"planned on the live rate, {rate:.3g} queries/s"
    status["conditions"].append(
        condition("LiveTraffic", ok, reason, message, now=now, generation=member.generation)
    )
    return status


def _placed_events(
    plan: GroupPlan, previous_doc: Mapping[str, Any] | None
) -> dict[str, list[tuple[str, str, str]]]:
    before = (previous_doc or {}).get("placements") or {}
    out: dict[str, list[tuple[str, str, str]]] = {}
    for v, p in plan.placements.items():
        old = before.get(v) or {}
        if old.get("replicas") != list(p.replicas) or old.get("residency") != str(p.residency):
            moved = f" ({plan.on_free})" if plan.on_free else ""
            out[v] = [("Normal", "Placed", f"{plan.gpu_type}{moved}: {p.why}")]
    return out


def failed_status(generation: int | None, why: Reason, now: datetime) -> dict[str, Any]:
    """Status of a variant that is not served: Failed when waiting cannot help, else Pending."""
    return {
        "phase": str(VariantPhase.FAILED if why.unresolvable else VariantPhase.PENDING),
        "observedGeneration": generation,
        "servingReplica": None,
        "node": None,
        "gpuType": None,
        "residency": None,
        "expectedSwapLatencyMs": None,
        "whyWaiting": why.message,
        "quotaDemand": None,  # the group controller adds it where quota holds the group back
        "conditions": [
            condition("Ready", False, why.code, why.message, now=now, generation=generation),
            condition("Resident", False, why.code, why.message, now=now, generation=generation),
        ],
    }


def _pick(
    route: Sequence[Mapping[str, Any]], views: Mapping[str, PodView]
) -> tuple[str | None, bool, bool]:
    """The route's pod to report (Ready first, then bound, then any): (pod, ready, bound)."""
    serving = [e for e in route if e["state"] == SERVING and e["pod"]]
    ready = [e for e in serving if e["ready"]]
    bound = [e for e in serving if views[e["pod"]].node]
    chosen = (ready or bound or serving)[:1]
    return (chosen[0]["pod"] if chosen else None), bool(ready), bool(bound)


def _variant_status(
    member: Member,
    plan: GroupPlan,
    *,
    doc: Mapping[str, Any],
    views: Mapping[str, PodView],
    now: datetime,
    why_not: Reason | None,
) -> dict[str, Any]:
    generation = member.generation
    if member.name in plan.rejected:
        return failed_status(generation, plan.rejected[member.name], now)
    placement = plan.placements.get(member.name)
    if placement is None:  # a newcomer while the last plan is kept
        return failed_status(generation, why_not or Reason(code="NotPlaced", message=plan.why), now)
    route = doc["routes"].get(member.name) or []
    pod, ready, bound = _pick(route, views)
    node = views[pod].node if pod else None
    if ready:
        gpu = placement.residency is Tier.GPU
        phase = VariantPhase.SERVING if gpu else VariantPhase.SWAPPED
    else:
        phase = VariantPhase.LOADING if bound else VariantPhase.PENDING
    why = _why(phase, placement, route, pod, views)
    if phase is VariantPhase.PENDING and plan.on_free:
        why = f"{why}; {plan.on_free}"
    if why is not None and why_not is not None:
        why = f"{why} ({why_not.message})"
    resident = placement.residency is Tier.GPU
    return {
        "phase": str(phase),
        "observedGeneration": generation,
        "servingReplica": pod,
        "node": node,
        "gpuType": plan.gpu_type,
        "residency": str(Residency(str(placement.residency))),
        "expectedSwapLatencyMs": placement.swap_ms,
        "whyWaiting": why,
        "quotaDemand": None,
        "conditions": [
            condition(
                "Ready",
                phase in (VariantPhase.SERVING, VariantPhase.SWAPPED),
                str(phase),
                why or f"serving on {pod} ({node}, {plan.gpu_type})",
                now=now,
                generation=generation,
            ),
            condition(
                "Resident",
                resident,
                _RESIDENT_REASON[placement.residency],
                placement.why,
                now=now,
                generation=generation,
            ),
        ],
    }


def _why(
    phase: VariantPhase,
    placement: Placement,
    route: Sequence[Mapping[str, Any]],
    pod: str | None,
    views: Mapping[str, PodView],
) -> str | None:
    if phase is VariantPhase.SERVING:
        return None
    if phase is VariantPhase.SWAPPED:
        return placement.why
    if phase is VariantPhase.LOADING:
        assert pod is not None
        return f"replica pod {pod} on {views[pod].node} is loading; {placement.why}"
    if pod is None:
        slots = [str(e["slot"] + 1) for e in route if e["state"] == SERVING]
        noun = "replica" if len(slots) == 1 else "replicas"
        return f"no pod yet for {noun} {', '.join(slots)}; {placement.why}"
    waiting = views[pod].waiting or "waiting to be scheduled"
    return f"pod {pod} is not scheduled: {waiting}; {placement.why}"


def _owners(group: ServingGroup) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "chronotope.dev/v1alpha1",
            "kind": "ModelVariant",
            "name": m.name,
            "uid": m.uid,
        }
        for m in group.owners
        if m.uid
    ]


def _pod_resources(group: ServingGroup) -> tuple[dict[str, str], dict[str, str]]:
    """(container limits, pod annotations) of one replica: whole GPUs or a share."""
    request = replica_request(group.members)
    return gpu_resources(request.shared, request.count or 1)


def group_objects(
    group: ServingGroup, namespace: str, plan: GroupPlan, doc: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(ConfigMap, Service, Deployment) of the group, as planned."""
    name, cm_name = object_name(group.name), config_map_name(group.name)
    labels = {GROUP_LABEL: group.name}
    meta = {"namespace": namespace, "labels": labels, "ownerReferences": _owners(group)}
    limits, annotations = _pod_resources(group)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm_name, **meta},
        "data": {
            JSON_KEY: json.dumps(doc, sort_keys=True, separators=(",", ":")),
            TEXT_KEY: render_text(doc),
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, **meta},
        "spec": {"selector": labels, "ports": [{"port": SERVER_PORT}]},
    }
    env = [
        {"name": "CHRONOTOPE_SERVING_GROUP", "value": group.name},
        {"name": "CHRONOTOPE_BASE_MODEL", "value": group.base.name},
        {"name": "CHRONOTOPE_BASE_SIZE_MIB", "value": str(group.base.size_mib)},
        {"name": "CHRONOTOPE_PLACEMENT", "value": f"{PLACEMENT_MOUNT}/{JSON_KEY}"},
        # the server finds its slot in the placement by its pod name
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, **meta},
        "spec": {
            "replicas": len(plan.replicas),
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "schedulerName": SCHEDULER_NAME,
                    "nodeSelector": {GPU_PRODUCT_LABEL: plan.gpu_type},
                    "containers": [
                        {
                            "name": "server",
                            "image": VARIANT_SERVER_IMAGE,
                            "env": env,
                            "ports": [{"containerPort": SERVER_PORT}],
                            "resources": {"limits": limits},
                            "volumeMounts": [
                                {
                                    "name": "placement",
                                    "mountPath": PLACEMENT_MOUNT,
                                    "readOnly": True,
                                }
                            ],
                        }
                    ],
                    "volumes": [{"name": "placement", "configMap": {"name": cm_name}}],
                },
            },
        },
    }
    return config_map, service, deployment
