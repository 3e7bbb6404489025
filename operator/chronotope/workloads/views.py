"""What `kubectl chronotope` shows, built from plain objects (pure).

- `gpu_map`: per GPU node, each GPU's holders and their shares, from the same
  cluster model the extender decides on (`solver.cache.ClusterCache` fed by
  `workloads.cluster_feed`), plus totals by GPU type.
- `explain`: why an object waits or sits where it is: phase, reason,
  conditions and recent events, with what would unblock it, and a waiting
  TrainingJob's place in its queue (`queue_place`, from
  `training_quota.pending_order`).
- `gantt`: the TrainingJobs' space-time plan as text, one row per job grouped
  by GPU type, with now and the deadlines marked.
- `usage`: GPUs in use by type, by namespace and by queue.
- `pipeline_latency`: each InferencePipeline's predicted and observed P99
  against its SLO, with the `SloMet` condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chronotope.api.v1alpha1.queue import QueuedWorkload
from chronotope.sharing.labels import DONE_PHASES
from chronotope.solver.cache import ClusterCache
from chronotope.solver.model import MILLI
from chronotope.workloads.cluster_feed import node_info, pod_holding
from chronotope.workloads.replan import parse_time
from chronotope.workloads.training_quota import QuotaView

__all__ = [
    "GpuCell",
    "NodeRow",
    "dashboard_state",
    "explain",
    "gantt",
    "gpu_map",
    "gpu_totals",
    "pipeline_latency",
    "queue_place",
    "queue_rows",
    "usage",
]

Obj = Mapping[str, Any]
WHOLE = 100
"""A whole GPU's compute, percent."""


@dataclass
class GpuCell:
    """One GPU: its index and who holds how much of it."""

    index: int
    holders: list[tuple[str, int]] = field(default_factory=list)
    """(pod key, share in percent) of every pod on this GPU."""

    @property
    def used_percent(self) -> int:
        """Compute share taken, percent."""
        return min(100, sum(p for _, p in self.holders))

    def text(self) -> str:
        """`free`, or the holders with their shares."""
        if not self.holders:
            return "free"
        return "+".join(f"{key}({pct}%)" if pct < WHOLE else key for key, pct in self.holders)


@dataclass
class NodeRow:
    """One GPU node of the map."""

    node: str
    gpu_type: str
    gpus: list[GpuCell]

    def as_dict(self) -> dict[str, Any]:
        """The row as plain data (for -o json/yaml)."""
        return {
            "node": self.node,
            "gpuType": self.gpu_type,
            "gpus": [
                {"index": c.index, "holders": [{"pod": k, "percent": p} for k, p in c.holders]}
                for c in self.gpus
            ],
        }


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def gpu_map(
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    *,
    gpu_type: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[NodeRow]:
    """Per GPU node (filtered by type and labels), each GPU's holders."""
    cache = ClusterCache()
    for node in nodes:
        cache.upsert_node(node_info(node))
    held: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for pod in pods:
        bound = (pod.get("spec") or {}).get("nodeName")
        if not bound or (pod.get("status") or {}).get("phase") in DONE_PHASES:
            continue
        key = _key(pod)
        holding = pod_holding(cache, key, pod, bound)
        cache.record_bound(key, holding)
        for g in holding.gpu_indices:
            held.setdefault((bound, g), []).append((key, holding.gpu_milli * 100 // MILLI))
    rows = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        info = node_info(node)
        node_labels = (node.get("metadata") or {}).get("labels") or {}
        if info.gpu_count == 0 or (gpu_type and info.gpu_model != gpu_type):
            continue
        if labels and any(node_labels.get(k) != v for k, v in labels.items()):
            continue
        cells = [GpuCell(g, held.get((info.name, g), [])) for g in range(info.gpu_count)]
        rows.append(NodeRow(info.name, info.gpu_model, cells))
    return rows


def gpu_totals(rows: Sequence[NodeRow]) -> dict[str, dict[str, int]]:
    """By GPU type: GPUs free, shared (partly held) and whole (fully held)."""
    out: dict[str, dict[str, int]] = {}
    for row in rows:
        t = out.setdefault(row.gpu_type, {"free": 0, "shared": 0, "whole": 0})
        for cell in row.gpus:
            if not cell.holders:
                t["free"] += 1
            elif cell.used_percent < WHOLE or len(cell.holders) > 1:
                t["shared"] += 1
            else:
                t["whole"] += 1
    return out


def queue_place(key: str, order: Mapping[str, Sequence[QueuedWorkload]]) -> str | None:
    """Where pending workload `key` stands in its Queue and LocalQueue, or None if nowhere.

    `order` is `training_quota.pending_order`'s: per Queue, its pending workloads
    in admission order.
    """
    for queue, queued in order.items():
        for entry in queued:
            if entry.workload != key:
                continue
            namespace = key.partition("/")[0]
            in_local = sum(
                1
                for q in queued
                if q.local_queue == entry.local_queue and q.workload.startswith(namespace + "/")
            )
            return (
                f"queue: {entry.position} of {len(queued)} pending in Queue {queue}, "
                f"{entry.local_queue_position} of {in_local} in LocalQueue "
                f"{namespace}/{entry.local_queue} (admission order: priority, deadline, age; "
                "one further back starts first when it fits and those ahead do not, "
                "unless the Queue is StrictFIFO)"
            )
    return None


def explain(
    kind: str,
    obj: Obj,
    events: Sequence[Obj],
    *,
    free_by_type: Mapping[str, int] | None = None,
    queue_order: Mapping[str, Sequence[QueuedWorkload]] | None = None,
) -> list[str]:
    """Why the object waits or sits where it is, in plain lines, newest events last.

    `queue_order` (`training_quota.pending_order`) adds a pending job's place in its queue.
    """
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    lines = [f"{kind} {_key(obj)}"]
    phase = status.get("phase") or ("Bound" if spec.get("nodeName") else "Pending")
    lines.append(f"phase: {phase}")
    place = queue_place(_key(obj), queue_order) if queue_order else None
    if place is not None:
        lines.append(place)
    if kind == "Pod" and spec.get("nodeName"):
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        gpus = annotations.get("chronotope.dev/assigned-gpus")
        lines.append(f"on node {spec['nodeName']}" + (f", GPUs {gpus}" if gpus else ""))
    why = status.get("whyWaiting")
    if why:
        lines.append(f"why: {why}")
    avoided = status.get("avoidNodes") or []
    if avoided:
        lines.append(
            f"avoiding node(s) {', '.join(map(str, avoided))}: its gang waited there unbound "
            "(kube-scheduler ruled them out for a reason the plan does not model)"
        )
    plan = status.get("plan") or {}
    if plan.get("gpuType"):
        lines.append(
            f"plan: {plan.get('workers')} worker(s) on {plan.get('gpuType')}, "
            f"predicted to finish {plan.get('predictedCompletionTime')}"
        )
    if kind == "InferencePipeline":
        lines += _latency_lines(obj)
    for stage in status.get("stages") or []:
        served = f", served by serving group {stage['servedBy']}" if stage.get("servedBy") else ""
        lines.append(
            f"stage {stage.get('name')}: {stage.get('readyReplicas', 0)}/{stage.get('replicas')} "
            f"ready on {stage.get('gpuType')} (batch {stage.get('batchSize')}){served}"
        )
    if status.get("residency"):  # a ModelVariant
        lines.append(
            f"delta in {status['residency']} (swap-in {status.get('expectedSwapLatencyMs')} ms), "
            f"served by {status.get('servingReplica') or 'no pod yet'} on "
            f"{status.get('node') or '-'} ({status.get('gpuType')})"
        )
    for c in status.get("conditions") or []:
        lines.append(
            f"condition {c.get('type')}={c.get('status')} ({c.get('reason')}): {c.get('message')}"
        )
    recent = sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    for e in recent[-5:]:
        lines.append(f"event {e.get('type')} {e.get('reason')}: {e.get('message')}")
    lines += _unblock(kind, obj, phase, free_by_type or {})
    return lines


def _slo_met(status: Obj) -> dict[str, Any] | None:
    """The `SloMet` condition's status, reason and message, or None."""
    found = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "SloMet"),
        None,
    )
    if found is None:
        return None
    return {k: found.get(k) for k in ("status", "reason", "message")}


def _latency_lines(pipeline: Obj) -> list[str]:
    """`P99: observed .., predicted .., SLO ..[, SloMet=..]`, when there is anything to say."""
    (row,) = pipeline_latency([pipeline])
    if row["predictedP99Ms"] is None and row["observedP99Ms"] is None:
        return []

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:g} ms"

    verdict = f", SloMet={row['sloMet']}" if row["sloMet"] else ""
    return [
        f"P99: observed {ms(row['observedP99Ms'])}, predicted {ms(row['predictedP99Ms'])}, "
        f"SLO {ms(row['sloMs'])}{verdict}"
    ]


def pipeline_latency(pipelines: Sequence[Obj]) -> list[dict[str, Any]]:
    """Per InferencePipeline: predicted and observed P99, the SLO and `SloMet`'s status."""
    rows = []
    for p in pipelines:
        status = p.get("status") or {}
        met = _slo_met(status)
        rows.append(
            {
                "pipeline": _key(p),
                "predictedP99Ms": status.get("predictedP99Ms"),
                "observedP99Ms": status.get("observedP99Ms"),
                "sloMs": ((p.get("spec") or {}).get("slo") or {}).get("p99LatencyMs"),
                "sloMet": met["status"] if met else None,
                "reason": met["reason"] if met else None,
            }
        )
    return rows


def _unblock(kind: str, obj: Obj, phase: str, free_by_type: Mapping[str, int]) -> list[str]:
    """What would let a waiting object run, when the reason says."""
    if phase in ("Running", "Serving", "Succeeded", "Bound"):
        return []
    spec = obj.get("spec") or {}
    if kind == "TrainingJob":
        need = int(spec.get("replicas") or 1) * int((spec.get("gpu") or {}).get("count") or 1)
        offers = [
            f"{t.get('name')}: {free_by_type.get(str(t.get('name')), 0)} free"
            for t in spec.get("gpuTypes") or []
        ]
        return [
            f"unblock: it needs {need} GPU(s) of one of its types ({'; '.join(offers)}); "
            "free GPUs of those types, a lower priority, or fewer replicas would let it start"
        ]
    if kind == "Pod":
        return ["unblock: see the scheduler's event above (the extender's reason per node)"]
    return []


def gantt(
    jobs: Sequence[Obj], now: datetime, *, width: int = 60, horizon: timedelta | None = None
) -> list[str]:
    """The TrainingJobs' plan as text bars by GPU type: `|` now, `!` a deadline, `>` later."""
    rows: list[tuple[str, str, datetime, datetime, datetime | None, str]] = []
    for job in jobs:
        status = job.get("status") or {}
        plan = status.get("plan") or {}
        start = parse_time(plan.get("startTime"))
        end = parse_time(plan.get("predictedCompletionTime"))
        utility = (job.get("spec") or {}).get("utility") or {}
        deadline = parse_time(utility.get("deadline"))
        phase = str(status.get("phase") or "New")
        if start is None or end is None:
            start = end = now
        rows.append(
            (str(plan.get("gpuType") or "(waiting)"), _key(job), start, end, deadline, phase)
        )
    if not rows:
        return ["no TrainingJobs"]
    lo = min([r[2] for r in rows] + [now])
    hi = max([r[3] for r in rows] + [now + timedelta(minutes=1)])
    # deadlines shortly after the last finish widen the chart; far ones show as '>'
    near = [d for _, _, _, _, d, _ in rows if d is not None and d <= hi + (hi - lo) / 2]
    hi = max([hi, *near])
    if horizon is not None:
        hi = min(hi, now + horizon)
    span = max((hi - lo).total_seconds(), 1.0)

    def col(t: datetime) -> int:
        return max(0, min(width - 1, int((t - lo).total_seconds() / span * (width - 1))))

    out = [f"{lo:%Y-%m-%d %H:%M} .. {hi:%Y-%m-%d %H:%M} UTC   | now   ! deadline   > later"]
    name_w = max(len(r[1]) for r in rows)
    for gpu_type in sorted({r[0] for r in rows}):
        out.append(f"{gpu_type}:")
        for _, key, start, end, deadline, phase in sorted(
            (r for r in rows if r[0] == gpu_type), key=lambda r: (r[2], r[1])
        ):
            bar = [" "] * width
            for c in range(col(start), col(end) + 1):
                bar[c] = "="
            bar[col(now)] = "|"
            if deadline is not None and lo <= deadline <= hi:
                bar[col(deadline)] = "!"
            elif deadline is not None and deadline > hi:
                bar[width - 1] = ">"
            out.append(f"  {key:<{name_w}} [{''.join(bar)}] {phase}")
    return out


def usage(
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    jobs: Sequence[Obj],
    local_queues: Sequence[Obj] = (),
) -> dict[str, dict[str, dict[str, float]]]:
    """GPUs held by type (of total), by namespace and by queue (running TrainingJobs).

    A job counts under the Queue its namespace's LocalQueue admits into (`local_queues`),
    else under the queue name it gives.
    """
    rows = gpu_map(nodes, pods)
    by_type: dict[str, dict[str, float]] = {}
    by_ns: dict[str, dict[str, float]] = {}
    for row in rows:
        t = by_type.setdefault(row.gpu_type, {"used": 0.0, "total": 0.0})
        for cell in row.gpus:
            t["total"] += 1
            t["used"] += cell.used_percent / 100
            for key, pct in cell.holders:
                ns = key.split("/", 1)[0]
                by_ns.setdefault(ns, {"gpus": 0.0})["gpus"] += pct / 100
    by_queue = _job_usage(jobs, _local_to_queue(local_queues))
    return {"byType": by_type, "byNamespace": by_ns, "byQueue": by_queue}


def _job_usage(
    jobs: Sequence[Obj], targets: Mapping[tuple[str, str], str] | None = None
) -> dict[str, dict[str, float]]:
    """GPUs and jobs of the started TrainingJobs, by Queue.

    A job counts under the Queue its LocalQueue admits into (`targets`), else
    under the queue name it gives.
    """
    by_queue: dict[str, dict[str, float]] = {}
    for job in jobs:
        status = job.get("status") or {}
        if status.get("phase") not in ("Running", "Starting"):
            continue
        local = str((job.get("spec") or {}).get("queue") or "default")
        namespace = str((job.get("metadata") or {}).get("namespace"))
        queue = (targets or {}).get((namespace, local), local)
        gpus = float((status.get("plan") or {}).get("totalGpus") or 0)
        q = by_queue.setdefault(queue, {"gpus": 0.0, "jobs": 0.0})
        q["gpus"] += gpus
        q["jobs"] += 1
    return by_queue


def _queue_label(meta: Obj, spec: Obj, targets: Mapping[tuple[str, str], str]) -> str:
    local = str(spec.get("queue") or "default")
    target = targets.get((str(meta.get("namespace")), local))
    return local if target is None else f"{local} → {target}"


DESCRIPTION_ANNOTATION = "kubernetes.io/description"


def queue_rows(queues: Sequence[Obj], jobs: Sequence[Obj]) -> list[dict[str, Any]]:
    """The dashboard's queue table: each Queue's quota, use and head of line.

    From the Queues' spec and the status the operator writes (`training_quota.queue_report`):
    per GPU type nominal, used, borrowed and lent GPUs, admitted and pending counts, the
    first pending jobs. With no Queue (quotas off), one row per LocalQueue name the running
    TrainingJobs name, with the GPUs they hold.
    """
    if not queues:
        return [
            {
                "name": name,
                "cohort": None,
                "gpus": [],
                "inUse": v["gpus"],
                "admitted": int(v["jobs"]),
                "pending": None,
                "next": [],
            }
            for name, v in sorted(_job_usage(jobs).items())
        ]
    out = []
    for q in sorted(queues, key=lambda q: str((q.get("metadata") or {}).get("name"))):
        spec, status = q.get("spec") or {}, q.get("status") or {}
        used = {str(r.get("gpuType")): r for r in status.get("gpus") or []}
        gpus: list[dict[str, Any]] = []
        for quota in spec.get("quotas") or []:
            gpu_type = str(quota.get("gpuType"))
            row = used.get(gpu_type) or {}
            gpus.append(
                {
                    "gpuType": gpu_type,
                    "nominal": int(quota.get("gpus") or 0),
                    "used": int(row.get("used") or 0),
                    "borrowed": int(row.get("borrowed") or 0),
                    "lent": int(row.get("lent") or 0),
                    "shareMilli": int(quota.get("shareMilli") or 0),
                    "usedShareMilli": int(row.get("usedShareMilli") or 0),
                }
            )
        out.append(
            {
                "name": str((q.get("metadata") or {}).get("name")),
                "cohort": spec.get("cohort"),
                "gpus": gpus,
                "inUse": sum(g["used"] for g in gpus),
                "admitted": int(status.get("admittedWorkloads") or 0),
                "pending": int(status.get("pendingWorkloads") or 0),
                "next": [_next_up(h) for h in (status.get("pendingHead") or [])[:3]],
            }
        )
    return out


def _next_up(entry: Obj) -> str:
    """A pending job of a Queue's head, with its predicted start (UTC) where it has one."""
    at = parse_time(entry.get("predictedStartTime"))
    workload = str(entry.get("workload"))
    return workload if at is None else f"{workload} (starts {at:%m-%d %H:%M})"


def _local_to_queue(local_queues: Sequence[Obj]) -> dict[tuple[str, str], str]:
    """(namespace, LocalQueue) -> the Queue it admits into, read as the quota reads them."""
    parsed = QuotaView.parse((), local_queues).local_queues
    return {key: spec.queue for key, spec in parsed.items()}


def dashboard_state(
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    jobs: Sequence[Obj],
    *,
    pipelines: Sequence[Obj],
    variants: Sequence[Obj],
    now: datetime,
    queues: Sequence[Obj] = (),
    local_queues: Sequence[Obj] = (),
) -> dict[str, Any]:
    """Everything the dashboard draws, as plain JSON-ready data.

    User strings are left raw: the page sets them as text, never as markup. A job's
    `queue` is its LocalQueue, with the Queue it admits into when that LocalQueue exists.
    """
    rows = gpu_map(nodes, pods)
    targets = _local_to_queue(local_queues)
    job_rows = []
    for job in jobs:
        meta, spec, status = (
            job.get("metadata") or {},
            job.get("spec") or {},
            job.get("status") or {},
        )
        plan = status.get("plan") or {}
        deadline = ((spec.get("utility") or {}).get("deadline")) or None
        job_rows.append(
            {
                "key": _key(job),
                "phase": str(status.get("phase") or "New"),
                "queue": _queue_label(meta, spec, targets),
                "gpuType": plan.get("gpuType"),
                "workers": plan.get("workers"),
                "start": plan.get("startTime"),
                "finish": plan.get("predictedCompletionTime"),
                "deadline": deadline,
                "why": status.get("whyWaiting"),
                "description": ((meta.get("annotations") or {}).get(DESCRIPTION_ANNOTATION)),
            }
        )
    pipeline_rows = []
    for p in pipelines:
        status = p.get("status") or {}
        pipeline_rows.append(
            {
                "key": _key(p),
                "phase": status.get("phase"),
                "stages": status.get("stages") or [],
                "predictedP99Ms": status.get("predictedP99Ms"),
                "observedP99Ms": status.get("observedP99Ms"),
                "p99History": status.get("p99History") or [],
                "sloMet": _slo_met(status),
                "sloMs": ((p.get("spec") or {}).get("slo") or {}).get("p99LatencyMs"),
                "costPerHour": status.get("costPerHour"),
                "tuner": (status.get("tuner") or {}).get("mode"),
                "why": status.get("whyWaiting"),
            }
        )
    variant_rows = [
        {
            "key": _key(v),
            "phase": (v.get("status") or {}).get("phase"),
            "residency": (v.get("status") or {}).get("residency"),
        }
        for v in variants
    ]
    return {
        "now": now.isoformat(),
        "nodes": [r.as_dict() for r in rows],
        "totals": gpu_totals(rows),
        "jobs": sorted(job_rows, key=lambda r: r["key"]),
        "queues": queue_rows(queues, jobs),
        "pipelines": pipeline_rows,
        "variants": variant_rows,
    }
