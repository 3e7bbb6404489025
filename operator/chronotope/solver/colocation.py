"""Interference-aware co-location of GPU shares (Orion-style), a filter on every share placement.

A share that states a priority (High: latency-critical; BestEffort: fills
what is left) and a profile (compute-bound, memory-bound, unknown) may only
take a GPU whose other shares it does not slow down beyond a budget (default
1.10x), by the interference model of `planners.interference` (the declared
profile stands for the kernel stream: `class_trace`). The rules, for the GPU
a share would take:

* a High share beside another High share: each one's predicted slowdown
  beside the others, each co-runner at its compute percent, fits the budget;
* a High share beside BestEffort shares: its predicted slowdown with their
  current (possibly bounded) percents fits the budget;
* a BestEffort share beside High shares gets the largest MPS percentage that
  keeps every High share within the budget (`best_effort_share`), at most
  what it asked; if even the smallest step does not fit, the GPU is refused.

Under `runtime="gated"` (nodes that run an Orion-style kernel-level runtime)
a High share's slowdown beside a BestEffort one, and the BestEffort share's
percent, come from replaying both streams through that runtime
(`kernel_replay.gated_slowdown`, `gated_share`) instead of the static-cap
expectation. With several co-runners the extra time adds up
(`1 + sum(s_i - 1)`), which is conservative for kernels that do not all
overlap. A GPU refused carries a
`Reason` naming the GPU, the share it would hurt and the numbers; that text
reaches the extender's filter answer and kube-scheduler's events.

The policies are not changed: `choose` hands a policy a view of the state in
which refused GPUs have no room (`ClusterState.masked`), so the
fragmentation objective still ranks what is left, and a node with no usable
GPU is no candidate. The Chronotope policy breaks ties toward complementary
profiles (`complement_key`). Shares without a priority (trace replays) pass
untouched. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.planners.interference import (
    DEFAULT,
    KernelTrace,
    best_effort_share,
    class_trace,
    predict_slowdown,
)
from chronotope.planners.kernel_replay import Estimator, gated_share, gated_slowdown
from chronotope.solver.model import Reason, percent_milli
from chronotope.solver.policies import Context, Policy
from chronotope.solver.state import BoolArray, ClusterState, IntArray, PodSpec, ShareTag

__all__ = [
    "DEFAULT_BUDGET",
    "RUNTIMES",
    "Colocation",
    "Decision",
    "choose",
    "complement_key",
    "gpu_verdict",
    "node_refusal",
    "usable_gpus",
]

DEFAULT_BUDGET = 1.10
"""Largest predicted slowdown of a High share that co-location may cause (1.10x)."""

RUNTIMES = ("mps", "gated")
"""What runs the shares on a node: MPS alone (static caps), or an Orion-style runtime on top."""

STEP = 10
"""MPS percentages a BestEffort share is bounded to are multiples of this."""

_EPS = 1e-9
_MEMO_LIMIT = 100_000

TraceFn = Callable[[WorkloadProfile], KernelTrace]


def _class_trace(profile: WorkloadProfile) -> KernelTrace:
    return class_trace(profile.value, profile.value)


def budget_error(budget: float) -> str | None:
    """Why `budget` is not a usable slowdown budget, or None when it is."""
    if not budget >= 1.0:  # NaN too
        return (
            f"interference budget {budget:g}x is below 1x: a High share can never run faster "
            "than alone, so no GPU could be shared at all; use 1.0 or more (default 1.10)"
        )
    return None


@dataclass(frozen=True)
class Colocation:
    """The co-location rules' settings: the slowdown budget and the kernel stream per profile.

    A budget below 1 raises `ValueError` (it admits nothing; never ignored).
    """

    budget: float = DEFAULT_BUDGET
    trace: TraceFn = _class_trace
    """The kernel stream that stands for a share of this profile."""
    runtime: str = "mps"
    """`mps`: a BestEffort share is held to a static MPS percent all the time (the model:
    `best_effort_share`). `gated`: the nodes run an Orion-style kernel-level runtime that
    holds BestEffort kernels back while a High request is in service (the model:
    `kernel_replay.gated_share`, on the estimator's planning replay)."""
    estimator: Estimator = field(default_factory=Estimator)
    """The `gated` runtime's planning replay (High load, requests, thresholds)."""
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Refuse a budget below 1 with the reason."""
        why = budget_error(self.budget)
        if why is not None:
            raise ValueError(why)
        if self.runtime not in RUNTIMES:
            raise ValueError(
                f"co-location runtime {self.runtime!r} is not one of {', '.join(RUNTIMES)}"
            )

    # ------------------------------------------------------------ the model, memoised
    def _cached(self, key: tuple[object, ...], compute: Callable[[], object]) -> object:
        if key not in self._memo:
            if len(self._memo) > _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = compute()
        return self._memo[key]

    def pair(
        self,
        victim: WorkloadProfile,
        corunner: WorkloadProfile,
        percent: int,
        corunner_priority: SharePriority = SharePriority.HIGH,
    ) -> float:
        """Predicted slowdown of a `victim` workload beside one `corunner` at `percent` of SMs.

        Under the `gated` runtime a BestEffort co-runner's kernels are held
        back while the victim serves, so its prediction is the gated replay's.
        """
        gated = self.runtime == "gated" and corunner_priority is SharePriority.BEST_EFFORT

        def compute() -> float:
            hp, other = self.trace(victim), self.trace(corunner)
            if gated:
                return gated_slowdown(hp, other, percent, DEFAULT, est=self.estimator)[0]
            return predict_slowdown(hp, other, percent / 100)

        value = self._cached(("pair", victim, corunner, percent, gated), compute)
        assert isinstance(value, float)
        return value

    def slowdown(self, victim: WorkloadProfile, others: Sequence[ShareTag]) -> float:
        """Predicted slowdown of `victim` beside all `others`: the extra times add up."""
        return 1.0 + sum(self.pair(victim, o.profile, o.percent, o.priority) - 1.0 for o in others)

    def _share(self, hp: WorkloadProfile, be: WorkloadProfile, room: float) -> int | None:
        """Largest MPS percentage for `be` keeping `hp` within `room`, None if none does."""
        key = ("share", hp, be, round(room, 9))

        def compute() -> int | None:
            if self.runtime == "gated":
                hp_trace, be_trace = self.trace(hp), self.trace(be)
                plan = gated_share(hp_trace, be_trace, room, DEFAULT, est=self.estimator)
                return None if plan is None else plan.percent
            got = best_effort_share(self.trace(hp), self.trace(be), room, step=STEP)
            return None if isinstance(got, Reason) else got[0]

        value = self._cached(key, compute)
        assert value is None or isinstance(value, int)
        return value

    # ------------------------------------------------------------ the rules
    def admit(self, holders: tuple[ShareTag, ...], pod: ShareTag) -> int | Reason:
        """The compute percent `pod` may take on a GPU holding `holders`, or why not."""
        if pod.priority is SharePriority.HIGH:
            why = self._high_refusal(holders, pod)
            return pod.percent if why is None else why
        return self._best_effort_percent(holders, pod)

    def _high_refusal(self, holders: tuple[ShareTag, ...], pod: ShareTag) -> Reason | None:
        """Why a High `pod` may not join `holders`: the worst High share over the budget."""
        everyone = (*holders, pod)
        worst: tuple[float, ShareTag, tuple[ShareTag, ...]] | None = None
        for i, hp in enumerate(everyone):
            if hp.priority is not SharePriority.HIGH:
                continue
            others = everyone[:i] + everyone[i + 1 :]
            predicted = self.slowdown(hp.profile, others)
            if predicted > self.budget + _EPS and (worst is None or predicted > worst[0]):
                worst = (predicted, hp, others)
        if worst is None:
            return None
        predicted, hp, others = worst
        # the share it would hurt (an existing High one), or what would hurt it
        culprits = hp.describe() if hp is not pod else _describe(others)
        return _over(f"{culprits} beside it: predicted slowdown {_times(predicted)}", self.budget)

    def _best_effort_percent(self, holders: tuple[ShareTag, ...], pod: ShareTag) -> int | Reason:
        """`pod`'s percent, bounded so that every High holder stays within the budget."""
        allowed = pod.percent
        for i, hp in enumerate(holders):
            if hp.priority is not SharePriority.HIGH:
                continue
            others = holders[:i] + holders[i + 1 :]
            already = self.slowdown(hp.profile, others) - 1.0
            share = self._share(hp.profile, pod.profile, self.budget - already)
            if share is None:
                if self.runtime == "gated":
                    return _over(
                        f"{hp.describe()} beside it: no MPS percent keeps its predicted "
                        "slowdown within the budget with the best-effort share doing at least "
                        f"{self.estimator.min_progress:g} of its work alone,",
                        self.budget,
                    )
                floor = already + self.pair(hp.profile, pod.profile, STEP, pod.priority)
                return _over(
                    f"{hp.describe()} beside it: predicted slowdown {_times(floor)} "
                    f"even at {STEP} percent of the SMs",
                    self.budget,
                )
            allowed = min(allowed, share)
        return allowed


def _describe(tags: Sequence[ShareTag]) -> str:
    return ", ".join(f"{t.describe()} ({_kebab(t.profile)}, {t.percent} percent)" for t in tags)


def _kebab(profile: WorkloadProfile) -> str:
    return {
        WorkloadProfile.COMPUTE_BOUND: "compute-bound",
        WorkloadProfile.MEMORY_BOUND: "memory-bound",
    }.get(profile, "unknown profile")


def _times(slowdown: float) -> str:
    """A predicted slowdown over the budget, rounded up so it never reads as within it."""
    return f"{math.ceil(slowdown * 100 - 1e-6) / 100:.2f}x"


def _over(what: str, budget: float) -> Reason:
    # no "%" anywhere: kube-scheduler passes extender reasons through Go fmt
    return Reason(code="InterferenceOverBudget", message=f"{what} over the {budget:.2f}x budget")


# ---------------------------------------------------------------- per GPU and node
def gpu_verdict(
    rules: Colocation, state: ClusterState, node: int, gpu: int, pod: PodSpec
) -> int | Reason:
    """The compute percent `pod` may take on this GPU (its own if no rule binds), or why not."""
    tag = pod.tag()
    holders = state.shares.get((node, gpu), ())
    if tag is None or not holders:
        return pod.percent
    got = rules.admit(holders, tag)
    if isinstance(got, Reason):
        return got.model_copy(
            update={"message": f"gpu {gpu} of {state.names[node]}: {got.message}"}
        )
    return got


def _bound_gpus(state: ClusterState, pod: PodSpec) -> set[tuple[int, int]]:
    """GPUs where a rule may bind for `pod`: any tagged share for a High pod, else High ones."""
    if pod.tag() is None:
        return set()
    if pod.priority is SharePriority.HIGH:
        return set(state.shares)
    return state.high


def usable_gpus(
    rules: Colocation, state: ClusterState, node: int, pod: PodSpec
) -> list[int] | Reason:
    """The GPUs of `node` with room for the share that the rules let it take, or why none."""
    fits = [g for g in range(int(state.gpu_count[node])) if state.gpu_fits(node, g, pod)]
    watched = _bound_gpus(state, pod)
    if not watched:
        return fits
    usable: list[int] = []
    refused: list[Reason] = []
    for g in fits:
        got = gpu_verdict(rules, state, node, g, pod) if (node, g) in watched else pod.percent
        if isinstance(got, Reason):
            refused.append(got)
        else:
            usable.append(g)
    if usable or not refused:
        return usable
    return Reason(code="InterferenceOverBudget", message="; ".join(r.message for r in refused))


def node_refusal(rules: Colocation, state: ClusterState, node: int, pod: PodSpec) -> Reason | None:
    """Why the rules refuse every GPU of `node` with room for the share, or None."""
    got = usable_gpus(rules, state, node, pod) if pod.is_share else []
    return got if isinstance(got, Reason) else None


@dataclass(frozen=True)
class _Screen:
    cand: IntArray
    usable: BoolArray | None
    """[nodes, GPUs]: False where a rule refuses the pod; None when no rule refused any."""


def _screen(rules: Colocation, state: ClusterState, pod: PodSpec, cand: IntArray) -> _Screen:
    """The candidates the rules leave, and the GPUs they refuse."""
    watched = _bound_gpus(state, pod) if pod.is_share else set()
    if not watched:
        return _Screen(cand, None)
    in_cand = set(cand.tolist())
    refused = [
        (n, g)
        for n, g in watched
        if n in in_cand
        and state.gpu_fits(n, g, pod)
        and isinstance(gpu_verdict(rules, state, n, g, pod), Reason)
    ]
    if not refused:
        return _Screen(cand, None)
    usable = np.ones(state.gpu_left.shape, dtype=np.bool_)
    for n, g in refused:
        usable[n, g] = False
    room = (state.gpu_left >= pod.milli) & (state.gpu_mem_left >= pod.gpu_mem) & usable
    keep = room[cand].any(axis=1)
    return _Screen(cand[keep], usable)


@dataclass(frozen=True)
class Decision:
    """A policy's choice that the rules allow: node, GPUs, and the pod as placed.

    `pod` is the request with a BestEffort share's compute bounded by the rules
    (the request itself when nothing bounds it): what to `assign`.
    """

    node: int
    gpus: tuple[int, ...]
    pod: PodSpec


def choose(
    policy: Policy, ctx: Context, pod: PodSpec, cand: IntArray, rules: Colocation
) -> Decision | None:
    """The policy's node and GPUs among `cand` under the co-location rules; None if none allow.

    A share takes the policy's GPU, or, where that GPU lacks the device memory
    (the openb policies do not look at it), the tightest usable GPU with room.
    """
    screen = _screen(rules, ctx.state, pod, cand)
    if len(screen.cand) == 0:
        return None
    st = ctx.state
    view = st if screen.usable is None else st.masked(screen.usable)
    node, gpus = policy.choose(ctx if view is st else replace(ctx, state=view), pod, screen.cand)
    if not pod.is_share:
        return Decision(node, gpus, pod)
    if not view.gpu_fits(node, gpus[0], pod):
        gpus = (view.tightest_gpu(node, pod.milli, pod.gpu_mem),)
    percent = gpu_verdict(rules, st, node, gpus[0], pod)
    if isinstance(percent, Reason) or percent == pod.percent:  # a Reason cannot happen here
        return Decision(node, gpus, pod)
    return Decision(node, gpus, replace(pod, milli=percent_milli(percent)))


def complement_key(
    state: ClusterState, pod: PodSpec, nodes: IntArray, gpus: IntArray
) -> tuple[IntArray, IntArray] | None:
    """Tie-break toward complementary profiles for a share's (node, GPU) candidates.

    Per candidate: the number of shares of the pod's profile minus those of the
    opposite profile on the best GPU of that node with the same free share as
    the candidate's (lower first), and that GPU. GPUs with equal free share
    change fragmentation equally, so the swap never costs the objective. None
    when nothing can differ (the pod states no priority or known profile, or no
    GPU holds a tagged share): a policy then leaves its order alone.
    """
    opposite = {
        WorkloadProfile.COMPUTE_BOUND: WorkloadProfile.MEMORY_BOUND,
        WorkloadProfile.MEMORY_BOUND: WorkloadProfile.COMPUTE_BOUND,
    }.get(pod.profile)
    if opposite is None or pod.priority is None or not state.shares:
        return None
    shared_nodes = {n for n, _ in state.shares}
    key = np.zeros(len(nodes), dtype=np.int64)
    best = gpus.copy()
    for k, (n, g) in enumerate(zip(nodes.tolist(), gpus.tolist(), strict=True)):
        if n not in shared_nodes:
            continue
        left = state.gpu_left[n]
        scores = []
        for other in np.flatnonzero(left[: state.gpu_count[n]] == left[g]).tolist():
            tags = state.shares.get((n, other), ())
            scores.append(
                (sum((t.profile is pod.profile) - (t.profile is opposite) for t in tags), other)
            )
        key[k], best[k] = min(scores)
    return key, best
