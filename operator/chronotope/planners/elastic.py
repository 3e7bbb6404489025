"""SAILOR-style elastic planner: pick GPUs and data/tensor/pipeline degrees for a job.

Given what is free now (GPU nodes with type, count, zone) and a model profile,
`plan_elastic` enumerates every homogeneous configuration (GPU type, TP degree
within a node, pipeline degree, data-parallel degree, microbatch), checks memory
per GPU stage by stage, predicts the iteration time and keeps the best by the
objective chosen per call (throughput, or throughput per dollar).

Iteration-time model (after SAILOR, SOSP'25)::

    t_s    = sum of fwd+bwd of stage s's layers (profiled at this microbatch, TP)
             + activation send/receive to the neighbouring stages
    T_pipe = sum_s t_s                    # fill and drain: one microbatch end to end
             + (m - 1) * max_s t_s        # the slowest stage paces the other m-1
    T_ar   = max_s 2 (dp-1)/dp * grad_bytes_s / bw_slowest_link
    T      = T_pipe + T_ar + max_s update_s

`m = global_batch / (dp * microbatch)` microbatches per iteration. Memory per
GPU of stage s is its weights+optimizer state (16 B/param / TP) plus the
activations of the microbatches in flight under 1F1B (min(pp - s, m)).

Pure: no I/O, no clock. Infeasible inputs give a `PlanResult` with
`plan=None` and reasons in plain words. Re-planning after a node is added,
removed or cordoned is calling `plan_elastic` again with the new availability;
because every configuration that fits in fewer GPUs still fits when more are
offered, the best predicted throughput never drops when GPUs are added.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from chronotope.planners.partition import partition_layers
from chronotope.planners.profile import BYTES_PER_PARAM_TRAINING, LayerTimes, ModelProfile
from chronotope.solver.model import Node

__all__ = [
    "DEFAULT_PRICES_PER_GPU_HOUR",
    "ElasticPlan",
    "Objective",
    "PlanResult",
    "PlannerSettings",
    "plan_elastic",
]

Objective = Literal["throughput", "throughput_per_dollar"]
GIB = 1024**3
MIB = 1024**2

# On-demand list prices (USD per GPU-hour, 2024 cloud ballpark); override per call.
DEFAULT_PRICES_PER_GPU_HOUR: dict[str, float] = {
    "A100-40": 3.67,
    "A100-80": 5.07,
    "V100-16": 2.48,
    "GH-96": 6.50,
    "Titan-RTX": 1.00,
    "RTX-2080": 0.60,
    "RTX-3090": 0.90,
}


@dataclass(frozen=True)
class _Offer:
    """What one node offers the job: its untouched GPUs and their memory."""

    name: str
    gpu_type: str
    gpus: int
    memory_bytes: int
    zone: str

    @classmethod
    def of(cls, node: Node) -> _Offer:
        memory = node.gpus[0].memory_mib * MIB if node.gpus else 0
        return cls(node.name, node.gpu_model, node.free_whole_gpus, memory, node.zone)


class PlannerSettings(BaseModel):
    """Link bandwidths (bytes/s), memory head-room and prices. Passed explicitly."""

    model_config = ConfigDict(frozen=True)

    intra_node_bw: float = Field(default=100e9, gt=0, description="NVLink/PCIe within a node")
    inter_node_bw: float = Field(default=12.5e9, gt=0, description="100 Gb/s between nodes")
    cross_zone_bw: float = Field(default=1.25e9, gt=0, description="10 Gb/s between zones")
    memory_overhead_bytes: int = Field(default=2 * GIB, ge=0, description="CUDA context etc.")
    prices_per_gpu_hour: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES_PER_GPU_HOUR)
    )
    max_pipeline_degree: int = Field(default=16, ge=1)


class ElasticPlan(BaseModel):
    """One chosen configuration and what the model predicts for it."""

    model_config = ConfigDict(frozen=True)

    gpu_type: str
    gpus: int
    dp: int
    tp: int
    pp: int
    microbatch: int
    num_microbatches: int
    stage_layers: tuple[int, ...] = Field(description="layers per pipeline stage")
    nodes: tuple[tuple[str, int], ...] = Field(description="(node, GPUs used)")
    link: Literal["intra-node", "inter-node", "cross-zone"]
    iteration_s: float
    throughput_samples_s: float
    samples_per_dollar: float
    memory_per_gpu_bytes: int = Field(description="the largest stage's need")
    memory_limit_bytes: int


class PlanResult(BaseModel):
    """A plan, or `plan=None` with the reasons no configuration fits."""

    model_config = ConfigDict(frozen=True)

    plan: ElasticPlan | None
    reasons: tuple[str, ...] = ()
    candidates_checked: int = 0

    @property
    def placed(self) -> bool:
        """Whether a configuration fits."""
        return self.plan is not None


@dataclass(frozen=True)
class _Placement:
    nodes: tuple[tuple[str, int], ...]
    link: Literal["intra-node", "inter-node", "cross-zone"]


def _place_groups(nodes: Sequence[_Offer], tp: int, groups: int) -> _Placement | None:
    """Put `groups` TP groups of `tp` GPUs on nodes, preferring one node, then one zone."""

    def pack(cands: Sequence[_Offer]) -> tuple[tuple[str, int], ...] | None:
        left, used = groups, []
        for n in sorted(cands, key=lambda n: (-(n.gpus // tp), n.name)):
            take = min(left, n.gpus // tp)
            if take:
                used.append((n.name, take * tp))
                left -= take
            if left == 0:
                return tuple(used)
        return None

    for n in sorted(nodes, key=lambda n: (n.gpus, n.name)):
        if n.gpus // tp >= groups:
            return _Placement(((n.name, groups * tp),), "intra-node")
    for zone in sorted({n.zone for n in nodes}):
        packed = pack([n for n in nodes if n.zone == zone])
        if packed is not None:
            return _Placement(packed, "inter-node")
    packed = pack(nodes)
    return None if packed is None else _Placement(packed, "cross-zone")


def _stage_costs(
    profile: ModelProfile,
    *,
    times: tuple[LayerTimes, ...],
    bounds: Sequence[int],
    microbatch: int,
    tp: int,
    pp: int,
    m: int,
) -> tuple[list[float], list[float], list[int], list[int]]:
    """Per stage: compute seconds, update seconds, gradient bytes, memory bytes."""
    cfg, n_layers = profile.config, profile.num_all_layers
    compute, update, grads, memory = [], [], [], []
    start = 0
    for s, end in enumerate(bounds):
        layer_ids = range(start, end)
        params = sum(cfg.layer_params(i, n_layers) for i in layer_ids)
        acts = sum(cfg.layer_activation_bytes(i, n_layers, microbatch) for i in layer_ids)
        in_flight = min(pp - s, m)
        compute.append(sum(times[i].fwd + times[i].bwd for i in layer_ids))
        update.append(sum(times[i].update for i in layer_ids))
        grads.append(2 * params // tp)
        memory.append((params * BYTES_PER_PARAM_TRAINING + in_flight * acts) // tp)
        start = end
    return compute, update, grads, memory


def _allowed(values: Collection[int], value: int) -> bool:
    return not values or value in values


@dataclass(frozen=True)
class _Limits:
    """What the caller allows: GPU count bounds, a GPU multiple and allowed degrees."""

    min_gpus: int
    max_gpus: int | None
    gpu_multiple: int
    tensor_degrees: Collection[int]
    pipeline_degrees: Collection[int]
    data_degrees: Collection[int]


@dataclass
class _Best:
    """The best plan so far and what the search saw."""

    plan: ElasticPlan | None = None
    key: tuple[float, ...] = ()
    checked: int = 0

    def offer(self, plan: ElasticPlan, key: tuple[float, ...]) -> None:
        if self.plan is None or key > self.key:
            self.plan, self.key = plan, key


def plan_elastic(
    profile: ModelProfile,
    available: Sequence[Node],
    settings: PlannerSettings,
    *,
    objective: Objective = "throughput",
    min_gpus: int = 1,
    max_gpus: int | None = None,
    gpu_multiple: int = 1,
    tensor_degrees: Collection[int] = (),
    pipeline_degrees: Collection[int] = (),
    data_degrees: Collection[int] = (),
) -> PlanResult:
    """Best configuration on the untouched GPUs of `available`, or the reasons none fits. Pure.

    `available` are nodes of the one cluster model (`solver.model.Node`); a node's
    GPU memory is its first GPU's (nodes carry one model).
    `gpu_multiple`: the total GPU count must be a multiple of it (whole workers).
    `*_degrees`: allowed degrees (empty: any), e.g. tensor degrees that divide a
    worker's GPUs, so tensor parallelism stays inside one worker.
    """
    limits = _Limits(
        min_gpus, max_gpus, gpu_multiple, tensor_degrees, pipeline_degrees, data_degrees
    )
    reasons: list[str] = []
    offers = [_Offer.of(n) for n in available]
    by_type: dict[str, list[_Offer]] = {}
    for offer in offers:
        if offer.gpus > 0:
            by_type.setdefault(offer.gpu_type, []).append(offer)
    if not by_type:
        return PlanResult(plan=None, reasons=("no GPUs are available",))
    best = _Best()
    for gpu_type in sorted(by_type):
        reasons += _search_type(
            profile,
            gpu_type,
            by_type[gpu_type],
            settings=settings,
            objective=objective,
            limits=limits,
            best=best,
        )
    if best.plan is None:
        total = sum(n.gpus for n in offers)
        if min_gpus > total:
            reasons.append(f"job needs at least {min_gpus} GPUs but only {total} are available")
        if not reasons:
            reasons.append("no data/tensor/pipeline split divides the global batch on these GPUs")
        return PlanResult(plan=None, reasons=tuple(reasons), candidates_checked=best.checked)
    return PlanResult(plan=best.plan, reasons=tuple(reasons), candidates_checked=best.checked)


def _search_type(
    profile: ModelProfile,
    gpu_type: str,
    nodes: list[_Offer],
    *,
    settings: PlannerSettings,
    objective: Objective,
    limits: _Limits,
    best: _Best,
) -> list[str]:
    """Offer `best` every configuration on one GPU type; returns why the type falls short."""
    cfg = profile.config
    gprof = profile.gpus.get(gpu_type)
    if gprof is None:
        return [f"{cfg.model} has no profile for GPU type {gpu_type}"]
    reasons: list[str] = []
    mem_limit = min(n.memory_bytes for n in nodes) - settings.memory_overhead_bytes
    price = settings.prices_per_gpu_hour.get(gpu_type)
    best_mem_need: int | None = None
    for microbatch, tp, pp, dp, times, bounds in _shapes(
        profile, gpu_type, nodes, settings, limits
    ):
        best.checked += 1
        need, plan = _configuration(
            profile,
            gpu_type=gpu_type,
            nodes=nodes,
            settings=settings,
            shape=(microbatch, tp, pp, dp),
            times=times,
            bounds=bounds,
            mem_limit=mem_limit,
            price=price,
        )
        if best_mem_need is None or need < best_mem_need:
            best_mem_need = need
        if plan is not None:
            score = (
                plan.throughput_samples_s if objective == "throughput" else plan.samples_per_dollar
            )
            best.offer(plan, (score, -plan.gpus, -pp, -tp))
    if objective == "throughput_per_dollar" and price is None:
        reasons.append(f"no price for GPU type {gpu_type}; its plans score 0 per dollar")
    if best_mem_need is not None and best_mem_need > mem_limit:
        reasons.append(
            f"{cfg.model} needs at least {best_mem_need / GIB:.1f} GiB per {gpu_type} GPU "
            f"with the GPUs offered, but only {mem_limit / GIB:.1f} GiB is usable"
        )
    return reasons


def _shapes(
    profile: ModelProfile,
    gpu_type: str,
    nodes: list[_Offer],
    settings: PlannerSettings,
    limits: _Limits,
) -> Iterator[tuple[int, int, int, int, tuple[LayerTimes, ...], list[int]]]:
    """Every (microbatch, TP, PP, DP) the profile, the nodes and the limits allow.

    In search order, with the layer times and the pipeline stage bounds.
    """
    gprof = profile.gpus[gpu_type]
    for microbatch, tp in gprof.options():
        times = gprof.times(microbatch, tp)
        if times is None or tp > max(n.gpus for n in nodes):
            continue
        if not _allowed(limits.tensor_degrees, tp):
            continue
        groups = sum(n.gpus // tp for n in nodes)
        max_pp = min(groups, len(times), settings.max_pipeline_degree)
        for pp in range(1, max_pp + 1):
            if not _allowed(limits.pipeline_degrees, pp):
                continue
            bounds = partition_layers([t.fwd + t.bwd for t in times], pp)
            for dp in range(1, groups // pp + 1):
                gpus = dp * pp * tp
                if not _fits_limits(profile.config.global_batch_size, dp, microbatch, gpus, limits):
                    continue
                if limits.max_gpus is not None and gpus > limits.max_gpus:
                    break
                yield microbatch, tp, pp, dp, times, bounds


def _fits_limits(gbs: int, dp: int, microbatch: int, gpus: int, limits: _Limits) -> bool:
    """The global batch divides into dp x microbatch, and the GPU count is allowed."""
    return not (
        gbs % (dp * microbatch)
        or gpus < limits.min_gpus
        or gpus % limits.gpu_multiple
        or not _allowed(limits.data_degrees, dp)
    )


def _configuration(
    profile: ModelProfile,
    *,
    gpu_type: str,
    nodes: list[_Offer],
    settings: PlannerSettings,
    shape: tuple[int, int, int, int],
    times: tuple[LayerTimes, ...],
    bounds: Sequence[int],
    mem_limit: int,
    price: float | None,
) -> tuple[int, ElasticPlan | None]:
    """The memory one configuration needs per GPU, and its plan when it fits and places."""
    microbatch, tp, pp, dp = shape
    cfg = profile.config
    gbs = cfg.global_batch_size
    gpus = dp * pp * tp
    m = gbs // (dp * microbatch)
    compute, update, grads, memory = _stage_costs(
        profile, times=times, bounds=bounds, microbatch=microbatch, tp=tp, pp=pp, m=m
    )
    need = max(memory)
    if need > mem_limit:
        return need, None
    placement = _place_groups(nodes, tp, dp * pp)
    if placement is None:
        return need, None
    bw = {
        "intra-node": settings.intra_node_bw,
        "inter-node": settings.inter_node_bw,
        "cross-zone": settings.cross_zone_bw,
    }[placement.link]
    p2p = 2 * cfg.boundary_activation_bytes(microbatch) / tp / bw if pp > 1 else 0.0
    stage_t = [c + p2p for c in compute]
    t_pipe = sum(stage_t) + (m - 1) * max(stage_t)
    t_ar = max(2 * (dp - 1) / dp * g / bw for g in grads) if dp > 1 else 0.0
    iteration = t_pipe + t_ar + max(update)
    thr = gbs / iteration
    per_dollar = thr * 3600 / (gpus * price) if price else 0.0
    sizes = [bounds[0]] + [b - a for a, b in pairwise(bounds)]
    return need, ElasticPlan(
        gpu_type=gpu_type,
        gpus=gpus,
        dp=dp,
        tp=tp,
        pp=pp,
        microbatch=microbatch,
        num_microbatches=m,
        stage_layers=tuple(sizes),
        nodes=placement.nodes,
        link=placement.link,
        iteration_s=iteration,
        throughput_samples_s=thr,
        samples_per_dollar=per_dollar,
        memory_per_gpu_bytes=need,
        memory_limit_bytes=mem_limit,
    )
