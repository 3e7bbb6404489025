"""Inference pipeline simulator: planners and autoscalers replayed on a real arrival trace.

A trace (Azure LLM inference CSV, Mooncake JSONL, or one arrival time per
line) is rescaled in time to a target mean rate, keeping its burst shape. The
first part of it is the planning trace; the rest is served. Every policy
gives each stage a GPU type and batch size, and a replica count over time;
the serving part is then simulated query by query (the planner's estimator,
`planners.inferline`, with replicas that come and go: a new one serves after
the cold start, a retired one finishes its batch first), and the row reports
P99 latency, the share of queries over the SLO, and what the GPUs cost.

Policies:

- `peak`: InferLine's plan, with each stage's replicas fixed for the trace's
  peak rate (the most queries in any 10 s window), all the time;
- `hpa`: InferLine's plan as the start, then per-stage utilisation scaling as
  Kubernetes' HPA does it for KServe: every 15 s, desired = ceil(replicas x
  utilisation / 0.7), scaled down only to the highest desire of the last 300 s;
- `inferline`: InferLine's planner and its tuner (`inferline_tuner`): traffic
  envelopes over windows doubling from the service time to 60 s (or the
  planning trace's span), scale up at once when the live envelope exceeds the
  planned one, down only after a delay;
- `chronotope`: our planner (`plan_chronotope`: GPU shares where the stage
  allows them, wider search) with the operator's own tuner and scaling table
  (`planners.inferline.tune` and `scaling_table`, the code the controller
  runs) on the rate Prometheus would report.

Pure: plain values in and out; the CLI (`sim.cli`) reads files and writes CSV.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from chronotope.planners.inferline import (
    Config,
    Infeasible,
    PipelineModel,
    Schedule,
    StageConfig,
    StageModel,
    TunerInput,
    busiest_count,
    envelope,
    envelope_windows,
    plan_chronotope,
    plan_inferline,
    scaling_table,
    service_time,
    simulate_schedules,
    stage_visits,
    tune,
    whole_gpus,
)

__all__ = [
    "INFERENCE_POLICIES",
    "InferenceRun",
    "TraceRequests",
    "TunerSettings",
    "cost_floor",
    "deadline_floor",
    "load_arrivals",
    "load_requests",
    "rescale",
    "run_policy",
]

FloatArray = npt.NDArray[np.float64]

INFERENCE_POLICIES = ("peak", "hpa", "inferline", "chronotope")


@dataclass(frozen=True)
class TraceRequests:
    """Requests of a trace: arrival seconds from the first (sorted) and token counts.

    Token counts are -1 where the format has none (one time per line).
    """

    times: FloatArray
    prompt_tokens: npt.NDArray[np.int64]
    output_tokens: npt.NDArray[np.int64]


def load_requests(path: Path) -> TraceRequests:
    """Arrivals and token counts from Azure LLM CSV, Mooncake JSONL or one time per line."""
    text = path.read_text()
    first = text.lstrip().split("\n", 1)[0]
    rows: list[tuple[float, int, int]]
    if first.startswith("TIMESTAMP"):
        rows = [
            (
                datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp(),
                int(r.get("ContextTokens") or -1),
                int(r.get("GeneratedTokens") or -1),
            )
            for r in csv.DictReader(text.splitlines())
        ]
    elif first.startswith("{"):
        rows = []
        for line in text.splitlines():
            if line.strip():
                item = json.loads(line)
                rows.append(
                    (
                        float(item["timestamp"]) / 1000,
                        int(item.get("input_length", -1)),
                        int(item.get("output_length", -1)),
                    )
                )
    else:
        rows = [(float(x), -1, -1) for x in text.split()]
    if not rows:
        raise ValueError(f"{path}: no arrivals")
    rows.sort(key=lambda r: r[0])
    times = np.asarray([r[0] for r in rows], dtype=np.float64)
    return TraceRequests(
        times - times[0],
        np.asarray([r[1] for r in rows], dtype=np.int64),
        np.asarray([r[2] for r in rows], dtype=np.int64),
    )


def load_arrivals(path: Path) -> FloatArray:
    """Arrival times in seconds from the first, sorted, from any supported trace format."""
    return load_requests(path).times


def rescale(arrivals: FloatArray, target_qps: float) -> FloatArray:
    """Stretch or squeeze time so the mean rate is `target_qps`, keeping the burst shape."""
    span = float(arrivals[-1] - arrivals[0])
    if span <= 0 or target_qps <= 0:
        raise ValueError("rescale needs arrivals spread in time and a positive target rate")
    mean = (len(arrivals) - 1) / span
    out: FloatArray = (arrivals - arrivals[0]) * (mean / target_qps)
    return out


@dataclass(frozen=True)
class TunerSettings:
    """The high-frequency tuner's period, scale-down delay and window range."""

    period_s: float = 1.0
    down_delay_s: float = 60.0
    max_window_s: float = 60.0
    rate_window_s: float = 5.0
    """The operator's tuner reads rates over this window (as `rate(x[5s])`)."""
    envelope_s: float = 60.0
    """... and over windows doubling from it up to this (the operator's --tuner-envelope-s)."""


@dataclass(frozen=True)
class InferenceRun:
    """One policy's row: latencies, cost and scaling of the served part of the trace."""

    policy: str
    requests: int
    p99_ms: float
    slo_miss_pct: float
    cost_per_hour: float
    gpu_hours: float
    scale_events: int
    config: Config
    schedules: tuple[Schedule, ...]
    latencies_s: FloatArray


def _rate(arrivals: FloatArray, visits: float, window_s: float) -> float:
    """The most queries per second into a stage over any window of `window_s`."""
    return busiest_count(arrivals, window_s) * visits / window_s


def _peak_schedules(model: PipelineModel, config: Config, arrivals: FloatArray) -> list[Schedule]:
    scale = model.scale_factors()
    out = []
    for stage, c, s in zip(model.stages, config, scale, strict=True):
        rate = _rate(arrivals, s, 10.0)
        k = math.ceil(rate / stage.throughput(c.gpu_type, c.batch) - 1e-9)
        out.append([(0.0, min(max(k, c.replicas, stage.min_replicas, 1), stage.max_replicas))])
    return out


def _counts(arrivals: FloatArray, t: float, window_s: float) -> int:
    return int(np.searchsorted(arrivals, t, side="right") - np.searchsorted(arrivals, t - window_s))


def _hpa_schedules(
    model: PipelineModel, config: Config, arrivals: FloatArray, end: float
) -> list[Schedule]:
    """Per-stage HPA: 70 % utilisation target, 15 s sync, 300 s scale-down stabilisation."""
    scale = model.scale_factors()
    out = []
    for stage, c, s in zip(model.stages, config, scale, strict=True):
        mu = stage.throughput(c.gpu_type, c.batch)
        k = c.replicas
        sched: Schedule = [(0.0, k)]
        wanted: list[tuple[float, int]] = []
        t = 15.0
        while t < end:
            rate = _counts(arrivals, t, 15.0) * s / 15.0
            util = rate / (k * mu)
            desire = max(stage.min_replicas, 1, math.ceil(k * util / 0.7 - 1e-9))
            desire = min(desire, stage.max_replicas)
            wanted = [(tw, d) for tw, d in wanted if tw > t - 300.0] + [(t, desire)]
            new = desire if desire > k else max(d for _, d in wanted)
            if new != k:
                k = new
                sched.append((t, k))
            t += 15.0
        out.append(sched)
    return out


def inferline_tuner(
    model: PipelineModel,
    config: Config,
    planning: FloatArray,
    *,
    arrivals: FloatArray,
    end: float,
    settings: TunerSettings,
) -> list[Schedule]:
    """InferLine's tuner as reproduced here: scale on traffic envelopes.

    The envelope's windows double from the pipeline's service time up to
    `max_window_s`. Each period the live count in the last window of each length
    is compared with the planning trace's most; every stage goes to the plan's
    replicas times the largest ratio, up at once and down only after the delay.
    """
    ts = service_time(model, config)
    # windows no longer than the planning trace: past its span the busiest count is just its size
    span = float(planning[-1] - planning[0]) if len(planning) else 0.0
    planned = envelope(planning, ts, max(ts, min(settings.max_window_s, span)))
    k_now = [c.replicas for c in config]
    scheds: list[Schedule] = [[(0.0, k)] for k in k_now]
    below_since: list[float | None] = [None] * len(config)
    t = settings.period_s
    while t < end:
        ratio = max(_counts(arrivals, t, w) / max(q, 1) for w, q in planned)
        for i, (st, c) in enumerate(zip(model.stages, config, strict=True)):
            want = min(
                max(math.ceil(ratio * c.replicas - 1e-9), st.min_replicas, 1), st.max_replicas
            )
            if want > k_now[i]:
                k_now[i], below_since[i] = want, None
                scheds[i].append((t, want))
            elif want < k_now[i]:
                since = below_since[i]
                if since is None:
                    below_since[i] = t
                elif t - since >= settings.down_delay_s:
                    k_now[i], below_since[i] = want, None
                    scheds[i].append((t, want))
            else:
                below_since[i] = None
        t += settings.period_s
    return scheds


def operator_tuner(
    model: PipelineModel,
    config: Config,
    planning: FloatArray,
    *,
    arrivals: FloatArray,
    end: float,
    settings: TunerSettings,
    seed: int = 0,
) -> list[Schedule]:
    """The operator's tuner (`planners.inferline.tune`, the same code) on the trace.

    With the scaling table the operator makes with each plan
    (`planners.inferline.scaling_table` on the planning trace). Each period it
    reads what Prometheus would give it: the rate over the last `rate_window_s`
    (as `rate(x[5s])`) and over windows doubling from it to `envelope_s` (the
    query with each window), and each one's most over the delay.
    """
    anchor = len(planning) / max(float(planning[-1] - planning[0]), 1e-9)
    table = scaling_table(
        model,
        config,
        planning,
        seed=seed,
        window_s=settings.rate_window_s,
        largest_s=max(settings.rate_window_s, settings.envelope_s),
    )
    windows = envelope_windows(
        settings.rate_window_s, max(settings.rate_window_s, settings.envelope_s)
    )
    planned = [c.replicas for c in config]
    current = list(planned)
    scheds: list[Schedule] = [[(0.0, k)] for k in current]
    history: list[tuple[float, tuple[float, ...]]] = []
    last: float | None = None
    t = settings.period_s
    while t < end:
        # what Prometheus answers for the query with each window, and each one's most
        # over the delay (`max_over_time`)
        rates = tuple(_counts(arrivals, t, w) / w for w in windows)
        history = [(ht, r) for ht, r in history if ht > t - settings.down_delay_s] + [(t, rates)]
        recent = tuple(max(r[i] for _, r in history) for i in range(len(windows)))
        decision = tune(
            model.stages,
            planned,
            current,
            TunerInput(
                rate_qps=rates[0],
                recent_max_qps=recent[0],
                now_s=t,
                envelope_qps=tuple(zip(windows[1:], rates[1:], strict=True)),
                recent_envelope_qps=tuple(zip(windows[1:], recent[1:], strict=True)),
            ),
            anchor_qps=anchor,
            last_scale_s=last,
            down_delay_s=settings.down_delay_s,
            table=table,
        )
        if decision.changed:
            last = t
            for i, (old, new) in enumerate(zip(current, decision.replicas, strict=True)):
                if old != new:
                    scheds[i].append((t, new))
            current = list(decision.replicas)
        t += settings.period_s
    return scheds


def cost_floor(model: PipelineModel, serving: FloatArray, *, served_share: float = 0.99) -> float:
    """A lower bound on the cost per hour of any policy that serves `served_share` of the trace.

    Every query a stage serves takes at least 1/throughput of one replica's time
    at that stage's cheapest (price x share / full-batch throughput) profiled
    GPU type and batch, and every stage holds at least its minimum replicas on
    its cheapest GPU. Replica counts may change at any instant and queues are
    free, so no policy, tuned or static, serves the trace for less.
    """
    end = float(serving[-1]) if len(serving) else 0.0
    if end <= 0:
        return 0.0
    rate = served_share * len(serving) / end
    floor = 0.0
    for stage, visits in zip(model.stages, model.scale_factors(), strict=True):
        per_qps, floor_price = _cheapest(model, stage)
        floor += max(rate * visits * per_qps, max(stage.min_replicas, 1) * floor_price)
    return floor


def _cheapest(model: PipelineModel, stage: StageModel) -> tuple[float, float]:
    """A stage's least cost per query/s served, and its cheapest replica's price.

    The first is price x share over full-batch throughput, at the best profile.
    """
    prices = {g: model.prices.get(g, 0.0) * stage.share for g in stage.profiles}
    per_qps = min(
        prices[g] / stage.throughput(g, b) for g in stage.profiles for b in stage.batches(g)
    )
    return per_qps, min(prices.values())


def _earliest_reach(model: PipelineModel) -> list[float]:
    """Seconds before a query can reach each stage at the earliest.

    The shortest path of batch-1 latencies on the fastest GPU types from the
    entry, the stage itself excluded.
    """
    own = [min(s.latency(g, 1) for g in s.profiles) for s in model.stages]
    reach = [0.0] + [math.inf] * (len(own) - 1)
    for src, dst, _ in sorted(model.edges, key=lambda e: e[1]):
        reach[dst] = min(reach[dst], reach[src] + own[src])
    return reach


def deadline_floor(
    model: PipelineModel, serving: FloatArray, *, seed: int, served_share: float = 0.99
) -> float:
    """A lower bound on the cost per hour of any policy that keeps `served_share` in the SLO.

    Tighter than `cost_floor`: capacity must be there when the queries are.

    Each stage is bounded alone, on the queries that visit it (the simulator's own visit
    draws for `seed`). A query that arrives at `t` cannot reach stage s before `t + r_s`
    (`r_s`: the shortest path of the fastest batch-1 latencies before it) and misses the
    SLO unless s has served it by `t + slo`. Time is cut into slots of `slo - r_s`, so a
    query reaching s in slot k is served in slot k or k + 1. Serving it takes at least
    1/throughput of a replica's time on the stage's cheapest profile, and every slot
    holds at least the stage's minimum replicas. A linear programme (GLOP) chooses which
    slot serves what and which queries to drop (at most `1 - served_share` of all queries
    per stage) at least cost. Replicas are fractional within a slot and may change at any
    instant, queues are free, and slots that end after the last arrival (the end of the
    billed span) cost nothing, so no policy costs less. (The simulator lets a retired
    replica finish its batch unbilled; that work is billed here.)
    """
    from ortools.linear_solver import pywraplp

    end = float(serving[-1]) if len(serving) else 0.0
    if end <= 0:
        return 0.0
    visited = stage_visits(model, len(serving), seed)
    reach = _earliest_reach(model)
    drops = math.floor((1 - served_share) * len(serving))
    total = 0.0
    for i, stage in enumerate(model.stages):
        per_qps, floor_price = _cheapest(model, stage)
        hold = max(stage.min_replicas, 1) * floor_price
        slot = model.slo_s - reach[i]
        if slot <= 0:
            raise ValueError(f"stage {stage.name} cannot be reached within the SLO")
        times = serving[visited[i]] + reach[i]
        slots = math.floor(float(times.max(initial=0.0)) / slot) + 2
        arrived = np.bincount(np.floor(times / slot).astype(np.int64), minlength=slots)
        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:  # pragma: no cover - GLOP ships with ortools
            raise RuntimeError("the GLOP LP solver is not available")
        now = [solver.NumVar(0, float(a), "") for a in arrived]
        later = [solver.NumVar(0, float(a), "") for a in arrived]
        dropped = [solver.NumVar(0, float(a), "") for a in arrived]
        for k, a in enumerate(arrived):
            solver.Add(now[k] + later[k] + dropped[k] == float(a))
        solver.Add(solver.Sum(dropped) <= drops)
        cost = []
        for j in range(slots):
            billed = min(max(end - j * slot, 0.0), slot)  # seconds of this slot before `end`
            if billed < slot:
                continue  # straddles or follows the end: free (the bound stays valid)
            rate = solver.NumVar(hold, solver.infinity(), "")  # cost per hour in this slot
            served = now[j] + (later[j - 1] if j > 0 else 0)
            solver.Add(rate >= served * (per_qps / slot))
            cost.append(rate * slot)
        solver.Minimize(solver.Sum(cost))
        if solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - always feasible
            raise RuntimeError(f"the deadline floor of stage {stage.name} did not solve")
        total += solver.Objective().Value() / end
    return total


def _gpu_hours(
    model: PipelineModel, config: Config, scheds: Sequence[Schedule], end: float
) -> tuple[float, float]:
    """GPU-hours held and their cost over [0, end)."""
    hours = cost = 0.0
    for st, c, sched in zip(model.stages, config, scheds, strict=True):
        price = model.prices.get(c.gpu_type, 0.0)
        for (t0, k), (t1, _) in zip(sched, [*sched[1:], (end, 0)], strict=True):
            h = k * st.share * max(0.0, min(t1, end) - t0) / 3600
            hours += h
            cost += h * price
    return hours, cost


def _with_past(planning: FloatArray, serving: FloatArray) -> FloatArray:
    """Serving arrivals with the planning part before them, at negative times.

    The serving part follows the planning part in the trace, so a rate window
    that reaches back past the start of serving sees planning traffic (as
    Prometheus would), not an empty stretch that reads as a sudden drop.
    """
    if len(planning) <= 1:
        return serving
    gap = float(planning[-1] - planning[0]) / (len(planning) - 1)
    past = planning - planning[-1] - gap
    out: FloatArray = np.concatenate([past, serving])
    return out


def run_policy(
    policy: str,
    model: PipelineModel,
    planning: FloatArray,
    serving: FloatArray,
    *,
    seed: int,
    cold_start_s: float = 0.0,
    tuner: TunerSettings | None = None,
) -> InferenceRun | Infeasible:
    """Plan on `planning` and serve `serving` (times from 0) with one policy."""
    tuner = tuner or TunerSettings()
    end = float(serving[-1]) if len(serving) else 0.0
    planner = plan_chronotope if policy == "chronotope" else plan_inferline
    plan = planner(model, planning, seed=seed)
    if isinstance(plan, Infeasible):
        return plan
    priced = model if policy == "chronotope" else whole_gpus(model)
    config = plan.config
    seen = _with_past(planning, serving)
    if policy == "peak":
        scheds = _peak_schedules(priced, config, serving)
    elif policy == "hpa":
        scheds = _hpa_schedules(priced, config, seen, end)
    elif policy == "inferline":
        scheds = inferline_tuner(priced, config, planning, arrivals=seen, end=end, settings=tuner)
    elif policy == "chronotope":
        scheds = operator_tuner(
            priced, config, planning, arrivals=seen, end=end, settings=tuner, seed=seed
        )
    else:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(INFERENCE_POLICIES)}")
    lat = simulate_schedules(priced, config, scheds, serving, cold_start_s=cold_start_s, seed=seed)
    hours, cost = _gpu_hours(priced, config, scheds, end)
    span_h = max(end / 3600, 1e-9)
    return InferenceRun(
        policy=policy,
        requests=len(serving),
        p99_ms=float(np.percentile(lat, 99)) * 1000,
        slo_miss_pct=float((lat > model.slo_s).mean()) * 100,
        cost_per_hour=cost / span_h,
        gpu_hours=hours,
        scale_events=sum(len(s) - 1 for s in scheds),
        config=tuple(
            StageConfig(c.gpu_type, c.batch, s[0][1]) for c, s in zip(config, scheds, strict=True)
        ),
        schedules=tuple(scheds),
        latencies_s=lat,
    )
