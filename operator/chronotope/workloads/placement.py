"""The serving group's placement ConfigMap: the contract with the data plane (pure).

One ConfigMap per serving group, `<group>-placement`, key `placement.json`
(and `placement.txt`, the same as a table for people). The model server pods
mount it and find their slot by pod name; the router reads the routes.

```
{"version": 7, "group": "llama-7b", "gpuType": "H100-SXM5-80GB",
 "base": {"name": ..., "sizeMiB": 13000, "parametersBillions": 6.7},
 "deltaSlots": 3, "capacityQPS": 5.34, "why": "2 x H100-SXM5-80GB for ...",
 "replicas": [{"slot": 0, "pod": "llama-7b-5d9f-abcde", "node": "h100-0", "ready": true,
               "utilization": 0.52,
               "resident": [{"variant": ..., "uri": ..., "sizeMiB": 900}],
               "loadsOnDemand": [{"variant": ..., "uri": ..., "sizeMiB": 450, "tier": "Host"}]}],
 "routes": {"chat": [{"slot": 0, "pod": ..., "weight": 0.5, "state": "serving",
                      "ready": true}, ...]},
 "placements": {"chat": {"replicas": [0, 1], "weights": [0.5, 0.5], "residency": "GPU",
                         "swapMs": 0.0, "why": "resident on replicas 1, 2 of 2: ..."}},
 "rejected": {"x": {"code": "SloUnmeetable", "message": ...}}}
```

- Slots are the plan's replicas. A slot keeps its pod while that pod lives;
  pods without a slot fill empty slots in name order (`assign_slots`).
- A move never drops a variant: when a re-plan takes a delta off a replica,
  that replica stays in the variant's route as `draining` (weight 0) for the
  next version, and for as long as none of the variant's new replicas is
  Ready, so the router keeps a route while the new replica loads.
- `version` goes up by one whenever anything else in the document changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chronotope.api.v1alpha1.modelvariant import BaseModelRef
from chronotope.planners.llmcost import Tier
from chronotope.planners.variants import GroupPlan, Placement, ReplicaPlan
from chronotope.solver.model import Reason
from chronotope.workloads.variants import Member

__all__ = [
    "DRAINING",
    "JSON_KEY",
    "SERVING",
    "TEXT_KEY",
    "PodView",
    "assign_slots",
    "parse_doc",
    "placement_doc",
    "plan_from_doc",
    "pod_views",
    "render_text",
    "routes",
]

JSON_KEY = "placement.json"
TEXT_KEY = "placement.txt"
SERVING = "serving"
DRAINING = "draining"


@dataclass(frozen=True)
class PodView:
    """What the contract needs of a live pod of the group."""

    name: str
    node: str | None
    ready: bool
    waiting: str | None
    """The scheduler's reason while the pod is not bound, if it gave one."""


def pod_views(pods: Sequence[Mapping[str, Any]]) -> dict[str, PodView]:
    """Live pods by name: not being deleted and not finished."""
    out = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
            continue
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        waiting = next(
            (
                str(c.get("message") or c.get("reason") or "")
                for c in conditions
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        )
        node = (pod.get("spec") or {}).get("nodeName")
        out[str(meta["name"])] = PodView(str(meta["name"]), node, ready, waiting)
    return out


def assign_slots(n: int, previous: Sequence[str | None], pods: Sequence[str]) -> list[str | None]:
    """Slot -> pod: a slot keeps its live pod; other pods fill empty slots in name order."""
    alive = set(pods)
    slots: list[str | None] = [
        previous[i] if i < len(previous) and previous[i] in alive else None for i in range(n)
    ]
    taken = {p for p in slots if p}
    free = iter(p for p in sorted(alive) if p not in taken)
    return [p if p is not None else next(free, None) for p in slots]


def routes(
    plan: GroupPlan,
    slots: Sequence[str | None],
    pods: Mapping[str, PodView],
    previous: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, list[dict[str, Any]]]:
    """Variant -> its route entries: the plan's replicas, then what still drains."""
    out: dict[str, list[dict[str, Any]]] = {}
    for variant, p in sorted(plan.placements.items()):
        entries = [
            {
                "slot": i,
                "pod": slots[i],
                "weight": w,
                "state": SERVING,
                "ready": bool(slots[i] and pods[str(slots[i])].ready),
            }
            for i, w in zip(p.replicas, p.weights, strict=True)
        ]
        any_ready = any(e["ready"] for e in entries)
        serving_pods = {e["pod"] for e in entries if e["pod"]}
        for old in previous.get(variant) or []:
            pod = old.get("pod")
            if not pod or pod not in pods or pod in serving_pods:
                continue
            if old.get("state") == SERVING or not any_ready:
                entries.append(
                    {
                        "slot": old.get("slot"),
                        "pod": pod,
                        "weight": 0.0,
                        "state": DRAINING,
                        "ready": pods[pod].ready,
                    }
                )
                serving_pods.add(pod)
        out[variant] = entries
    return out


def _delta(member: Member) -> dict[str, Any]:
    return {
        "variant": member.name,
        "uri": member.spec.delta.uri,
        "sizeMiB": member.spec.delta.compressed_size_mib,
    }


def placement_doc(
    plan: GroupPlan,
    base: BaseModelRef,
    *,
    members: Sequence[Member],
    slots: Sequence[str | None],
    pods: Mapping[str, PodView],
    previous: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ConfigMap's document for `plan` (see the module docstring)."""
    by_name = {m.name: m for m in members}
    replicas = []
    for r in plan.replicas:
        pod = slots[r.index]
        view = pods.get(pod) if pod else None
        replicas.append(
            {
                "slot": r.index,
                "pod": pod,
                "node": view.node if view else None,
                "ready": bool(view and view.ready),
                "utilization": r.utilization,
                "resident": [_delta(by_name[v]) for v in r.resident if v in by_name],
                "loadsOnDemand": [
                    _delta(by_name[v]) | {"tier": str(plan.placements[v].residency)}
                    for v in r.loads
                    if v in by_name
                ],
            }
        )
    doc: dict[str, Any] = {
        "version": 0,
        "group": plan.group,
        "gpuType": plan.gpu_type,
        "base": {
            "name": base.name,
            "sizeMiB": base.size_mib,
            "parametersBillions": base.parameters_billions,
        },
        "deltaSlots": plan.slots,
        "capacityQPS": plan.capacity_qps,
        "why": plan.why,
        "replicas": replicas,
        "routes": routes(plan, slots, pods, (previous or {}).get("routes") or {}),
        "placements": {
            v: {
                "replicas": list(p.replicas),
                "weights": list(p.weights),
                "residency": str(p.residency),
                "swapMs": p.swap_ms,
                "why": p.why,
            }
            for v, p in sorted(plan.placements.items())
        },
        "rejected": {
            v: {"code": r.code, "message": r.message} for v, r in sorted(plan.rejected.items())
        },
    }
    old_version = int((previous or {}).get("version") or 0)
    same = previous is not None and {**previous, "version": 0} == doc
    doc["version"] = old_version if same else old_version + 1
    return doc


def plan_from_doc(doc: Mapping[str, Any] | None) -> GroupPlan | None:
    """The plan a document was written for (the planner's `previous`), or None if unreadable."""
    if not doc:
        return None
    try:
        placements = {
            v: Placement(
                v,
                tuple(int(i) for i in p["replicas"]),
                tuple(float(w) for w in p["weights"]),
                Tier(p["residency"]),
                float(p["swapMs"]),
                str(p["why"]),
            )
            for v, p in (doc.get("placements") or {}).items()
        }
        replicas = tuple(
            ReplicaPlan(
                int(r["slot"]),
                tuple(d["variant"] for d in r.get("resident") or []),
                tuple(d["variant"] for d in r.get("loadsOnDemand") or []),
                float(r.get("utilization") or 0.0),
            )
            for r in doc.get("replicas") or []
        )
        rejected = {
            v: Reason(code=r["code"], message=r["message"], unresolvable=True)
            for v, r in (doc.get("rejected") or {}).items()
        }
        return GroupPlan(
            str(doc["group"]),
            str(doc["gpuType"]),
            replicas,
            placements,
            int(doc["deltaSlots"]),
            float(doc["capacityQPS"]),
            rejected,
            str(doc.get("why") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def parse_doc(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The document in a ConfigMap's `data`, or None when absent or not JSON."""
    text = (data or {}).get(JSON_KEY)
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def render_text(doc: Mapping[str, Any]) -> str:
    """The document as a table for `kubectl describe configmap`."""
    lines = [
        f"group {doc['group']} v{doc['version']}: {doc['why']}",
        "",
        f"{'SLOT':<5}{'POD':<40}{'NODE':<20}{'READY':<7}RESIDENT / ON DEMAND",
    ]
    for r in doc["replicas"]:
        resident = ",".join(d["variant"] for d in r["resident"]) or "-"
        loads = ",".join(f"{d['variant']}({d['tier']})" for d in r["loadsOnDemand"])
        lines.append(
            f"{r['slot']:<5}{r['pod'] or '-':<40}{r['node'] or '-':<20}"
            f"{'yes' if r['ready'] else 'no':<7}{resident}{' / ' + loads if loads else ''}"
        )
    lines += ["", f"{'VARIANT':<32}ROUTE (slot:weight, state)"]
    for variant, entries in doc["routes"].items():
        hops = ", ".join(
            f"{e['slot']}:{e['weight']:g}" + ("" if e["state"] == SERVING else f" {e['state']}")
            for e in entries
        )
        lines.append(f"{variant:<32}{hops}")
    return "\n".join(lines) + "\n"
