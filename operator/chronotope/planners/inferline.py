"""InferLine-style planning of an inference pipeline under an end-to-end P99 SLO (pure).

The pipeline is a DAG of stages in topological order; a query enters at the
first stage and follows each edge with its visit fraction. A configuration
gives every stage a GPU type, a maximum batch size and a replica count; its
cost is the GPUs it holds times their price (a GPU share costs its fraction).

The estimator is a discrete-event simulation over a sample arrival trace:
each stage is a FIFO queue served by its replicas, and a replica that falls
idle takes every query waiting, up to the batch size, and holds them for the
profiled latency of that batch. Because the DAG is feed-forward, the stages
are simulated one after another, each on the completion times of its parents;
a stage's result is cached on the configurations of it and its ancestors, so
a search step that changes one stage re-simulates only that stage and those
below it.

`plan_inferline` is the paper's planner (SoCC'20, Algorithms 1 and 2): every
stage on its lowest-latency GPU type at batch 1 with one replica, replicas
added to the bottleneck until the simulated P99 meets the SLO, then the
largest feasible cost cut applied again and again (a larger batch with the
replicas that keep the throughput, one replica fewer, or the next cheaper
GPU type) until none is left. `plan_chronotope` searches the same space with
more moves (see docs/inference.md): GPU shares for stages that allow them,
any batch size and GPU type per stage at once, and restarts from each cut
that InferLine's greedy order would not try.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from chronotope.api.v1alpha1.inferencepipeline import InferencePipelineSpec, Stage

__all__ = [
    "ENVELOPE_LARGEST_S",
    "SCALING_FACTORS",
    "Envelope",
    "Infeasible",
    "PipelineModel",
    "PlanOutcome",
    "ScalingStep",
    "Schedule",
    "StageConfig",
    "StageModel",
    "TunerDecision",
    "TunerInput",
    "busiest_count",
    "envelope",
    "envelope_windows",
    "minimum_service_time",
    "model_from_spec",
    "plan_chronotope",
    "plan_inferline",
    "plan_within",
    "scaling_table",
    "serve",
    "service_time",
    "simulate_pipeline",
    "simulate_schedules",
    "stage_share",
    "stage_visits",
    "table_need",
    "tune",
    "whole_gpus",
]

EPS_COST = 1e-9
"""Cost changes below this (per hour) are rounding, not savings."""

FloatArray = npt.NDArray[np.float64]
Arrivals = Sequence[float] | FloatArray
"""Arrival times in seconds."""
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class StageModel:
    """One stage: its profiles per GPU type and its replica bounds."""

    name: str
    profiles: dict[str, tuple[tuple[int, float], ...]]
    """GPU type -> (batch size, batch latency in seconds), by batch size."""
    min_replicas: int = 1
    max_replicas: int = 64
    share: float = 1.0
    """GPU fraction one replica holds (1.0: a whole GPU; less for a GPU share)."""

    def latency(self, gpu_type: str, n: int) -> float:
        """Seconds to serve a batch of `n` queries (linear between profiled sizes)."""
        points = self.profiles[gpu_type]
        if n <= points[0][0]:
            return points[0][1]
        for (b0, l0), (b1, l1) in pairwise(points):
            if n <= b1:
                return l0 + (l1 - l0) * (n - b0) / (b1 - b0)
        return points[-1][1]

    def throughput(self, gpu_type: str, batch: int) -> float:
        """Queries per second of one replica kept busy with full batches."""
        return batch / self.latency(gpu_type, batch)

    def batches(self, gpu_type: str) -> list[int]:
        """The profiled batch sizes on `gpu_type`."""
        return [b for b, _ in self.profiles[gpu_type]]


@dataclass(frozen=True)
class PipelineModel:
    """Stages in topological order, edges with visit fractions, the SLO and prices."""

    stages: tuple[StageModel, ...]
    edges: tuple[tuple[int, int, float], ...]
    """(from stage index, to stage index, fraction of `from`'s queries that visit `to`)."""
    slo_s: float
    prices: dict[str, float]
    """Cost of one whole GPU of a type per hour."""

    def scale_factors(self) -> list[float]:
        """Expected share of entering queries that visit each stage."""
        visit = [0.0] * len(self.stages)
        visit[0] = 1.0
        for src, dst, frac in sorted(self.edges, key=lambda e: e[1]):
            visit[dst] = 1 - (1 - visit[dst]) * (1 - visit[src] * frac)
        return visit


@dataclass(frozen=True)
class StageConfig:
    """One stage's GPU type, maximum batch size and replica count."""

    gpu_type: str
    batch: int
    replicas: int


Config = tuple[StageConfig, ...]


@dataclass(frozen=True)
class Infeasible:
    """No configuration meets the SLO, and why."""

    reason: str
    min_service_time_s: float


@dataclass(frozen=True)
class PlanOutcome:
    """A plan: the configuration, its predicted P99 and cost, and the search's effort."""

    config: Config
    p99_s: float
    cost_per_hour: float
    evaluations: int
    steps: list[str] = field(default_factory=list)


def cost_per_hour(model: PipelineModel, config: Config) -> float:
    """What the configuration's GPUs cost per hour."""
    return sum(
        c.replicas * s.share * model.prices.get(c.gpu_type, 0.0)
        for s, c in zip(model.stages, config, strict=True)
    )


def stage_visits(model: PipelineModel, n: int, seed: int) -> BoolArray:
    """[stage, query]: which queries visit which stages (entry always; edges drawn once)."""
    rng = np.random.default_rng(seed)
    visited = np.zeros((len(model.stages), n), dtype=np.bool_)
    visited[0] = True
    for src, dst, frac in sorted(model.edges, key=lambda e: e[1]):
        visited[dst] |= visited[src] & (rng.random(n) < frac)
    return visited


Schedule = list[tuple[float, int]]
"""(time s, replicas) changes of one stage, starting at time 0."""


def serve(
    arrive: FloatArray,
    schedule: Schedule,
    batch: int,
    latency: Sequence[float],
    cold_start_s: float = 0.0,
) -> FloatArray:
    """Completion time of each query (in arrival order) at one stage.

    `latency[k]` is the time of a batch of k. The replica count follows
    `schedule`: a new replica serves after `cold_start_s`, a retired one
    finishes its batch first. A replica that falls idle takes every query
    waiting, up to `batch`.
    """
    if len(schedule) == 1:
        return _serve_fixed(arrive, schedule[0][1], batch, latency)
    n = len(arrive)
    done = np.empty(n)
    target = schedule[0][1]
    free = [0.0] * max(target, 1)
    heapq.heapify(free)
    retire = 0
    e = 1
    i = 0
    while i < n:
        start = max(free[0], float(arrive[i]))
        while e < len(schedule) and schedule[e][0] <= start:
            t, k = schedule[e]
            if k > target:
                for _ in range(k - target):
                    heapq.heappush(free, t + cold_start_s)
            else:
                retire += target - k
            target = k
            e += 1
            start = max(free[0], float(arrive[i]))
        t_free = heapq.heappop(free)
        if retire and free:  # a retired replica leaves once its batch is done
            retire -= 1
            continue
        start = max(t_free, float(arrive[i]))
        j = min(i + batch, int(np.searchsorted(arrive, start, side="right")))
        finish = start + latency[j - i]
        done[i:j] = finish
        heapq.heappush(free, finish)
        i = j
    return done


def _serve_fixed(
    arrive: FloatArray, replicas: int, batch: int, latency: Sequence[float]
) -> FloatArray:
    """`serve` with a fixed replica count: the same queue, in plain Python floats.

    The planner's estimator calls this for every stage of every configuration
    it tries, so it avoids numpy calls per batch (`bisect` over a list instead
    of `np.searchsorted`).
    """
    times: list[float] = arrive.tolist()
    n = len(times)
    done = [0.0] * n
    free = [0.0] * max(replicas, 1)
    pop, push, right = heapq.heappop, heapq.heappush, bisect.bisect_right
    i = 0
    while i < n:
        t_free = pop(free)
        a = times[i]
        start = t_free if t_free > a else a
        j = right(times, start, i + 1, min(i + batch, n))
        finish = start + latency[j - i]
        if j - i == 1:
            done[i] = finish
        else:
            done[i:j] = [finish] * (j - i)
        push(free, finish)
        i = j
    return np.asarray(done, dtype=np.float64)


def _parents(model: PipelineModel) -> list[list[int]]:
    parents: list[list[int]] = [[] for _ in model.stages]
    for src, dst, _ in model.edges:
        parents[dst].append(src)
    return parents


def _stage_finish(
    i: int,
    arrivals: FloatArray,
    visits: BoolArray,
    parent_finish: Sequence[FloatArray],
    serve_stage: Callable[[FloatArray], FloatArray],
) -> FloatArray:
    """When each query leaves stage i (NaN if it does not visit it), given its parents'."""
    n = len(arrivals)
    ready = arrivals.copy() if i == 0 else np.full(n, -np.inf)
    for f in parent_finish:
        ready = np.fmax(ready, f)
    out = np.full(n, np.nan)
    idx = np.flatnonzero(visits[i])
    if len(idx):
        order = idx[np.argsort(ready[idx], kind="stable")]
        out[order] = serve_stage(ready[order])
    return out


def simulate_schedules(
    model: PipelineModel,
    config: Config,
    schedules: Sequence[Schedule],
    arrivals: FloatArray,
    *,
    cold_start_s: float = 0.0,
    seed: int = 0,
) -> FloatArray:
    """End-to-end latency of every query when each stage's replicas follow a schedule."""
    visits = stage_visits(model, len(arrivals), seed)
    parents = _parents(model)
    finish: list[FloatArray] = []
    for i, (stage, c) in enumerate(zip(model.stages, config, strict=True)):
        table = [stage.latency(c.gpu_type, k) for k in range(c.batch + 1)]

        def run(
            ready: FloatArray, i: int = i, c: StageConfig = c, table: list[float] = table
        ) -> FloatArray:
            return serve(ready, schedules[i], c.batch, table, cold_start_s)

        finish.append(_stage_finish(i, arrivals, visits, [finish[p] for p in parents[i]], run))
    latency: FloatArray = np.nanmax(np.vstack(finish), axis=0) - arrivals
    return latency


class _Estimator:
    """Simulates configurations on one trace, caching each stage's result."""

    def __init__(self, model: PipelineModel, arrivals: FloatArray, seed: int) -> None:
        self.model = model
        self.arrivals = np.sort(np.asarray(arrivals, dtype=np.float64))
        self.visits = stage_visits(model, len(self.arrivals), seed)
        self.parents = _parents(model)
        self._cache: dict[tuple[int, tuple[StageConfig, ...]], FloatArray] = {}
        self.evaluations = 0

    def _ancestry(self, i: int, config: Config) -> tuple[StageConfig, ...]:
        seen, todo = {i}, [i]
        while todo:
            for p in self.parents[todo.pop()]:
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        return tuple(config[k] for k in sorted(seen))

    def _finish(self, i: int, config: Config) -> FloatArray:
        """Per query: when it leaves stage i (NaN if it does not visit it)."""
        key = (i, self._ancestry(i, config))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        stage, c = self.model.stages[i], config[i]
        table = [stage.latency(c.gpu_type, k) for k in range(c.batch + 1)]
        out = _stage_finish(
            i,
            self.arrivals,
            self.visits,
            [self._finish(p, config) for p in self.parents[i]],
            lambda ready: serve(ready, [(0.0, c.replicas)], c.batch, table),
        )
        self._cache[key] = out
        return out

    def latencies(self, config: Config) -> FloatArray:
        """End-to-end latency of every query of the trace under `config`."""
        self.evaluations += 1
        last = np.full(len(self.arrivals), -np.inf)
        for i in range(len(self.model.stages)):
            last = np.fmax(last, self._finish(i, config))
        return last - self.arrivals

    def p99(self, config: Config) -> float:
        """The simulated 99th-percentile end-to-end latency, seconds."""
        if not self.stable(config):
            return math.inf
        return float(np.percentile(self.latencies(config), 99))

    def stable(self, config: Config) -> bool:
        """Every stage can keep up with its mean arrival rate (else queues grow without end)."""
        span = max(float(self.arrivals[-1] - self.arrivals[0]), 1e-9)
        for i, (stage, c) in enumerate(zip(self.model.stages, config, strict=True)):
            rate = float(self.visits[i].sum()) / span
            if rate > c.replicas * stage.throughput(c.gpu_type, c.batch):
                return False
        return True


def simulate_pipeline(
    model: PipelineModel, config: Config, arrivals: Arrivals, seed: int = 0
) -> FloatArray:
    """End-to-end latency (s) of every query of `arrivals` under a fixed configuration."""
    return _Estimator(model, np.asarray(arrivals, dtype=np.float64), seed).latencies(config)


def _longest_path(model: PipelineModel, own: Sequence[float]) -> float:
    """The longest path through the DAG when stage i takes `own[i]`."""
    longest = list(own)
    for src, dst, _ in sorted(model.edges, key=lambda e: e[1]):
        longest[dst] = max(longest[dst], longest[src] + own[dst])
    return max(longest)


def minimum_service_time(model: PipelineModel) -> float:
    """The longest path's sum of batch-1 latencies on each stage's fastest GPU type."""
    return _longest_path(model, [min(s.latency(g, 1) for g in s.profiles) for s in model.stages])


def service_time(model: PipelineModel, config: Config) -> float:
    """A configuration's service time: the longest path of its batches' latencies."""
    own = [st.latency(c.gpu_type, c.batch) for st, c in zip(model.stages, config, strict=True)]
    return _longest_path(model, own)


def _fastest(stage: StageModel) -> str:
    return min(stage.profiles, key=lambda g: (stage.latency(g, 1), g))


def _replicas_for(stage: StageModel, gpu: str, batch: int, rate: float) -> int:
    """Fewest replicas whose full-batch throughput covers `rate` (within the stage's bounds)."""
    need = math.ceil(rate / stage.throughput(gpu, batch) - 1e-9) if rate > 0 else 0
    return min(max(need, stage.min_replicas, 1), stage.max_replicas)


def _initial(est: _Estimator, model: PipelineModel, steps: list[str]) -> Config | None:
    """Algorithm 1: fastest type, batch 1, one replica; add replicas to the bottleneck."""
    config = tuple(StageConfig(_fastest(s), 1, max(1, s.min_replicas)) for s in model.stages)
    return _add_to_bottleneck(est, model, config, steps)


def _add_to_bottleneck(
    est: _Estimator, model: PipelineModel, config: Config, steps: list[str]
) -> Config | None:
    """Add replicas to the bottleneck stage until the simulated P99 meets the SLO."""
    scale = model.scale_factors()
    while est.p99(config) > model.slo_s:
        room = [
            i
            for i, (s, c) in enumerate(zip(model.stages, config, strict=True))
            if c.replicas < s.max_replicas
        ]
        if not room:
            return None
        # the bottleneck: least throughput per unit of the traffic that reaches it
        i = min(
            room,
            key=lambda k: (
                config[k].replicas
                * model.stages[k].throughput(config[k].gpu_type, config[k].batch)
                / max(scale[k], 1e-9),
                k,
            ),
        )
        config = _set(config, i, replace(config[i], replicas=config[i].replicas + 1))
        steps.append(f"add a replica to {model.stages[i].name}")
    return config


def _set(config: Config, i: int, c: StageConfig) -> Config:
    return (*config[:i], c, *config[i + 1 :])


def _inferline_moves(model: PipelineModel, config: Config) -> list[tuple[str, Config]]:
    """InferLine's actions on every stage: IncreaseBatch, RemoveReplica, DowngradeHW."""
    out: list[tuple[str, Config]] = []
    for i, (s, c) in enumerate(zip(model.stages, config, strict=True)):
        sizes = s.batches(c.gpu_type)
        larger = [b for b in sizes if b > c.batch]
        if larger:
            b = larger[0]
            keep = c.replicas * s.throughput(c.gpu_type, c.batch)
            k = _replicas_for(s, c.gpu_type, b, keep)
            out.append(
                (
                    f"{s.name}: batch {b}, {k} replica(s)",
                    _set(config, i, replace(c, batch=b, replicas=min(k, c.replicas))),
                )
            )
        if c.replicas > max(1, s.min_replicas):
            out.append(
                (
                    f"{s.name}: one replica fewer",
                    _set(config, i, replace(c, replicas=c.replicas - 1)),
                )
            )
        price = model.prices.get(c.gpu_type, 0.0)
        cheaper = sorted(
            (model.prices.get(g, 0.0), g) for g in s.profiles if model.prices.get(g, 0.0) < price
        )
        if cheaper:
            g = cheaper[-1][1]  # the next cheaper type
            b = max([x for x in s.batches(g) if x <= c.batch] or [s.batches(g)[0]])
            keep = c.replicas * s.throughput(c.gpu_type, c.batch)
            k = _replicas_for(s, g, b, keep)
            out.append(
                (f"{s.name}: {g}, batch {b}, {k} replica(s)", _set(config, i, StageConfig(g, b, k)))
            )
    return out


def _greedy(
    est: _Estimator,
    model: PipelineModel,
    config: Config,
    moves: Callable[[PipelineModel, Config], list[tuple[str, Config]]],
    steps: list[str],
) -> Config:
    """Algorithm 2: apply the feasible move with the largest cost cut until none is left."""
    cost = cost_per_hour(model, config)
    while True:
        best: tuple[float, str, Config] | None = None
        for what, cand in moves(model, config):
            saved = cost - cost_per_hour(model, cand)
            if saved <= EPS_COST or (best is not None and saved <= best[0]):
                continue
            if est.p99(cand) <= model.slo_s:
                best = (saved, what, cand)
        if best is None:
            return config
        config, cost = best[2], cost - best[0]
        steps.append(best[1])


def whole_gpus(model: PipelineModel) -> PipelineModel:
    """The model with every replica on a whole GPU (no shares)."""
    stages = tuple(replace(s, share=max(1.0, s.share)) for s in model.stages)
    return replace(model, stages=stages)


def plan_inferline(
    model: PipelineModel, arrivals: Arrivals, *, seed: int = 0
) -> PlanOutcome | Infeasible:
    """The paper's planner on the sample trace `arrivals` (seconds)."""
    floor = minimum_service_time(model)
    if floor > model.slo_s:
        return Infeasible(
            f"the SLO ({model.slo_s * 1000:.0f} ms) is below the pipeline's minimum service "
            f"time ({floor * 1000:.0f} ms: batch 1 on each stage's fastest GPU type, along "
            "the longest path)",
            floor,
        )
    model = whole_gpus(model)  # the paper provisions whole GPUs per replica
    est = _Estimator(model, np.asarray(arrivals, dtype=np.float64), seed)
    steps: list[str] = []
    config = _initial(est, model, steps)
    if config is None:
        return Infeasible(
            "no replica count within the stages' maxReplicas meets the SLO on the sample trace",
            floor,
        )
    config = _greedy(est, model, config, _inferline_moves, steps)
    return PlanOutcome(
        config, est.p99(config), cost_per_hour(model, config), est.evaluations, steps
    )


def _any_moves(model: PipelineModel, config: Config) -> list[tuple[str, Config]]:
    """InferLine's moves plus a jump to any (type, batch) of a stage.

    The jump keeps the stage's throughput with the fewest replicas, or one fewer.
    """
    out = _inferline_moves(model, config)
    for i, (s, c) in enumerate(zip(model.stages, config, strict=True)):
        keep = c.replicas * s.throughput(c.gpu_type, c.batch)
        for g in s.profiles:
            for b in s.batches(g):
                if (g, b) == (c.gpu_type, c.batch):
                    continue
                k = _replicas_for(s, g, b, keep)
                cand = _set(config, i, StageConfig(g, b, k))
                out.append((f"{s.name}: {g}, batch {b}, {k} replica(s)", cand))
                if k > max(1, s.min_replicas):
                    out.append(
                        (
                            f"{s.name}: {g}, batch {b}, {k - 1} replica(s)",
                            _set(config, i, StageConfig(g, b, k - 1)),
                        )
                    )
    return out


def plan_chronotope(
    model: PipelineModel, arrivals: Arrivals, *, seed: int = 0
) -> PlanOutcome | Infeasible:
    """InferLine's search with wider moves: any profiled (type, batch) per stage at once."""
    first = plan_inferline(model, arrivals, seed=seed)
    if isinstance(first, Infeasible):
        return first
    est = _Estimator(model, np.asarray(arrivals, dtype=np.float64), seed)
    steps = list(first.steps)
    config = _greedy(est, model, first.config, _any_moves, steps)
    return _outcome(est, model, config, first, steps)


def _outcome(
    est: _Estimator, model: PipelineModel, config: Config, first: PlanOutcome, steps: list[str]
) -> PlanOutcome:
    """A search's result on top of InferLine's `first` plan (the evaluations of both)."""
    return PlanOutcome(
        config,
        est.p99(config),
        cost_per_hour(model, config),
        first.evaluations + est.evaluations,
        steps,
    )


def _repair_moves(model: PipelineModel, config: Config) -> list[tuple[str, Config]]:
    """`_any_moves`, and each type jump with one or two replicas more.

    A slower type's latency may need them to keep the SLO.
    """
    out = _any_moves(model, config)
    for i, (s, c) in enumerate(zip(model.stages, config, strict=True)):
        keep = c.replicas * s.throughput(c.gpu_type, c.batch)
        for g in s.profiles:
            for b in s.batches(g):
                k = _replicas_for(s, g, b, keep)
                for extra in (1, 2):
                    if (g, b) != (c.gpu_type, c.batch) and k + extra <= s.max_replicas:
                        cand = _set(config, i, StageConfig(g, b, k + extra))
                        out.append((f"{s.name}: {g}, batch {b}, {k + extra} replica(s)", cand))
    return out


def plan_within(
    model: PipelineModel,
    arrivals: Arrivals,
    over: Callable[[Config], float],
    *,
    seed: int = 0,
    first: PlanOutcome | None = None,
) -> PlanOutcome | Infeasible:
    """`plan_chronotope`'s plan, cut to what `over` admits (0: the configuration fits).

    `over` measures how far a configuration exceeds the GPUs it may have (a queue's
    quota now). If the plan fits, it is the answer. Otherwise, from it, each step
    takes the move (any stage to any profiled type and batch, with the replicas that
    keep its throughput, or one or two more, or one fewer; InferLine's own moves)
    that meets the SLO and exceeds least, the cheapest among equals, until nothing
    exceeds; then InferLine's cost-cutting greedy runs over the moves that still fit.
    Infeasible when no such step is left before the plan fits. `first`: that plan,
    where the caller has already made it (same model, arrivals and seed).
    """
    made = plan_chronotope(model, arrivals, seed=seed) if first is None else first
    if isinstance(made, Infeasible) or over(made.config) <= 0:
        return made
    first = made
    est = _Estimator(model, np.asarray(arrivals, dtype=np.float64), seed)
    steps = list(first.steps)
    config = first.config
    excess = over(config)
    while excess > 0:
        ranked = sorted(
            (
                (over(cand), cost_per_hour(model, cand), what, cand)
                for what, cand in _repair_moves(model, config)
            ),
            key=lambda row: (row[0], row[1], row[2]),
        )
        step = next(
            (row for row in ranked if row[0] < excess and est.p99(row[3]) <= model.slo_s), None
        )
        if step is None:
            return Infeasible(
                "no configuration within the GPUs it may have meets the SLO on the sample trace",
                minimum_service_time(model),
            )
        excess, _, what, config = step
        steps.append(f"{what} (to fit the GPUs it may have)")

    def fitting(m: PipelineModel, c: Config) -> list[tuple[str, Config]]:
        return [(w, cand) for w, cand in _any_moves(m, c) if over(cand) <= 0]

    config = _greedy(est, model, config, fitting, steps)
    return _outcome(est, model, config, first, steps)


SCALING_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
"""Multiples of the sample's mean rate that `scaling_table` sizes the plan for."""


Envelope = tuple[tuple[float, float], ...]
"""(window seconds, queries per second) per window length, the shortest first."""

ENVELOPE_LARGEST_S = 60.0
"""The longest window of the tuner's traffic envelope (InferLine: doubling up to 60 s)."""


@dataclass(frozen=True)
class ScalingStep:
    """Replicas per stage that meet the SLO up to a rate (one row of the tuner's table)."""

    rate_qps: float
    replicas: tuple[int, ...]
    envelope: Envelope = ()
    """The busiest rate in each window length of the sample this row was sized on
    (`envelope_windows` from the tuner's rate window, up to half the sample's span).
    The first window is `rate_qps`'s. Empty: only `rate_qps` is known (older rows)."""


def scaling_table(
    model: PipelineModel,
    config: Config,
    sample: Arrivals,
    *,
    seed: int = 0,
    window_s: float = 5.0,
    largest_s: float = ENVELOPE_LARGEST_S,
    factors: Sequence[float] = SCALING_FACTORS,
) -> tuple[ScalingStep, ...]:
    """Replicas per stage that meet the SLO at multiples of the sample's rate.

    The plan's GPU types and batch sizes stay; the sample is squeezed or
    stretched in time to each multiple of its mean rate (its burst shape kept),
    and, from the replicas that keep up with the mean, replicas are added to the
    bottleneck until the simulated P99 meets the SLO (the planner's Algorithm 1).
    A row's rate is the busiest `window_s` of its squeezed sample: the tuner
    reads the live rate over that window, so a live rate at or below a row's
    has been served within the SLO by that row's replicas, bursts included.
    Each row also keeps its sample's envelope: the busiest rate over windows
    doubling from `window_s` to `largest_s` (those no longer than half its
    span), so sustained traffic that the short window alone would call covered
    is not (`table_need`).
    Rows are monotone: a higher rate never needs fewer replicas. The table ends
    at the first rate that no replica count within the stages' maximums serves.
    """
    a = np.sort(np.asarray(sample, dtype=np.float64))
    if len(a) <= 1 or a[-1] <= a[0]:
        return ()
    a = a - a[0]
    mean = (len(a) - 1) / float(a[-1])
    scale = model.scale_factors()
    rows: list[ScalingStep] = []
    floor = [0] * len(config)
    windows = envelope_windows(window_s, max(window_s, largest_s))
    for f in sorted(factors):
        squeezed = a / f
        # windows up to half the squeezed span: a window as long as the sample holds one
        # reading, its mean, which live traffic at the same rate exceeds half the time
        half = float(squeezed[-1]) / 2
        own = tuple((w, _busiest_rate(squeezed, w)) for w in windows if w == window_s or w <= half)
        est = _Estimator(model, squeezed, seed)
        start = tuple(
            replace(c, replicas=max(lo, _replicas_for(st, c.gpu_type, c.batch, mean * f * sc)))
            for st, c, sc, lo in zip(model.stages, config, scale, floor, strict=True)
        )
        sized = _add_to_bottleneck(est, model, start, [])
        if sized is None:
            break
        floor = [c.replicas for c in sized]
        rows.append(ScalingStep(own[0][1], tuple(floor), own))
    return tuple(rows)


def _busiest_rate(arrivals: FloatArray, window_s: float) -> float:
    """Queries per second in the busiest window of `window_s` (the whole span if shorter)."""
    span = float(arrivals[-1] - arrivals[0])
    if span <= window_s:
        return len(arrivals) / max(span, 1e-9)
    return busiest_count(arrivals, window_s) / window_s


def busiest_count(arrivals: FloatArray, window_s: float) -> int:
    """Most queries in any window of `window_s` over sorted arrival times."""
    ends = np.searchsorted(arrivals, arrivals + window_s, side="left")
    return int((ends - np.arange(len(arrivals))).max(initial=0))


def _excess(row: ScalingStep, rate: float, live: Envelope) -> float:
    """How far live traffic goes past what a row was sized on (<= 1: the row covers it).

    The largest ratio of a live rate to the row's, over `rate` and every window
    both have.
    """
    mine = dict(row.envelope)
    ratios = [rate / max(row.rate_qps, 1e-9)]
    ratios += [r / max(mine[w], 1e-9) for w, r in live if w in mine]
    return max(ratios)


def table_need(table: Sequence[ScalingStep], rate: float, live: Envelope = ()) -> tuple[int, ...]:
    """Replicas per stage for live traffic from a scaling table.

    The first row that covers it: `rate` (over the row's first window) at or
    below the row's, and the live rate over every longer window the row was
    sized on at or below its busiest there (InferLine's envelope test: no
    window's live rate exceeds the sample's). Past the end: the last row, scaled
    by how far the traffic goes past it.
    """
    for row in table:
        if _excess(row, rate, live) <= 1.0:
            return row.replicas
    last = table[-1]
    grow = _excess(last, rate, live)
    return tuple(math.ceil(k * grow - 1e-9) for k in last.replicas)


def envelope_windows(smallest_s: float, largest_s: float = ENVELOPE_LARGEST_S) -> list[float]:
    """Window lengths doubling from `smallest_s`, the last one `largest_s`."""
    out = [max(smallest_s, 1e-3)]
    while out[-1] < largest_s:
        out.append(min(2 * out[-1], largest_s))
    return out


def envelope(
    arrivals: Arrivals, smallest_s: float, largest_s: float = ENVELOPE_LARGEST_S
) -> list[tuple[float, int]]:
    """Most queries in any window of each length, lengths doubling from `smallest_s`."""
    a = np.sort(np.asarray(arrivals, dtype=np.float64))
    return [(w, busiest_count(a, w)) for w in envelope_windows(smallest_s, largest_s)]


def stage_share(stage: Stage) -> float:
    """GPUs one replica of a spec stage holds: its compute share, its count, or one."""
    if stage.gpu is not None and stage.gpu.shared is not None:
        return stage.gpu.shared.compute_percent / 100
    if stage.gpu is not None and stage.gpu.count:
        return float(stage.gpu.count)
    return 1.0


def model_from_spec(spec: InferencePipelineSpec, default_prices: dict[str, float]) -> PipelineModel:
    """The planner's view of an InferencePipeline spec (prices: the spec's, else the defaults)."""
    index = {s.name: i for i, s in enumerate(spec.stages)}
    prices = dict(default_prices) | {c.gpu_type: c.per_hour for c in spec.costs}
    stages = []
    for s in spec.stages:
        share = stage_share(s)
        stages.append(
            StageModel(
                name=s.name,
                profiles={
                    p.gpu_type: tuple(
                        sorted((b.batch_size, b.latency_ms / 1000) for b in p.batches)
                    )
                    for p in s.profiles
                },
                min_replicas=s.min_replicas,
                max_replicas=s.max_replicas,
                share=share,
            )
        )
    edges = tuple((index[e.from_], index[e.to], e.fraction) for e in spec.edges)
    return PipelineModel(tuple(stages), edges, spec.slo.p99_latency_ms / 1000, prices)


HYSTERESIS = 0.25
"""A stage's need is rounded up only past this share of a replica (rates are noisy)."""


@dataclass(frozen=True)
class TunerInput:
    """What the tuner reads each pass: the live rate now and its most over the delay."""

    rate_qps: float
    """Queries per second now."""
    recent_max_qps: float
    """The most queries per second over the last `down_delay_s`."""
    now_s: float
    """Seconds since an epoch (the controller's clock)."""
    envelope_qps: Envelope = ()
    """The live rate over the last window of each longer length (`envelope_windows`)."""
    recent_envelope_qps: Envelope = ()
    """The most of each of those over the last `down_delay_s`."""


@dataclass(frozen=True)
class TunerDecision:
    """Replicas per stage after one tuner pass, and what changed."""

    replicas: tuple[int, ...]
    mode: str
    """Steady, ScalingUp or ScalingDown."""
    changed: str
    """Plain words for the event; '' when nothing changed."""


def tune(
    stages: Sequence[StageModel],
    planned: Sequence[int],
    current: Sequence[int],
    reading: TunerInput,
    *,
    anchor_qps: float,
    last_scale_s: float | None,
    down_delay_s: float,
    table: Sequence[ScalingStep] = (),
) -> TunerDecision:
    """Scale stages to the live rate: up at once, down only after a delay (never flapping).

    With a scaling table (`scaling_table`, made with the plan), each stage needs
    the replicas of the first row that covers the live traffic, its rate and
    its envelope (`table_need`): what the planner's estimator found meets the
    SLO at that rate. Without one, it needs
    the planner's replicas times the live rate over the rate the plan was made
    for (`anchor_qps`). Either way within its min and max. A stage scales up
    as soon as the rate now needs more; it scales down only to what the most
    recent rate over the delay needs, and only when the last change is at least
    the delay ago, so no stage goes up and down within the delay.
    """
    up_need, down_need = [], []
    by_table = (
        (
            table_need(table, reading.rate_qps, reading.envelope_qps),
            table_need(table, reading.recent_max_qps, reading.recent_envelope_qps),
        )
        if table
        else None
    )
    for i, (stage, k_plan) in enumerate(zip(stages, planned, strict=True)):
        lo, hi = max(stage.min_replicas, 1), stage.max_replicas

        def need(rate: float, k: int = k_plan, lo: int = lo, hi: int = hi) -> int:
            want = math.ceil(k * rate / max(anchor_qps, 1e-9) - HYSTERESIS)
            return min(max(want, lo), hi)

        if by_table is not None:
            up_need.append(min(max(by_table[0][i], lo), hi))
            down_need.append(min(max(by_table[1][i], lo), hi))
        else:
            up_need.append(need(reading.rate_qps))
            down_need.append(need(reading.recent_max_qps))
    if any(u > c for u, c in zip(up_need, current, strict=True)):
        new = tuple(max(u, c) for u, c in zip(up_need, current, strict=True))
        return TunerDecision(new, "ScalingUp", _changes(stages, current, new, reading.rate_qps))
    settled = last_scale_s is None or reading.now_s - last_scale_s >= down_delay_s
    if settled and any(d < c for d, c in zip(down_need, current, strict=True)):
        new = tuple(min(d, c) for d, c in zip(down_need, current, strict=True))
        return TunerDecision(
            new, "ScalingDown", _changes(stages, current, new, reading.recent_max_qps)
        )
    return TunerDecision(tuple(current), "Steady", "")


def _changes(
    stages: Sequence[StageModel], old: Sequence[int], new: Sequence[int], rate: float
) -> str:
    moved = [f"{s.name} {a}->{b}" for s, a, b in zip(stages, old, new, strict=True) if a != b]
    return f"{', '.join(moved)} for {rate:.1f} queries/s"
