"""ModelVariants into serving groups and planner input (pure).

A serving group is the variants of one base model that share its replicas
(`spec.servingGroup`, or one group per base model when omitted). This module
turns a namespace's ModelVariant objects into groups, sets aside the
variants that cannot be served (each with a reason of its own, never
holding the others back), and builds the variant planner's input
(`planners.variants.GroupInput`) from a group, the nodes and the live rates.

Bad input is per variant:

- a spec the models reject (InvalidSpec), or a delta not smaller than its
  base (DeltaTooLarge; the CRD's CEL rejects it, objects admitted before
  that rule still reach us);
- two variants of one group that name different bases: the base most of
  them name is served (ties: the oldest variant's), the others get
  BaseMismatch.

A replica's GPUs are the largest request of its variants: whole GPUs when
any variant asks for them or names none (a whole GPU holds any share), else
one share with the largest memory and compute any variant asks for. The group
is planned on the GPU types its queue could ever hold a replica on, and first
on those whose free GPUs hold it within what its queue admits now (`fit_now`,
on `free_serving_gpus`: the one cluster model, and the extender's decision for
shares), as an InferencePipeline is.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from chronotope.api.v1alpha1.common import GpuRequest, GpuShare, SharePriority, WorkloadProfile
from chronotope.api.v1alpha1.modelvariant import BaseModelRef, ModelVariantSpec
from chronotope.planners.llmcost import GpuPerf, ModelShape, gpu_perf
from chronotope.planners.variants import GroupInput, GroupPlan, NowFit, VariantDemand
from chronotope.sharing.labels import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, GPU_RESOURCE
from chronotope.solver.cache import ClusterCache, NodeInfo
from chronotope.solver.model import MILLI, Reason
from chronotope.solver.online import PlacementRules
from chronotope.workloads.capacity import FreeGpus, SharePlacer, admitting, cluster_model
from chronotope.workloads.cluster_feed import node_schedulable
from chronotope.workloads.node_fit import NodeRules, node_taints
from chronotope.workloads.podreq import gpu_resources, pod_request, replica_pod
from chronotope.workloads.queue_room import QueueRoom

__all__ = [
    "Grouping",
    "Member",
    "ServingGroup",
    "fit_now",
    "free_serving_gpus",
    "free_summary",
    "gpu_pool",
    "group_input",
    "group_name",
    "group_variants",
    "replica_request",
    "shares_per_gpu",
    "usable_gpu_nodes",
]

_MAX_LABEL = 63
_WHOLE = 100


@dataclass(frozen=True)
class Member:
    """One ModelVariant object, validated: what the group pass needs of it."""

    name: str
    uid: str | None
    generation: int | None
    created: str
    spec: ModelVariantSpec


@dataclass(frozen=True)
class ServingGroup:
    """The variants served together on one base's replicas."""

    name: str
    base: BaseModelRef
    members: tuple[Member, ...]
    """The variants served (those that agree on the base), by name."""
    owners: tuple[Member, ...]
    """Every variant that names this group, served or not: the group's objects' owners."""


@dataclass(frozen=True)
class Grouping:
    """A namespace's variants in groups, and the ones that cannot be served, with why."""

    groups: dict[str, ServingGroup]
    failed: dict[str, Reason]
    group_of: dict[str, str]
    """Variant name -> the group it names (every variant whose spec validates)."""


def group_name(spec: ModelVariantSpec) -> str:
    """`spec.servingGroup`, or a DNS label derived from the base model's name.

    e.g. meta-llama/Llama-2-7b-hf -> meta-llama-llama-2-7b-hf; a name that
    would be longer than 63 characters keeps a hash of the whole.
    """
    if spec.serving_group:
        return spec.serving_group
    name = re.sub(r"[^a-z0-9]+", "-", spec.base.name.lower()).strip("-") or "base"
    if not name[0].isalpha():
        name = f"m-{name}"
    if len(name) > _MAX_LABEL:
        digest = hashlib.sha1(spec.base.name.encode()).hexdigest()[:8]
        name = f"{name[: _MAX_LABEL - 9].rstrip('-')}-{digest}"
    return name


def _member(obj: Mapping[str, Any]) -> Member | Reason:
    meta = obj.get("metadata") or {}
    raw = obj.get("spec") or {}
    try:
        spec = ModelVariantSpec.model_validate(raw)
    except ValidationError as exc:
        return _invalid(raw, exc)
    if spec.delta.compressed_size_mib >= spec.base.size_mib:  # the same rule, defensively
        return _too_large(spec.delta.compressed_size_mib, spec.base.size_mib)
    return Member(
        name=str(meta.get("name")),
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        created=str(meta.get("creationTimestamp") or ""),
        spec=spec,
    )


def _too_large(delta: Any, base: Any) -> Reason:
    return Reason(
        code="DeltaTooLarge",
        message=f"the delta ({delta} MiB) is not smaller than its base ({base} MiB): "
        "serve it as a model of its own",
        unresolvable=True,
    )


def _invalid(raw: Mapping[str, Any], exc: ValidationError) -> Reason:
    base = (raw.get("base") or {}).get("sizeMiB")
    delta = (raw.get("delta") or {}).get("compressedSizeMiB")
    if isinstance(base, int) and isinstance(delta, int) and delta >= base:
        return _too_large(delta, base)
    first = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in exc.errors()[:3]
    )
    return Reason(code="InvalidSpec", message=f"invalid spec: {first}", unresolvable=True)


def _base_key(base: BaseModelRef) -> tuple[str, int]:
    return (base.name, base.size_mib)


def group_variants(objs: Sequence[Mapping[str, Any]]) -> Grouping:
    """Group one namespace's ModelVariant objects; see the module docstring.

    Objects being deleted are left out (their group is re-planned without them).
    """
    by_group: dict[str, list[Member]] = {}
    failed: dict[str, Reason] = {}
    group_of: dict[str, str] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        member = _member(obj)
        if isinstance(member, Reason):
            failed[str(meta.get("name"))] = member
            continue
        group = group_name(member.spec)
        group_of[member.name] = group
        by_group.setdefault(group, []).append(member)
    groups: dict[str, ServingGroup] = {}
    for group, members in sorted(by_group.items()):
        members.sort(key=lambda m: m.name)
        votes = Counter(_base_key(m.spec.base) for m in members)
        oldest: dict[tuple[str, int], Member] = {}
        for m in sorted(members, key=lambda m: (m.created, m.name)):
            oldest.setdefault(_base_key(m.spec.base), m)
        key = max(votes, key=lambda k: (votes[k], -_rank(oldest[k], members)))
        base = oldest[key].spec.base
        served = tuple(m for m in members if _base_key(m.spec.base) == key)
        for m in members:
            if _base_key(m.spec.base) != key:
                failed[m.name] = Reason(
                    code="BaseMismatch",
                    message=f"serving group {group} serves base {base.name} ({base.size_mib} MiB),"
                    f" as {votes[key]} of its {len(members)} variants say; this variant names "
                    f"{m.spec.base.name} ({m.spec.base.size_mib} MiB): fix spec.base or "
                    "set another spec.servingGroup",
                    unresolvable=True,
                )
        groups[group] = ServingGroup(group, base, served, tuple(members))
    return Grouping(groups, failed, group_of)


def _rank(member: Member, members: Sequence[Member]) -> int:
    """Age rank: 0 for the oldest variant of the group."""
    ordered = sorted(members, key=lambda m: (m.created, m.name))
    return ordered.index(member)


def replica_request(members: Sequence[Member]) -> GpuRequest:
    """What one replica of the group asks for: the largest of its variants' requests."""
    counts = [m.spec.gpu.count for m in members if m.spec.gpu is not None and m.spec.gpu.count]
    whole = any(m.spec.gpu is None for m in members) or counts
    if whole or not members:
        return GpuRequest(count=max(counts, default=1))
    shares = [m.spec.gpu.shared for m in members if m.spec.gpu is not None and m.spec.gpu.shared]
    profiles = {s.profile for s in shares}
    return GpuRequest(
        shared=GpuShare(
            memory_mib=max(s.memory_mib for s in shares),
            compute_percent=max(s.compute_percent for s in shares),
            priority=(
                SharePriority.HIGH
                if any(s.priority is SharePriority.HIGH for s in shares)
                else SharePriority.BEST_EFFORT
            ),
            profile=profiles.pop() if len(profiles) == 1 else WorkloadProfile.UNKNOWN,
        )
    )


_SERVING_PODS = {whole: NodeRules(whole_gpus=whole) for whole in (True, False)}
"""Serving pods state no nodeSelector, affinity or toleration (by whether they ask for whole
GPUs: only those get the `nvidia.com/gpu` toleration from the API server's plugin)."""


def usable_gpu_nodes(
    nodes: Sequence[Mapping[str, Any]], *, whole_gpus: bool = True
) -> list[tuple[str, int, int | None]]:
    """(GPU product, GPUs, memory MiB if labelled) of every GPU node serving pods may use.

    Schedulable (`cluster_feed.node_schedulable`), and no taint the pods do not
    tolerate (`node_fit`): serving pods (a ModelVariant group's, an
    InferencePipeline stage's) carry no tolerations, so a tainted node is a
    dedicated one they may not use. The `nvidia.com/gpu` taint is tolerated by
    pods that ask for whole GPUs (`whole_gpus`; ExtendedResourceToleration adds the
    toleration to pods requesting that resource), not by pods asking for a share.
    """
    out = []
    rules = _SERVING_PODS[whole_gpus]
    for node in nodes:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        if not node_schedulable(node):
            continue
        if rules.refuses(str(meta.get("name")), {}, node_taints(node)) is not None:
            continue
        labels = meta.get("labels") or {}
        product = labels.get(GPU_PRODUCT_LABEL)
        try:
            gpus = int(str((status.get("capacity") or {}).get(GPU_RESOURCE) or 0))
            memory = int(labels[GPU_MEMORY_LABEL]) if GPU_MEMORY_LABEL in labels else None
        except ValueError:
            continue
        if product and gpus > 0:
            out.append((str(product), gpus, memory))
    return out


def free_serving_gpus(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    own: frozenset[str] = frozenset(),
    rules: PlacementRules | None = None,
) -> dict[str, FreeGpus]:
    """Per GPU type, the GPUs serving pods may take now on the schedulable nodes they may use.

    On the one cluster model (`capacity.cluster_model`: bound pods hold their GPUs,
    a TrainingJob gang planned but not yet bound holds what its plan names), with the
    GPUs of the `own` pods ("ns/name": the workload's own) counted as free, and the
    nodes `usable_gpu_nodes` keeps (no taint the pods do not tolerate; GPU-share pods
    do not tolerate `nvidia.com/gpu`): each node's free whole GPUs, and each GPU's
    room for shares (untouched, or in part used by shares), with a `SharePlacer` that
    places shares there as the extender does (`rules`: its policy and co-location
    rules; default the extender's defaults).
    """
    rules = rules or PlacementRules()
    capacity, cache = cluster_model(nodes, pods, own, rules)
    out: dict[str, FreeGpus] = {}
    for gpu_type in sorted({n.gpu_model for n in capacity}):
        whole = [
            n for n in admitting(capacity, gpu_type, _SERVING_PODS[True]).nodes if n.schedulable
        ]
        shared = [
            n for n in admitting(capacity, gpu_type, _SERVING_PODS[False]).nodes if n.schedulable
        ]
        rooms = [room for n in shared for room in (*n.partial, *([(MILLI, n.memory_mib)] * n.free))]
        placer = SharePlacer(
            cache,
            rules.policy,
            tuple(n.name for n in shared),
            tuple((n.name, n.free) for n in whole),
        )
        out[gpu_type] = FreeGpus(
            tuple(sorted((n.free for n in whole), reverse=True)), tuple(sorted(rooms)), placer
        )
    return out


def gpu_pool(
    nodes: Sequence[Mapping[str, Any]],
    request: GpuRequest,
    rules: PlacementRules | None = None,
) -> dict[str, tuple[GpuPerf, int]]:
    """GPU types the group can use: one replica's performance and how many replicas fit.

    Whole GPUs: k GPUs per replica act as one k-times larger GPU (tensor
    parallel), and a node holds floor(GPUs / k) replicas. A share: the GPU's
    memory capped at the share's, compute and bandwidth scaled by its
    percentage, and as many shares per GPU as the extender puts on one
    (`shares_per_gpu`: compute, memory and its co-location rules, `rules`).
    Types without a performance profile (`planners.llmcost.GPUS`) are left out.
    """
    rules = rules or PlacementRules()
    pool: dict[str, tuple[GpuPerf, int]] = {}
    for product, gpus, memory in usable_gpu_nodes(nodes, whole_gpus=request.shared is None):
        perf = gpu_perf(product, memory)
        if perf is None:
            continue
        if request.shared is not None:
            share = request.shared
            per_gpu = shares_per_gpu(share, perf.memory_mib, rules)
            scale = share.compute_percent / _WHOLE
            one = GpuPerf(
                perf.name,
                min(perf.memory_mib, share.memory_mib),
                perf.tflops * scale,
                perf.hbm_gbps * scale,
                perf.host_link_gbps,
            )
            fits = gpus * per_gpu
        else:
            k = request.count or 1
            one = GpuPerf(
                perf.name,
                perf.memory_mib * k,
                perf.tflops * k,
                perf.hbm_gbps * k,
                perf.host_link_gbps,
            )
            fits = gpus // k
        if fits <= 0:
            continue
        known = pool.get(product)
        pool[product] = (one, fits + (known[1] if known else 0))
    return pool


_PER_GPU: dict[tuple[Any, ...], int] = {}
"""`shares_per_gpu`'s answers by share, GPU memory and rules (few distinct ones)."""


def shares_per_gpu(share: GpuShare, memory_mib: int, rules: PlacementRules) -> int:
    """How many pods asking `share` one untouched GPU of `memory_mib` takes.

    As the extender places them: its own decision (`ClusterCache.trial`: its policy
    under its co-location rules) on a cluster of that one GPU. Compute, device memory,
    and for shares that state a priority the rules (a High share joins others only
    within the interference budget).
    """
    colocation = rules.colocation
    key = (
        share.compute_percent,
        share.memory_mib,
        share.priority,
        share.profile,
        memory_mib,
        rules.policy.name,
        colocation.budget,
        colocation.runtime,
    )
    known = _PER_GPU.get(key)
    if known is not None:
        return known
    cache = ClusterCache(colocation=colocation)
    cache.upsert_node(NodeInfo("gpu", gpu_model="gpu", gpu_count=1, gpu_memory_mib=memory_mib))
    one = pod_request(replica_pod(*gpu_resources(share, 1)))
    placed, _ = cache.trial([one] * (_WHOLE // share.compute_percent), ["gpu"], rules.policy)
    out = sum(d is not None for d in placed)
    _PER_GPU[key] = out
    return out


def fit_now(
    request: GpuRequest, free: Mapping[str, FreeGpus], room: QueueRoom | None = None
) -> Callable[[str, int], NowFit]:
    """How that many replicas asking `request` on a GPU type stand now (`planners.variants`).

    Its queue's quota (`room`, what the group's queue admits now; None: no quota)
    admits them, and the GPUs `free` now (per type) hold them: whole GPUs, k per
    replica on one node (a node holds floor(free / k)); a share, placed as the
    extender places them (`FreeGpus.after_shares`), every one found a GPU.
    """
    limits, annotations = gpu_resources(request.shared, request.count or 1)
    one = pod_request(replica_pod(limits, annotations)) if request.shared is not None else None
    k = request.count or 1

    def stands(gpu_type: str, replicas: int) -> NowFit:
        if room is not None:
            held = room.pod_quota(gpu_type, limits, annotations)
            if held is not None and room.excess({held[0]: held[1] * replicas}) > 0:
                return 2, f"queue {room.queue}'s quota does not admit them now"
        room_now = free.get(gpu_type)
        if room_now is None:
            return 1, "other work holds the GPUs"
        if one is not None:
            fits = room_now.after_shares([one] * replicas)[0] == 0
        else:
            fits = sum(f // k for f in room_now.whole) >= replicas
        return (0, "") if fits else (1, "other work holds the GPUs")

    return stands


def free_summary(request: GpuRequest, free: Mapping[str, FreeGpus]) -> list[Any]:
    """What of the GPUs `free` now `fit_now` reads for `request`, per type (a fingerprint).

    Whole GPUs: the k-GPU replicas each type's nodes hold; a share: each GPU's room.
    """
    if request.shared is not None:
        return sorted([t, list(f.shares)] for t, f in free.items())
    k = request.count or 1
    return sorted([t, sum(n // k for n in f.whole)] for t, f in free.items())


def group_input(
    group: ServingGroup,
    nodes: Sequence[Mapping[str, Any]],
    rates: Mapping[str, float],
    previous: GroupPlan | None,
    rules: PlacementRules | None = None,
    *,
    free: Mapping[str, FreeGpus] | None = None,
    room: QueueRoom | None = None,
) -> GroupInput:
    """The planner's input: the group's variants at their live rate (else expectedQPS).

    `rules`: how the extender places pods (its shares per GPU; `gpu_pool`). `free`:
    the GPUs free now per type (`free_serving_gpus`, the group's pods' counted free);
    `room`: what its queue could ever hold, and admits now. The planner takes a type
    both hold first (`fit_now`); types the queue could never hold a replica on are
    left out (unless that is every type: quota admission then says why it waits).
    """
    variants = tuple(
        VariantDemand(
            name=m.name,
            delta_mib=m.spec.delta.compressed_size_mib,
            qps=rates.get(m.name, m.spec.traffic.expected_qps),
            ttft_slo_ms=m.spec.slo.p99_latency_ms,
            min_replicas=m.spec.replicas or 1,
        )
        for m in group.members
    )
    request = replica_request(group.members)
    return GroupInput(
        group=group.name,
        shape=ModelShape.of(group.base.size_mib, group.base.parameters_billions),
        variants=variants,
        gpus=_within(gpu_pool(nodes, request, rules), request, room),
        previous=previous,
        fits_now=None if free is None else fit_now(request, free, room),
    )


def _within(
    pool: dict[str, tuple[GpuPerf, int]], request: GpuRequest, room: QueueRoom | None
) -> dict[str, tuple[GpuPerf, int]]:
    """The types of `pool` where `room` could ever admit a replica (all, if none could)."""
    if room is None:
        return pool
    limits, annotations = gpu_resources(request.shared, request.count or 1)
    kept = {t: v for t, v in pool.items() if room.holds(t, limits, annotations)}
    return kept or pool
