"""The invariants a chaos run checks, on plain snapshots of the cluster (pure).

A `Snapshot` is what the API server said at one moment: nodes, pods and
TrainingJobs as JSON dicts. Each check returns what it looked at (`checked`,
for the report) and what is wrong (`problems`: sentences naming the objects).
Assignments are read with the product's own parser
(`sharing.assignment.GpuAssignment`) and requests with `workloads.podreq`; the
sums, the exclusivity of whole GPUs and the gang and job rules are counted
here, apart from the extender's cache.

Only `settle_problems` asks the product's model: whether a pending pod or gang
fits now is answered by a `solver.cache.ClusterCache` rebuilt from the
snapshot, as a restarted extender rebuilds it. A pod that such a fresh cache
can place but that stays pending means the running scheduler has not
converged.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chronotope.sharing.assignment import GpuAssignment
from chronotope.sharing.labels import (
    DONE_PHASES,
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    GPU_MEMORY_LABEL,
    GPU_RESOURCE,
    SCHEDULER_NAME,
)
from chronotope.solver.cache import ClusterCache
from chronotope.solver.model import PodRequest
from chronotope.workloads.cluster_feed import node_info, pod_holding
from chronotope.workloads.gang import GENERATION_LABEL, JOB_LABEL
from chronotope.workloads.podreq import PodRequestError, pod_key, pod_request

__all__ = [
    "SETTLED_PHASES",
    "Findings",
    "Snapshot",
    "gang_problems",
    "job_problems",
    "lost_objects",
    "over_allocation",
    "settle_problems",
]

PERCENT = 100
SETTLED_PHASES = ("Running", "Waiting", "Pending", "Succeeded")
"""TrainingJob phases that stay put until something changes (Starting and Resizing move on)."""


@dataclass(frozen=True)
class Snapshot:
    """Nodes, pods and TrainingJobs as the API server returned them (JSON dicts)."""

    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    jobs: list[dict[str, Any]]

    def live_pods(self) -> list[dict[str, Any]]:
        """Pods that hold or wait for resources: not Succeeded or Failed."""
        return [p for p in self.pods if (p.get("status") or {}).get("phase") not in DONE_PHASES]


@dataclass
class Findings:
    """What a check looked at (by kind) and what it found wrong."""

    checked: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def add(self, other: Findings) -> Findings:
        """This plus `other` (counts summed, problems appended); returns self."""
        self.checked.update(other.checked)
        self.problems.extend(other.problems)
        return self


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def _key(obj: Mapping[str, Any]) -> str:
    return f"{_meta(obj).get('namespace', '')}/{_meta(obj).get('name', '')}"


# ---------------------------------------------------------------------- over-allocation
@dataclass(frozen=True)
class _Use:
    pod: str
    percent: int
    memory_mib: int
    whole: bool

    def __str__(self) -> str:
        return (
            f"{self.pod} ({'whole' if self.whole else f'{self.percent}%, {self.memory_mib} MiB'})"
        )


def over_allocation(snap: Snapshot) -> Findings:
    """Zero over-allocation, from the assignment annotations of every bound pod.

    Per GPU: a whole-GPU holder is alone; shares' compute sums to at most 100 %
    and their memory to at most the GPU's (node label `nvidia.com/gpu.memory`);
    the GPU exists on its node. Per pod: a bound `chronotope` pod that asks for
    GPUs carries a readable assignment for its own node, of the size it asked
    for. A pod of another scheduler holds whole GPUs by its request (the
    ledger's rule); it is counted on its node's first GPUs, so that anything
    placed beside it shows. Terminating pods still hold what they were given.
    """
    out = Findings()
    nodes = {_meta(n)["name"]: n for n in snap.nodes}
    use: dict[tuple[str, int], list[_Use]] = defaultdict(list)
    for pod in snap.live_pods():
        node = _node_of(pod)
        if node is None:
            continue
        key = pod_key(pod)
        try:
            req = pod_request(pod)
        except PodRequestError as exc:
            out.problems.append(f"pod {key}: unreadable request: {exc}")
            continue
        if not req.num_gpus:
            continue
        out.checked["bound GPU pods"] += 1
        if node not in nodes:
            out.problems.append(f"pod {key} is bound to {node}, which does not exist")
            continue
        if (pod.get("spec") or {}).get("schedulerName") != SCHEDULER_NAME:
            for index in range(req.num_gpus):
                use[(node, index)].append(_Use(key, PERCENT, 0, whole=True))
            continue
        for index, item in _assigned(pod, key, node, req, out):
            use[(node, index)].append(item)
    for (node, index), held in sorted(use.items()):
        out.checked["GPUs in use"] += 1
        out.problems.extend(_gpu_problems(node, index, held, nodes[node]))
    return out


def _assigned(
    pod: Mapping[str, Any], key: str, node: str, req: PodRequest, out: Findings
) -> Iterable[tuple[int, _Use]]:
    """The GPUs a bound pod's assignment gives it; problems with the assignment go to `out`."""
    try:
        a = GpuAssignment.from_annotations(_meta(pod).get("annotations") or {})
    except ValueError as exc:
        out.problems.append(f"pod {key} is bound to {node} without a readable assignment: {exc}")
        return []
    if a.node != node:
        out.problems.append(f"pod {key} is bound to {node} but its assignment names {a.node}")
    if req.is_share != a.shared or len(a.gpu_indices) != req.num_gpus:
        out.problems.append(
            f"pod {key} asked for {req.describe_gpus()} and was assigned "
            f"{'a share of' if a.shared else 'whole'} GPU(s) {list(a.gpu_indices)}"
        )
    if a.shared:
        item = _Use(key, a.compute_percent or PERCENT, a.memory_mib or 0, whole=False)
    else:
        item = _Use(key, PERCENT, 0, whole=True)
    return [(i, item) for i in a.gpu_indices]


def _gpu_problems(
    node: str, index: int, held: list[_Use], node_obj: Mapping[str, Any]
) -> list[str]:
    where = f"GPU {node}/{index}"
    capacity = (node_obj.get("status") or {}).get("capacity") or {}
    count = int(capacity.get(GPU_RESOURCE, 0) or 0)
    memory = str((_meta(node_obj).get("labels") or {}).get(GPU_MEMORY_LABEL, "0"))
    holders = ", ".join(map(str, held))
    problems = []
    if not 0 <= index < count:
        problems.append(f"{where} does not exist (the node has {count}); held by {holders}")
    if any(u.whole for u in held) and len(held) > 1:
        problems.append(f"{where} is held whole and by others: {holders}")
    shares = [u for u in held if not u.whole]
    if sum(u.percent for u in shares) > PERCENT:
        problems.append(f"{where} has more than 100% of its compute given out: {holders}")
    if memory.isdigit() and sum(u.memory_mib for u in shares) > int(memory):
        problems.append(f"{where} has more than its {memory} MiB given out: {holders}")
    return problems


# ---------------------------------------------------------------------- gangs
def _gangs(snap: Snapshot) -> dict[str, list[dict[str, Any]]]:
    """Live, not terminating pods by gang (`namespace/label`)."""
    gangs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in snap.live_pods():
        name = (_meta(pod).get("labels") or {}).get(GANG_LABEL)
        if name and not _meta(pod).get("deletionTimestamp"):
            gangs[f"{_meta(pod).get('namespace')}/{name}"].append(pod)
    return gangs


def _gang_size(pods: list[dict[str, Any]]) -> int | None:
    """The size the pods of one gang declare; None when they disagree or it is not a number."""
    sizes = {(_meta(p).get("annotations") or {}).get(GANG_SIZE_ANNOTATION) for p in pods}
    size = next(iter(sizes)) if len(sizes) == 1 else None
    return int(size) if isinstance(size, str) and size.isdigit() else None


def gang_problems(snap: Snapshot) -> Findings:
    """No partially bound gang: each gang has all its members, all bound or none bound."""
    out = Findings()
    for gang, pods in sorted(_gangs(snap).items()):
        out.checked["gangs"] += 1
        size = _gang_size(pods)
        bound = sum(1 for p in pods if _node_of(p))
        if size is None:
            sizes = {(_meta(p).get("annotations") or {}).get(GANG_SIZE_ANNOTATION) for p in pods}
            out.problems.append(f"gang {gang}: no one size in {sorted(map(str, sizes))}")
        elif len(pods) != size:
            out.problems.append(f"gang {gang} has {len(pods)} live member(s), declares {size}")
        if 0 < bound < len(pods):
            out.problems.append(f"gang {gang} is partially bound: {bound} of {len(pods)} members")
    return out


# ---------------------------------------------------------------------- jobs
def job_problems(snap: Snapshot) -> Findings:
    """No duplicated job or worker: one live gang generation per job, each rank once.

    Per TrainingJob: its live workers (label `chronotope.dev/job`, not
    terminating) are of one gang generation, named `<job>-g<gen>-<rank>` with
    each rank 0..size-1 once, and owned by this job (its UID). A `Running` job
    has as many workers as its plan, all bound. Workers of a job that does not
    exist are reported as orphans.
    """
    out = Findings()
    jobs = {_key(j): j for j in snap.jobs}
    workers = _workers(snap)
    out.problems.extend(_orphans(jobs, workers))
    for key, job in sorted(jobs.items()):
        out.checked["TrainingJobs"] += 1
        pods = workers.get(key, [])
        out.checked["workers"] += len(pods)
        out.problems.extend(_workers_problems(key, job, pods))
    return out


def _workers(snap: Snapshot) -> dict[str, list[dict[str, Any]]]:
    """Live, not terminating TrainingJob workers by job (`namespace/name`)."""
    workers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in snap.live_pods():
        job = (_meta(pod).get("labels") or {}).get(JOB_LABEL)
        if job and not _meta(pod).get("deletionTimestamp"):
            workers[f"{_meta(pod).get('namespace')}/{job}"].append(pod)
    return workers


def _orphans(jobs: Collection[str], workers: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    return [
        f"{len(workers[key])} worker(s) of TrainingJob {key}, which is gone"
        for key in sorted(set(workers) - set(jobs))
    ]


def _workers_problems(key: str, job: Mapping[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    problems = []
    name, uid = _meta(job).get("name"), _meta(job).get("uid")
    generations = {(_meta(p).get("labels") or {}).get(GENERATION_LABEL) for p in pods}
    if len(generations) > 1:
        problems.append(
            f"TrainingJob {key} has live workers of generations {sorted(map(str, generations))}"
        )
    ranks: Counter[str] = Counter()
    for pod in pods:
        meta = _meta(pod)
        gen = (meta.get("labels") or {}).get(GENERATION_LABEL)
        prefix = f"{name}-g{gen}-"
        pod_name = str(meta.get("name", ""))
        if not pod_name.startswith(prefix) or not pod_name[len(prefix) :].isdigit():
            problems.append(f"TrainingJob {key}: worker {pod_name} is not named {prefix}<rank>")
        ranks[pod_name] += 1
        owners = [o.get("uid") for o in meta.get("ownerReferences") or []]
        if uid not in owners:
            problems.append(f"TrainingJob {key}: worker {pod_name} is not owned by it")
    want = _gang_size(pods)
    if want is not None and len(pods) > want:
        problems.append(f"TrainingJob {key} has {len(pods)} live workers for a gang of {want}")
    status = job.get("status") or {}
    if status.get("phase") == "Running":
        planned = (status.get("plan") or {}).get("workers")
        bound = sum(1 for p in pods if _node_of(p))
        if planned != len(pods) or bound != len(pods):
            problems.append(
                f"TrainingJob {key} is Running with {bound} of {len(pods)} workers bound, "
                f"plan {planned}"
            )
    return problems


def lost_objects(
    snap: Snapshot, pods: Iterable[str], jobs: Iterable[str], deleted: Iterable[str] = ()
) -> Findings:
    """No lost object: every pod and TrainingJob created and not deleted still exists.

    `pods` and `jobs` are `namespace/name` keys of what the API server accepted
    and nobody deleted; `deleted` those of pods and jobs that were deleted, which
    must be gone. Pods of a TrainingJob are the operator's (`job_problems`).
    """
    out = Findings()
    have_pods = {pod_key(p) for p in snap.pods}
    have_jobs = {_key(j) for j in snap.jobs}
    for kind, wanted, have in (("pod", pods, have_pods), ("TrainingJob", jobs, have_jobs)):
        for key in sorted(wanted):
            out.checked[f"{kind}s kept"] += 1
            if key not in have:
                out.problems.append(f"{kind} {key} was accepted and is gone")
    for key in sorted(deleted):
        out.checked["objects deleted"] += 1
        if key in have_pods or key in have_jobs:
            out.problems.append(f"{key} was deleted and is still there")
    return out


# ---------------------------------------------------------------------- settling
def settle_problems(snap: Snapshot) -> list[str]:
    """What still moves: empty once the cluster has settled.

    Terminating pods; TrainingJobs not in a settled phase, or waiting without
    a reason; workers of deleted jobs not yet collected; gangs (a job's workers
    are one) partially bound or with members missing; and pending pods, or the
    pending members of a gang together, that a cache rebuilt from this snapshot
    could place now.
    """
    problems = [
        f"pod {pod_key(p)} is terminating" for p in snap.pods if _meta(p).get("deletionTimestamp")
    ]
    for job in snap.jobs:
        status = job.get("status") or {}
        phase = status.get("phase")
        if phase not in SETTLED_PHASES:
            problems.append(f"TrainingJob {_key(job)} is {phase or 'without a phase'}")
        elif phase in ("Waiting", "Pending") and not status.get("whyWaiting"):
            problems.append(f"TrainingJob {_key(job)} is {phase} without a reason")
    problems += _orphans({_key(j) for j in snap.jobs}, _workers(snap))
    problems += gang_problems(snap).problems
    return problems + _placeable(snap)


def _placeable(snap: Snapshot) -> list[str]:
    """Pending pods and wholly pending gangs that a cache rebuilt from `snap` places now."""
    cache = ClusterCache()
    for node_obj in snap.nodes:
        cache.upsert_node(node_info(node_obj))
    pending: dict[str, list[tuple[str, PodRequest]]] = defaultdict(list)
    for pod in snap.live_pods():
        key, bound_to = pod_key(pod), _node_of(pod)
        if bound_to is not None:
            cache.record_bound(key, pod_holding(cache, key, pod, bound_to))
            continue
        try:
            req = pod_request(pod)
        except PodRequestError:
            continue
        gang = (_meta(pod).get("labels") or {}).get(GANG_LABEL)
        pending[f"gang {_meta(pod).get('namespace')}/{gang}" if gang else f"pod {key}"].append(
            (key, req)
        )
    out = []
    for what, members in sorted(pending.items()):
        placed = []
        for key, req in members:
            node = next((n for n in cache.nodes if isinstance(cache.fit(n, req), tuple)), None)
            if node is None or not isinstance(cache.assume(key, node, req, 0.0), tuple):
                break
            placed.append(key)
        if len(placed) == len(members):
            out.append(f"{what} is pending but fits now")
        for key in placed:
            cache.forget(key)
    return out
