"""DeltaZip-style planning of a serving group: base replicas, delta residency, routes (pure).

A serving group is the variants of one base model that share base-model
replicas; every replica holds the base, a KV cache and up to `slots`
compressed deltas, and batches requests for different variants together.
`plan_group` answers, for one group:

- which GPU type and how many replicas: the type that needs the fewest GPUs
  for the group's traffic at the planned utilisation (ties: the faster type),
  among the types the cluster has and the base fits; first among those whose
  GPUs free now hold it within its queue's quota now (`GroupInput.fits_now`),
  so its pods do not wait for GPUs other work holds while others idle, and the
  `why` says so;
- which deltas are resident on which replica: variants in order of need
  (those whose TTFT SLO cannot absorb a swap from host first, then by load),
  each on as many replicas as its load needs, hot variants (more than
  `hot_share` of one replica) on at least two, each copy on the least-loaded
  replica with a free slot (the previous plan's holders first unless they
  would go over capacity well above the least loaded, so a re-plan moves as
  few deltas as it can); a group
  with a hot variant has at least two replicas;
- which of the rest stay in host memory (by load, while the host budget
  lasts) and which on disk; their requests go to whichever replica has room
  (a delta loaded per request gains nothing from affinity), and each has a
  home replica that keeps it warm in a spare slot when it can;
- a route per variant: its replicas and their weights (shares of its load).

Every placement says why, e.g. "resident on replica 2 of 3: 12.0 QPS
expected, swap from host would cost 140 ms". The same plan drives the
operator (placement ConfigMap, status) and the simulator's `chronotope`
policy (`sim.serving`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from chronotope.planners.llmcost import CostModel, GpuPerf, ModelShape, Tier, Tiers
from chronotope.solver.model import Reason

__all__ = [
    "GroupInput",
    "GroupPlan",
    "NowFit",
    "Placement",
    "PlanSettings",
    "ReplicaPlan",
    "RequestShape",
    "VariantDemand",
    "capacity_qps",
    "plan_group",
]


STICKY_SLACK = 0.25
"""A previous holder over capacity keeps a delta only while this close to the least loaded."""


@dataclass(frozen=True)
class VariantDemand:
    """One variant: its delta size, expected rate, TTFT SLO and minimum resident replicas."""

    name: str
    delta_mib: int
    qps: float
    ttft_slo_ms: float
    min_replicas: int = 1


@dataclass(frozen=True)
class RequestShape:
    """The mean request: prompt and output tokens, and the time-per-output-token SLO.

    Defaults are the means of the Azure LLM conversation trace (2023-11-16):
    1155 prompt and 211 output tokens.
    """

    prompt_tokens: float = 1155.0
    output_tokens: float = 211.0
    tpot_slo_ms: float = 150.0


@dataclass(frozen=True)
class PlanSettings:
    """Planning knobs: utilisation target, hot threshold, batch and slot limits."""

    utilization: float = 0.7
    """Planned load per replica; the rest absorbs bursts."""
    hot_share: float = 0.25
    """A variant with more load than this share of one replica is replicated."""
    max_batch: int = 256
    max_slots: int = 16
    """Deltas resident per replica at most."""
    max_deltas: int = 8
    """Distinct deltas in one batch at most (DeltaZip's limit)."""


@dataclass(frozen=True)
class ReplicaPlan:
    """One base replica: resident deltas, host-tier deltas it keeps warm, planned load."""

    index: int
    resident: tuple[str, ...]
    loads: tuple[str, ...]
    utilization: float


@dataclass(frozen=True)
class Placement:
    """Where a variant is served: replicas with weights, residency, swap cost and why."""

    variant: str
    replicas: tuple[int, ...]
    weights: tuple[float, ...]
    residency: Tier
    swap_ms: float
    """Time to bring the delta to the GPU from its tier (0 when resident)."""
    why: str


@dataclass(frozen=True)
class GroupPlan:
    """A serving group's plan; `rejected` holds variants that cannot be served, with why."""

    group: str
    gpu_type: str
    replicas: tuple[ReplicaPlan, ...]
    placements: dict[str, Placement]
    slots: int
    capacity_qps: float
    """Requests per second one replica sustains at the planned utilisation."""
    rejected: dict[str, Reason] = field(default_factory=dict)
    why: str = ""
    on_free: str = ""
    """What how the types stand now did to the plan (`GroupInput.fits_now`: moved it off a
    type other work holds, or its queue does not admit now; or nothing holds it now and
    its pods wait), in words; empty when nothing (also part of `why`)."""


NowFit: TypeAlias = tuple[int, str]
"""How n replicas on a GPU type stand now: (0, "") they may run at once; else a rank
(lower is nearer: 1, its queue admits them but other work holds the GPUs; 2, its queue
does not admit them now) and why, in words ("other work holds the GPUs")."""


@dataclass(frozen=True)
class GroupInput:
    """What `plan_group` needs; `replicas`/`gpu_type` fix them (the simulator's fixed fleet)."""

    group: str
    shape: ModelShape
    variants: tuple[VariantDemand, ...]
    gpus: Mapping[str, tuple[GpuPerf, int]]
    """GPU types the group may use: performance and how many GPUs there are."""
    request: RequestShape = field(default_factory=RequestShape)
    tiers: Tiers = field(default_factory=Tiers)
    settings: PlanSettings = field(default_factory=PlanSettings)
    replicas: int | None = None
    previous: GroupPlan | None = None
    fits_now: Callable[[str, int], NowFit] | None = None
    """How that many replicas on a GPU type stand now (None: not known; all hold)."""


def _batch(cost: CostModel, request: RequestShape, slots_mib: float, max_batch: int) -> int:
    """The largest steady batch whose KV fits and whose decode step meets the TPOT SLO."""
    per_seq = request.prompt_tokens + request.output_tokens
    batch = min(max_batch, int(cost.kv_tokens(slots_mib) // max(per_seq, 1.0)))
    while batch > 1:
        step = cost.iteration_s(
            request.prompt_tokens,
            batch,
            batch * (request.prompt_tokens + request.output_tokens / 2),
            slots_mib,
            1,
        )
        if step * 1000 <= request.tpot_slo_ms:
            break
        batch -= max(1, batch // 8)
    return max(batch, 0)


def capacity_qps(
    cost: CostModel,
    request: RequestShape,
    *,
    delta_mib: float,
    distinct: int,
    slots_mib: float,
    max_batch: int = 256,
) -> float:
    """Requests per second one replica completes at its largest steady batch (fully busy).

    Decode: a batch of b sequences each needing `output` steps completes
    b / (output * step) per second; prefill takes the GPU for its own
    iteration per request, so the rate is that over 1 + prefill * that.
    """
    batch = _batch(cost, request, slots_mib, max_batch)
    if batch < 1:
        return 0.0
    kv = batch * (request.prompt_tokens + request.output_tokens / 2)
    step = cost.iteration_s(0, batch, kv, delta_mib * distinct, distinct)
    prefill = cost.iteration_s(request.prompt_tokens, 0, 0, delta_mib, 1)
    decode_rate = batch / (request.output_tokens * step)
    return decode_rate / (1 + prefill * decode_rate)


@dataclass
class _Option:
    gpu: GpuPerf
    cost: CostModel
    slots: int
    capacity: float
    replicas: int
    available: int


def _option(inp: GroupInput, gpu: GpuPerf, available: int, need_qps: float) -> _Option | str:
    """How this GPU type would serve the group, or why it cannot."""
    cost = CostModel(gpu, inp.shape, inp.tiers)
    st, req = inp.settings, inp.request
    largest = max(v.delta_mib for v in inp.variants)
    one_seq = req.prompt_tokens + req.output_tokens
    if cost.kv_tokens(largest) < one_seq:
        return (
            f"{gpu.name} ({gpu.memory_mib} MiB) cannot hold the base ({inp.shape.weight_mib} MiB),"
            f" one delta ({largest} MiB) and one request's KV cache"
        )
    # slots: as many deltas as are worth keeping, while a batch of 16 still fits beside them
    slots = min(st.max_slots, len(inp.variants))
    while slots > 1 and cost.kv_tokens(slots * largest) < 16 * one_seq:
        slots -= 1
    distinct = min(st.max_deltas, slots)
    cap = capacity_qps(
        cost,
        req,
        delta_mib=largest,
        distinct=distinct,
        slots_mib=slots * largest,
        max_batch=st.max_batch,
    )
    if cap <= 0:
        return f"{gpu.name}: no batch meets the {req.tpot_slo_ms:g} ms per-token SLO"
    planned = cap * st.utilization
    if inp.replicas is not None:
        replicas = inp.replicas
    else:
        replicas = max(1, math.ceil(need_qps / planned), *(v.min_replicas for v in inp.variants))
        if any(v.qps / planned > st.hot_share for v in inp.variants):
            replicas = max(replicas, 2)  # a hot variant is never on a single replica
    return _Option(gpu, cost, slots, planned, replicas, available)


def plan_group(inp: GroupInput) -> GroupPlan | Reason:
    """Plan one serving group (see the module docstring), or say why it cannot be served."""
    if not inp.variants:
        return Reason(code="NoVariants", message=f"serving group {inp.group} has no variants")
    need = sum(v.qps for v in inp.variants)
    options: list[_Option] = []
    why_not: list[str] = []
    for _, (gpu, count) in sorted(inp.gpus.items()):
        if count <= 0 and inp.replicas is None:
            why_not.append(f"{gpu.name}: no GPUs of this type")
            continue
        opt = _option(inp, gpu, count, need)
        if isinstance(opt, str):
            why_not.append(opt)
        elif inp.replicas is None and opt.replicas > count:
            why_not.append(
                f"{gpu.name}: needs {opt.replicas} replicas for {need:.1f} QPS, {count} GPUs exist"
            )
            options.append(opt)
        else:
            options.append(opt)
    if not options:
        detail = "; ".join(why_not) or "the cluster has no GPU type with a performance profile"
        return Reason(
            code="NoGpuFits",
            message=f"serving group {inp.group}: no GPU type can serve the base: {detail}",
            unresolvable=True,
        )
    # fewest GPUs among types with enough of them; else the type that covers the most load
    fitting = [o for o in options if o.replicas <= o.available or inp.replicas is not None]
    if fitting:
        now = inp.fits_now if inp.replicas is None else None
        stand = {id(o): now(o.gpu.name, o.replicas) if now else (0, "") for o in fitting}
        best = min(fitting, key=lambda o: (stand[id(o)][0], _fewest(o)))
        first = min(fitting, key=_fewest)
        on_free = _on_free(best, stand[id(best)], first, stand[id(first)])
        return _place(inp, best, f"; {on_free}" if on_free else "", on_free)
    best = max(options, key=lambda o: (o.available * o.capacity, o.gpu.name))
    short = f"; needs {best.replicas} replicas of {best.gpu.name}, only {best.available} exist"
    best.replicas = best.available
    return _place(inp, best, short)


def _fewest(o: _Option) -> tuple[int, float, str]:
    """The order types are chosen in: fewest replicas, then the faster, then by name."""
    return (o.replicas, -o.capacity, o.gpu.name)


def _on_free(best: _Option, stands: NowFit, first: _Option, first_stands: NowFit) -> str:
    """What standing now did to the plan (`GroupPlan.on_free`), or "".

    `best` was taken, `first` needs the fewest GPUs; each with how it stands now.
    """
    if stands[0] > 0:
        return f"nothing holds it now ({best.gpu.name}: {stands[1]}): its pods wait"
    if best is not first:
        return (
            f"on the GPUs free now ({first.replicas} x {first.gpu.name} would serve it, "
            f"but {first_stands[1]})"
        )
    return ""


@dataclass
class _Layout:
    """The placement under construction: deltas held, warm and load per replica."""

    n: int
    slots: int
    held: list[list[str]]
    warm: list[list[str]]
    util: list[float]
    placements: dict[str, Placement] = field(default_factory=dict)


def _rejections(inp: GroupInput, opt: _Option, prefill_ms: float) -> dict[str, Reason]:
    req = inp.request
    return {
        v.name: Reason(
            code="SloUnmeetable",
            message=f"the {v.ttft_slo_ms:g} ms TTFT SLO is below the prefill time of a "
            f"{req.prompt_tokens:.0f}-token prompt on {opt.gpu.name} ({prefill_ms:.0f} ms)",
            unresolvable=True,
        )
        for v in inp.variants
        if v.ttft_slo_ms < prefill_ms
    }


def _place(inp: GroupInput, opt: _Option, short: str, on_free: str = "") -> GroupPlan:
    st, cost, n = inp.settings, opt.cost, opt.replicas
    prefill_ms = cost.iteration_s(inp.request.prompt_tokens, 0, 0, 0, 1) * 1000
    rejected = _rejections(inp, opt, prefill_ms)
    live = [v for v in inp.variants if v.name not in rejected]
    load = {v.name: v.qps / opt.capacity if opt.capacity else 0.0 for v in live}
    host_ms = {v.name: cost.load_s(v.delta_mib, Tier.HOST) * 1000 for v in live}

    def urgent(v: VariantDemand) -> bool:
        return v.ttft_slo_ms < prefill_ms + host_ms[v.name] * 2

    order = sorted(live, key=lambda v: (not urgent(v), -load[v.name], v.name))
    lay = _Layout(n, opt.slots, [[] for _ in range(n)], [[] for _ in range(n)], [0.0] * n)
    spill = [v for v in order if not _resident(inp, lay, v, load[v.name], host_ms[v.name])]
    _spill(inp, lay, spill, load, cost=cost, prefill_ms=prefill_ms)
    replicas = tuple(
        ReplicaPlan(
            i, tuple(lay.held[i]), tuple(lay.warm[i]), round(lay.util[i] * st.utilization, 4)
        )
        for i in range(n)
    )
    resident = sum(1 for p in lay.placements.values() if p.residency is Tier.GPU)
    why = (
        f"{n} x {opt.gpu.name} for {sum(v.qps for v in live):.1f} QPS "
        f"({opt.capacity:.1f} QPS per replica at {st.utilization:.0%} load), "
        f"{resident} of {len(live)} variants resident, {opt.slots} delta slots per replica{short}"
    )
    return GroupPlan(
        inp.group,
        opt.gpu.name,
        replicas,
        lay.placements,
        opt.slots,
        round(opt.capacity, 3),
        rejected,
        why,
        on_free,
    )


def _resident(inp: GroupInput, lay: _Layout, v: VariantDemand, load: float, host_ms: float) -> bool:
    """Give `v` its resident copies (previous holders first, then the least loaded)."""
    copies = max(v.min_replicas, math.ceil(load))
    if load > inp.settings.hot_share:
        copies = max(copies, 2)
    free = [i for i in range(lay.n) if len(lay.held[i]) < lay.slots]
    copies = min(copies, lay.n, len(free))
    if copies == 0:
        return False
    prev: set[int] = set()
    if inp.previous is not None and v.name in inp.previous.placements:
        p = inp.previous.placements[v.name]
        if p.residency is Tier.GPU:
            prev = set(p.replicas)
    share = load / copies
    least = min(lay.util[i] for i in free)

    def sticky(i: int) -> bool:
        # a previous holder keeps the delta (fewer moves) unless it would go over capacity
        # while being well above the least-loaded replica
        within = lay.util[i] + share <= 1.0 or lay.util[i] - least <= STICKY_SLACK
        return i in prev and within

    chosen = sorted(free, key=lambda i: (not sticky(i), lay.util[i], i))[:copies]
    for i in chosen:
        lay.held[i].append(v.name)
        lay.util[i] += share
    chosen.sort()
    lay.placements[v.name] = Placement(
        v.name,
        tuple(chosen),
        tuple(round(1 / copies, 4) for _ in chosen),
        Tier.GPU,
        0.0,
        _why_resident(chosen, lay.n, v.qps, host_ms),
    )
    return True


def _spill(
    inp: GroupInput,
    lay: _Layout,
    spill: Sequence[VariantDemand],
    load: Mapping[str, float],
    *,
    cost: CostModel,
    prefill_ms: float,
) -> None:
    """Host memory (by load, while the budget lasts) or disk, each warm on a home replica."""
    n = lay.n
    host_left = inp.tiers.host_mib
    prev_home = {
        v: r.index
        for r in (inp.previous.replicas if inp.previous else ())
        for v in r.loads
        if r.index < n
    }
    everywhere = tuple(range(n))
    for v in spill:
        tier = Tier.HOST if v.delta_mib <= host_left else Tier.DISK
        if tier is Tier.HOST:
            host_left -= v.delta_mib
        home = prev_home.get(v.name)
        if home is None:
            home = min(range(n), key=lambda i: (lay.util[i], i))
        lay.util[home] += load[v.name]
        lay.warm[home].append(v.name)
        swap_ms = cost.load_s(v.delta_mib, tier) * 1000
        why = (
            f"in {'host memory' if tier is Tier.HOST else 'on disk'}, loaded on demand by the "
            f"least-loaded of {n} replicas (kept warm on replica {home + 1}): {v.qps:.2f} QPS "
            f"expected, swap would cost {swap_ms:.0f} ms"
        )
        if prefill_ms + swap_ms > v.ttft_slo_ms:
            why += f" (over its {v.ttft_slo_ms:g} ms TTFT SLO; no free GPU slot)"
        lay.placements[v.name] = Placement(
            v.name,
            everywhere,
            tuple(round(1 / n, 4) for _ in everywhere),
            tier,
            round(swap_ms, 1),
            why,
        )


def _why_resident(chosen: Sequence[int], n: int, qps: float, host_ms: float) -> str:
    where = ", ".join(str(i + 1) for i in chosen)
    noun = "replica" if len(chosen) == 1 else "replicas"
    return (
        f"resident on {noun} {where} of {n}: {qps:.1f} QPS expected, "
        f"swap from host would cost {host_ms:.0f} ms"
    )
