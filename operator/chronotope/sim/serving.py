"""Request-level simulator of many fine-tuned variants of one base on a fixed set of GPUs.

Each GPU runs one continuous-batching engine in vLLM 0.4's step order (the
engine DeltaZip forks): a step runs the prefill of every request it admits,
or, when it admits none, one decode iteration for every running request.
Steps cost what `planners.llmcost.CostModel` says (roofline: base once, each
distinct delta once, KV reads), and a step that needs weights not on the
GPU first waits for them (host to GPU, and disk to host on a host miss):
loading blocks the engine, as in DeltaZip's worker. Admission is FCFS and
reserves each request's prompt + output KV tokens (no preemption).
A request meets the SLO when its time to first token and its mean time per
output token are both within bounds; requests still unserved when the run
ends count as misses.

Policies (docs/variants.md says how each was checked against its source):

- `dedicated`: one full fine-tuned model per GPU at a time; variant of
  popularity rank r lives on GPU r mod G, which swaps whole models (host
  memory LRU, else disk) when its queue moves to another variant;
- `swap`: full-model swapping with LRU across all GPUs: a request goes to a
  GPU holding (or loading) its model, else to the least-loaded GPU;
- `deltazip`: the paper's engine per GPU behind a least-outstanding-requests
  load balancer: FCFS with skip, at most `max_deltas` distinct deltas per
  batch, GPU delta slots and host memory both LRU;
- `chronotope`: the variant planner's plan (`planners.variants.plan_group`,
  the code the operator runs): each GPU keeps its planned deltas resident,
  requests go to the least-loaded replica of their route (spilling to the
  least-loaded GPU when every routed replica is far behind), deltas not
  resident stay in host memory and load on their home replica; re-planned
  every `replan_s` on the rates seen.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from chronotope.planners.llmcost import CostModel, Tier
from chronotope.planners.variants import (
    GroupInput,
    GroupPlan,
    PlanSettings,
    RequestShape,
    VariantDemand,
    plan_group,
)

__all__ = [
    "SERVING_POLICIES",
    "ServingRun",
    "ServingSetup",
    "Slo",
    "Workload",
    "max_rate_at_slo",
    "simulate",
    "zipf_variants",
]

SERVING_POLICIES = ("dedicated", "swap", "deltazip", "chronotope")
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_PREFILL, _DECODE = 0, 1
MAX_SCALE = 2.0**20
"""`max_rate_at_slo` stops doubling the rate beyond this multiple of the trace's."""
ABORT_SHARE = 0.25
"""`stop_early` runs end once this share of the requests has missed the SLO."""


@dataclass(frozen=True)
class Slo:
    """Time to first token and mean time per output token bounds, in seconds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.15
    attainment: float = 0.99


@dataclass(frozen=True)
class ServingSetup:
    """The fleet and the engine limits every policy shares."""

    gpus: int
    cost: CostModel
    variants: int
    delta_mib: int = 1300
    max_deltas: int = 8
    max_batch: int = 256
    max_prefill_tokens: int = 8192
    slo: Slo = Slo()
    replan_s: float = 60.0
    settings: PlanSettings = field(default_factory=PlanSettings)


@dataclass(frozen=True)
class Workload:
    """Requests: arrival seconds, prompt and output tokens, variant (0 = most popular)."""

    times: FloatArray
    prompt: IntArray
    output: IntArray
    variant: IntArray

    def at_rate(self, qps: float) -> Workload:
        """The same requests with time stretched or squeezed to a mean rate of `qps`."""
        span = float(self.times[-1] - self.times[0])
        mean = (len(self.times) - 1) / span if span > 0 else qps
        return Workload(self.times * (mean / qps), self.prompt, self.output, self.variant)

    @property
    def qps(self) -> float:
        """Mean arrival rate."""
        span = float(self.times[-1] - self.times[0])
        return (len(self.times) - 1) / span if span > 0 else 0.0


def zipf_variants(count: int, variants: int, a: float, seed: int) -> IntArray:
    """Variant of each request: popularity rank r drawn with weight 1 / (r + 1)^a."""
    weights = 1.0 / np.arange(1, variants + 1, dtype=np.float64) ** a
    rng = np.random.default_rng(seed)
    out: IntArray = rng.choice(variants, size=count, p=weights / weights.sum()).astype(np.int64)
    return out


@dataclass(frozen=True)
class ServingRun:
    """One policy at one rate: SLO attainment, tails and swaps."""

    policy: str
    qps: float
    requests: int
    slo_attainment_pct: float
    p99_ttft_ms: float
    p99_latency_ms: float
    swaps_per_1k: float
    complete: bool = True
    """False when the run stopped early because the SLO could no longer be met."""


@dataclass
class _Gpu:
    index: int
    kv_cap: int
    slots: int
    waiting: list[int] = field(default_factory=list)
    running: dict[int, int] = field(default_factory=dict)  # request -> tokens left
    kv_used: int = 0
    deltas: Counter[int] = field(default_factory=Counter)  # running requests per delta
    cache: OrderedDict[int, float] = field(default_factory=OrderedDict)  # delta -> ready at
    pinned: set[int] = field(default_factory=set)
    model: int = -1  # full-model policies: the variant loaded
    busy: int = -1  # _PREFILL, _DECODE or -1 idle
    version: int = 0
    run_start: float = 0.0
    step_s: float = 0.0
    steps: int = 0
    admitted: list[int] = field(default_factory=list)

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)


class _Engine:
    """The event loop shared by every policy; policies decide routing, admission and loads."""

    def __init__(self, setup: ServingSetup, work: Workload, policy: _Policy) -> None:
        self.setup, self.work, self.policy = setup, work, policy
        n = len(work.times)
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.swaps = 0
        self.misses = 0
        self.gpus = [policy.make_gpu(i) for i in range(setup.gpus)]
        self.need = (work.prompt + work.output).astype(np.int64)

    def push(self, t: float, kind: int, gpu: _Gpu) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, gpu.index, gpu.version))

    def run(self, abort_after: int | None) -> bool:
        """Serve every request; False if more than `abort_after` missed (stopped early)."""
        times = self.work.times
        n, i = len(times), 0
        horizon = float(times[-1]) + 600.0 if n else 0.0
        while i < n or self.heap:
            if i < n and (not self.heap or times[i] <= self.heap[0][0]):
                t = float(times[i])
                self.policy.tick(self, t)
                gpu = self.gpus[self.policy.route(self, i, t)]
                if self.need[i] > gpu.kv_cap:  # can never fit its KV cache: refused, a miss
                    self.misses += 1
                    i += 1
                    continue
                gpu.waiting.append(i)
                if gpu.busy < 0:
                    self.step(gpu, t)
                elif gpu.busy == _DECODE and self.policy.admissible(self, gpu, i):
                    self.interrupt(gpu, t)
                i += 1
                continue
            t, _, kind, index, version = heapq.heappop(self.heap)
            if t > horizon:
                break
            gpu = self.gpus[index]
            if version != gpu.version:
                continue
            if kind == _PREFILL:
                self.end_prefill(gpu, t)
            else:
                self.end_decode(gpu, t, gpu.steps)
            self.step(gpu, t)
            if abort_after is not None and self.misses > abort_after:
                return False
        return True

    def step(self, gpu: _Gpu, t: float) -> None:
        """Start the GPU's next step at `t`: a prefill if it admits anything, else a decode."""
        gpu.version += 1
        cost = self.setup.cost
        admitted = self.policy.admit(self, gpu) if gpu.waiting else []
        if admitted:
            load = self.policy.prepare(self, gpu, admitted, t)
            fresh = {self.policy.delta_of(self, r) for r in admitted} - {-1}
            tokens = float(self.work.prompt[admitted].sum())
            dur = load + cost.iteration_s(
                tokens, 0, 0, len(fresh) * self.setup.delta_mib, len(fresh)
            )
            for r in admitted:
                gpu.running[r] = int(self.work.output[r])
                gpu.kv_used += int(self.need[r])
                d = self.policy.delta_of(self, r)
                if d >= 0:
                    gpu.deltas[d] += 1
            gpu.admitted = admitted
            gpu.busy = _PREFILL
            self.push(t + dur, _PREFILL, gpu)
            return
        if not gpu.running:
            gpu.busy = -1
            return
        batch = len(gpu.running)
        kv = sum(float(self.work.prompt[r]) + float(self.work.output[r]) / 2 for r in gpu.running)
        distinct = len(gpu.deltas)
        gpu.step_s = cost.iteration_s(0, batch, kv, distinct * self.setup.delta_mib, distinct)
        gpu.steps = min(gpu.running.values())
        gpu.run_start = t
        gpu.busy = _DECODE
        self.push(t + gpu.steps * gpu.step_s, _DECODE, gpu)

    def interrupt(self, gpu: _Gpu, t: float) -> None:
        """A request that could join arrived mid-run: stop the run after the current step."""
        done = max(1, math.ceil((t - gpu.run_start) / gpu.step_s - 1e-9))
        if done >= gpu.steps:
            return
        gpu.version += 1
        gpu.steps = done
        self.push(gpu.run_start + done * gpu.step_s, _DECODE, gpu)

    def end_prefill(self, gpu: _Gpu, t: float) -> None:
        slo = self.setup.slo
        for r in gpu.admitted:
            self.first[r] = t
            if t - self.work.times[r] > slo.ttft_s:
                self.misses += 1
            gpu.running[r] -= 1
            if gpu.running[r] <= 0:
                self.complete(gpu, r, t)
        gpu.admitted = []

    def end_decode(self, gpu: _Gpu, t: float, steps: int) -> None:
        for r in list(gpu.running):
            left = gpu.running[r] - steps
            gpu.running[r] = left
            if left <= 0:
                self.complete(gpu, r, t)

    def complete(self, gpu: _Gpu, r: int, t: float) -> None:
        del gpu.running[r]
        gpu.kv_used -= int(self.need[r])
        self.finish[r] = t
        d = self.policy.delta_of(self, r)
        if d >= 0:
            gpu.deltas[d] -= 1
            if gpu.deltas[d] <= 0:
                del gpu.deltas[d]
        out = int(self.work.output[r])
        ttft = self.first[r] - self.work.times[r]
        slow = out > 1 and (t - self.first[r]) / (out - 1) > self.setup.slo.tpot_s
        if ttft <= self.setup.slo.ttft_s and slow:  # a late first token was counted already
            self.misses += 1


class _Policy:
    """Routing, admission and weight loading; the base class is DeltaZip's engine."""

    name = "deltazip"

    def __init__(self, setup: ServingSetup, work: Workload) -> None:
        self.setup = setup
        self.host: OrderedDict[int, None] = OrderedDict()
        self.host_cap = max(1, setup.cost.tiers.host_mib // self.weights_mib)
        # warm start: weights staged in host memory at start-up, most popular first
        for d in range(min(self.host_cap, setup.variants)):
            self.host[d] = None

    @property
    def weights_mib(self) -> int:
        """Size of what is swapped: a delta."""
        return self.setup.delta_mib

    def make_gpu(self, index: int) -> _Gpu:
        slots = self.setup.max_deltas
        kv = self.setup.cost.kv_tokens(slots * self.setup.delta_mib)
        gpu = _Gpu(index, kv, slots)
        for d in range(min(slots, self.setup.variants)):  # warm: what LRU converges to
            gpu.cache[d] = 0.0
        return gpu

    def delta_of(self, eng: _Engine, r: int) -> int:
        return int(eng.work.variant[r])

    def tick(self, eng: _Engine, t: float) -> None:
        """Called at each arrival, before routing."""

    def route(self, eng: _Engine, r: int, t: float) -> int:
        return min(eng.gpus, key=lambda g: (g.outstanding(), g.index)).index

    def admissible(self, eng: _Engine, gpu: _Gpu, r: int) -> bool:
        d = self.delta_of(eng, r)
        fits = gpu.kv_used + eng.need[r] <= gpu.kv_cap and len(gpu.running) < self.setup.max_batch
        return bool(fits and (d in gpu.deltas or len(gpu.deltas) < self.setup.max_deltas))

    def admit(self, eng: _Engine, gpu: _Gpu) -> list[int]:
        """FCFS with skip: a request whose delta would exceed `max_deltas` waits its turn."""
        st = self.setup
        distinct = set(gpu.deltas)
        kv, tokens, batch = gpu.kv_used, 0, len(gpu.running)
        out: list[int] = []
        keep: list[int] = []
        for pos, r in enumerate(gpu.waiting):
            need = int(eng.need[r])
            prompt = int(eng.work.prompt[r])
            if batch >= st.max_batch or kv + need > gpu.kv_cap:
                keep.extend(gpu.waiting[pos:])
                break
            if out and tokens + prompt > st.max_prefill_tokens:
                keep.extend(gpu.waiting[pos:])
                break
            d = self.delta_of(eng, r)
            if d not in distinct and len(distinct) >= st.max_deltas:
                keep.append(r)
                continue
            distinct.add(d)
            out.append(r)
            kv, tokens, batch = kv + need, tokens + prompt, batch + 1
        gpu.waiting = keep
        return out

    def prepare(self, eng: _Engine, gpu: _Gpu, admitted: Sequence[int], t: float) -> float:
        """Bring the admitted requests' deltas to the GPU; seconds the step waits for them."""
        wait = 0.0
        for d in {self.delta_of(eng, r) for r in admitted}:
            if d in gpu.cache:
                gpu.cache.move_to_end(d)
                wait = max(wait, gpu.cache[d] - t)
                continue
            wait += self._load(eng, d)
            self._evict(gpu)
            gpu.cache[d] = t
        return max(0.0, wait)

    def _load(self, eng: _Engine, d: int) -> float:
        eng.swaps += 1
        cost, size = self.setup.cost, self.setup.delta_mib
        if d in self.host:
            self.host.move_to_end(d)
            return cost.load_s(size, Tier.HOST)
        self.host[d] = None
        while len(self.host) > self.host_cap:
            self.host.popitem(last=False)
        return cost.load_s(size, Tier.DISK)

    def _evict(self, gpu: _Gpu) -> None:
        """Make room for one more delta: least recently used, not running, not pinned."""
        while len(gpu.cache) >= gpu.slots:
            victim = next(
                (d for d in gpu.cache if d not in gpu.deltas and d not in gpu.pinned), None
            )
            if victim is None:
                return
            del gpu.cache[victim]


class _Chronotope(_Policy):
    name = "chronotope"

    def __init__(self, setup: ServingSetup, work: Workload) -> None:
        super().__init__(setup, work)
        weights = np.bincount(work.variant, minlength=setup.variants).astype(np.float64)
        # the rates a user declares in spec.traffic: the popularity law, not the trace
        ranks = 1.0 / np.arange(1, setup.variants + 1, dtype=np.float64)
        declared = ranks / ranks.sum() * work.qps
        self.rates = declared
        self.seen = np.zeros(setup.variants)
        self.next_plan = setup.replan_s
        self.window_start = 0.0
        self.plan: GroupPlan | None = None
        self.spill_after = 2
        self.routes: list[tuple[int, ...]] = []
        del weights
        self.make_plan(None, 0.0)

    def make_plan(self, eng: _Engine | None, t: float) -> None:
        st = self.setup
        variants = tuple(
            VariantDemand(f"v{i}", st.delta_mib, float(self.rates[i]), st.slo.ttft_s * 1000)
            for i in range(st.variants)
        )
        plan = plan_group(
            GroupInput(
                "sim",
                st.cost.shape,
                variants,
                {st.cost.gpu.name: (st.cost.gpu, st.gpus)},
                request=self.request,
                tiers=st.cost.tiers,
                settings=st.settings,
                replicas=st.gpus,
                previous=self.plan,
            )
        )
        if not isinstance(plan, GroupPlan):
            raise ValueError(plan.message)
        self.plan = plan
        self.routes = [plan.placements[f"v{i}"].replicas for i in range(st.variants)]
        self.resident = {
            i for i in range(st.variants) if plan.placements[f"v{i}"].residency is Tier.GPU
        }
        if eng is None:
            return
        for gpu, replica in zip(eng.gpus, plan.replicas, strict=True):
            self._pin(eng, gpu, {int(v[1:]) for v in replica.resident}, t)

    @property
    def request(self) -> RequestShape:
        return RequestShape(tpot_slo_ms=self.setup.slo.tpot_s * 1000)

    def make_gpu(self, index: int) -> _Gpu:
        assert self.plan is not None
        slots = self.plan.slots + 1  # one spare slot for deltas loaded on demand
        kv = self.setup.cost.kv_tokens(slots * self.setup.delta_mib)
        gpu = _Gpu(index, kv, slots)
        for v in self.plan.replicas[index].resident:
            d = int(v[1:])
            gpu.pinned.add(d)
            gpu.cache[d] = 0.0
            self.host[d] = None
        return gpu

    def _pin(self, eng: _Engine, gpu: _Gpu, want: set[int], t: float) -> None:
        """Move to a new resident set in the background: new deltas ready after their copy."""
        gpu.pinned = want
        ready = t
        for d in sorted(want - set(gpu.cache)):
            ready += self._load(eng, d)
            self._evict(gpu)
            gpu.cache[d] = ready

    def tick(self, eng: _Engine, t: float) -> None:
        if t < self.next_plan:
            return
        span = max(1e-9, t - self.window_start)
        self.rates = 0.5 * self.rates + 0.5 * self.seen / span
        self.seen[:] = 0
        self.window_start = t
        self.next_plan = t + self.setup.replan_s
        self.make_plan(eng, t)

    def route(self, eng: _Engine, r: int, t: float) -> int:
        d = int(eng.work.variant[r])
        self.seen[d] += 1
        idle = min(eng.gpus, key=lambda g: (len(g.waiting), g.outstanding(), g.index))
        if d not in self.resident:  # loaded on demand anyway: wherever it waits least
            return idle.index
        holders = [eng.gpus[i] for i in self.routes[d]]
        best = min(holders, key=lambda g: (len(g.waiting), g.outstanding(), g.index))
        # spill when every routed replica has a queue and another GPU has none
        if len(best.waiting) > len(idle.waiting) + self.spill_after:
            return idle.index
        return best.index


class _FullModel(_Policy):
    """Whole fine-tuned models, one per GPU at a time; `dedicated` pins variants to GPUs."""

    def __init__(self, setup: ServingSetup, work: Workload, name: str) -> None:
        self.name = name
        super().__init__(setup, work)

    @property
    def weights_mib(self) -> int:
        """Size of what is swapped: a whole model."""
        return self.setup.cost.shape.weight_mib

    def make_gpu(self, index: int) -> _Gpu:
        gpu = _Gpu(index, self.setup.cost.kv_tokens(0), 1)
        if index < self.setup.variants:  # warm: the most popular model it would serve
            gpu.model = index
            gpu.cache[index] = 0.0
        return gpu

    def delta_of(self, eng: _Engine, r: int) -> int:
        return -1  # a full model: no delta in the batch

    def route(self, eng: _Engine, r: int, t: float) -> int:
        v = int(eng.work.variant[r])
        if self.name == "dedicated":
            return v % len(eng.gpus)
        holders = [g for g in eng.gpus if g.model == v]
        pool = holders or eng.gpus
        return min(pool, key=lambda g: (g.outstanding(), g.index)).index

    def admissible(self, eng: _Engine, gpu: _Gpu, r: int) -> bool:
        fits = gpu.kv_used + eng.need[r] <= gpu.kv_cap and len(gpu.running) < self.setup.max_batch
        return bool(fits and int(eng.work.variant[r]) == gpu.model)

    def admit(self, eng: _Engine, gpu: _Gpu) -> list[int]:
        """The loaded model's requests in FCFS order; switch models only when it has none."""
        variant = eng.work.variant
        if not gpu.running and not any(int(variant[r]) == gpu.model for r in gpu.waiting):
            gpu.model = int(variant[gpu.waiting[0]])
            gpu.cache.clear()
        st = self.setup
        kv, tokens, batch = gpu.kv_used, 0, len(gpu.running)
        out: list[int] = []
        keep: list[int] = []
        for pos, r in enumerate(gpu.waiting):
            if int(variant[r]) != gpu.model:
                keep.append(r)
                continue
            need, prompt = int(eng.need[r]), int(eng.work.prompt[r])
            stop = batch >= st.max_batch or kv + need > gpu.kv_cap
            if stop or (out and tokens + prompt > st.max_prefill_tokens):
                keep.extend(gpu.waiting[pos:])
                break
            out.append(r)
            kv, tokens, batch = kv + need, tokens + prompt, batch + 1
        gpu.waiting = keep
        return out

    def prepare(self, eng: _Engine, gpu: _Gpu, admitted: Sequence[int], t: float) -> float:
        if gpu.cache:
            return 0.0
        gpu.cache[gpu.model] = t
        eng.swaps += 1
        cost, size = self.setup.cost, self.setup.cost.shape.weight_mib
        if gpu.model in self.host:
            self.host.move_to_end(gpu.model)
            return cost.load_s(size, Tier.HOST)
        self.host[gpu.model] = None
        while len(self.host) > self.host_cap:
            self.host.popitem(last=False)
        return cost.load_s(size, Tier.DISK)


def _policy(name: str, setup: ServingSetup, work: Workload) -> _Policy:
    if name == "deltazip":
        return _Policy(setup, work)
    if name == "chronotope":
        return _Chronotope(setup, work)
    if name in ("dedicated", "swap"):
        return _FullModel(setup, work, name)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(SERVING_POLICIES)}")


def simulate(
    policy: str, setup: ServingSetup, work: Workload, *, stop_early: bool = False
) -> ServingRun:
    """Serve `work` with `policy`; with `stop_early`, stop once the SLO target is out of reach."""
    engine = _Engine(setup, work, _policy(policy, setup, work))
    n = len(work.times)
    # stop once a quarter of the requests missed: far below any SLO target, and the
    # runs that end above that still give a curve of attainment against rate
    budget = int(n * max(1 - setup.slo.attainment, ABORT_SHARE)) if stop_early else None
    complete = engine.run(budget)
    first = engine.first - work.times
    latency = engine.finish - work.times
    out = work.output
    tpot = np.where(out > 1, (engine.finish - engine.first) / np.maximum(out - 1, 1), 0.0)
    served = ~np.isnan(engine.finish)
    ok = served & (first <= setup.slo.ttft_s) & (tpot <= setup.slo.tpot_s)
    worst = np.where(served, first, np.inf)
    worst_latency = np.where(served, latency, np.inf)
    return ServingRun(
        policy,
        round(work.qps, 3),
        n,
        round(100.0 * float(ok.sum()) / n, 2) if complete else 0.0,
        _p99_ms(worst),
        _p99_ms(worst_latency),
        round(1000.0 * engine.swaps / n, 1),
        complete,
    )


def _p99_ms(values: FloatArray) -> float:
    p = float(np.percentile(values, 99, method="higher"))
    return round(p * 1000, 1) if math.isfinite(p) else math.inf


def max_rate_at_slo(
    policy: str,
    setup: ServingSetup,
    work: Workload,
    *,
    rel_tol: float = 0.03,
    min_qps: float = 0.01,
) -> tuple[float, list[ServingRun]]:
    """The highest mean rate (time axis rescaled) at which the SLO share is met, and every run.

    Doubles or halves from the trace's own rate to bracket it, then bisects
    to `rel_tol`; 0 when even `min_qps` misses.
    """

    def passes(qps: float) -> bool:
        run = simulate(policy, setup, work.at_rate(qps), stop_early=True)
        runs.append(run)
        return run.complete and run.slo_attainment_pct >= 100 * setup.slo.attainment

    runs: list[ServingRun] = []
    rate = work.qps
    if passes(rate):
        lo, hi = rate, rate * 2
        while passes(hi):
            if hi > rate * MAX_SCALE:  # never fails: no boundary to find (a trivial trace)
                return round(hi, 3), runs
            lo, hi = hi, hi * 2
    else:
        hi, lo = rate, rate / 2
        while not passes(lo):
            if lo < min_qps:
                return 0.0, runs
            hi, lo = lo, lo / 2
    while (hi - lo) / lo > rel_tol:
        mid = (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return round(lo, 3), runs
