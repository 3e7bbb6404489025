"""Co-location rules for GPU shares: the budget, bounded best-effort shares, the tie-break.

Numbers come from the interference model itself (`Colocation.pair`,
`best_effort_share`), so the tests check the rules, not today's constants.
"""

from __future__ import annotations

import numpy as np
import pytest

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.planners.interference import (
    best_effort_share,
)
from chronotope.solver.cache import ClusterCache, NodeInfo
from chronotope.solver.colocation import (
    DEFAULT_BUDGET,
    Colocation,
    choose,
    complement_key,
    gpu_verdict,
)
from chronotope.solver.frag import FragModel, FragTracker, TypicalPod
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.model import ClusterSnapshot, Node, Placement, PodRequest, Reason
from chronotope.solver.policies import Context, Fgd
from chronotope.solver.state import ClusterState, ShareTag
from tests.kernel_streams import greedy, long_request

HIGH, BE = SharePriority.HIGH, SharePriority.BEST_EFFORT
CB, MB, UNK = (
    WorkloadProfile.COMPUTE_BOUND,
    WorkloadProfile.MEMORY_BOUND,
    WorkloadProfile.UNKNOWN,
)


def share(
    name: str, priority: SharePriority | None, profile: WorkloadProfile, percent: int
) -> PodRequest:
    return PodRequest(
        name=name,
        num_gpus=1,
        gpu_milli=percent * 10,
        gpu_priority=priority,
        gpu_profile=profile,
    )


def cache(rules: Colocation, gpus: int = 1, nodes: tuple[str, ...] = ("n1",)) -> ClusterCache:
    typical = [TypicalPod(cpu=0, milli=500, num_gpus=1, gpu_models="", freq=1.0)]
    c = ClusterCache(typical=typical, colocation=rules, tie_order=nodes)
    for name in nodes:
        c.upsert_node(NodeInfo(name, gpu_model="T4", gpu_count=gpus))
    return c


def place(c: ClusterCache, req: PodRequest, nodes: tuple[str, ...] = ("n1",)) -> Placement:
    got = c.place(req.name, req, list(nodes), Chronotope(), now=0.0)
    assert isinstance(got, Placement), got
    return got


def refused(c: ClusterCache, req: PodRequest, node: str = "n1") -> Reason:
    got = c.place(req.name, req, [node], Chronotope(), now=0.0)
    assert isinstance(got, dict), got
    return got[node]


def tag(name: str, priority: SharePriority, profile: WorkloadProfile, pct: int) -> ShareTag:
    return ShareTag(name, priority, profile, pct)


# ---------------------------------------------------------------- the rules as a table
def test_a_budget_below_one_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"budget 0\.95x is below 1x"):
        Colocation(budget=0.95)
    with pytest.raises(ValueError, match="below 1x"):
        Colocation(budget=float("nan"))
    assert Colocation().budget == DEFAULT_BUDGET == 1.10


@pytest.mark.parametrize(
    ("holders", "pod", "want"),
    [
        # nothing to protect: the share's own percent
        ((), tag("p", HIGH, CB, 40), 40),
        ((tag("b", BE, MB, 60),), tag("p", BE, CB, 50), 50),
        # a High share beside a BestEffort one at 30 fits, at 60 it does not (budget 1.45)
        ((tag("b", BE, CB, 30),), tag("p", HIGH, CB, 40), 40),
        ((tag("b", BE, CB, 60),), tag("p", HIGH, CB, 40), None),
        # two High shares: each one's slowdown beside the other (at its percent) counts
        ((tag("h", HIGH, CB, 30),), tag("p", HIGH, CB, 40), 40),
        ((tag("h", HIGH, CB, 30),), tag("p", HIGH, CB, 50), None),  # h would suffer 1.5x
        ((tag("h", HIGH, CB, 50),), tag("p", HIGH, CB, 20), None),  # p would suffer 1.5x
    ],
)
def test_admit_table(holders: tuple[ShareTag, ...], pod: ShareTag, want: int | None) -> None:
    rules = Colocation(budget=1.45, trace=greedy)
    # greedy streams: the co-runner's SM cap decides (slowdown grows with its percent)
    assert rules.pair(CB, CB, 30) < 1.45 < rules.pair(CB, CB, 50)
    got = rules.admit(holders, pod)
    if want is None:
        assert isinstance(got, Reason)
        assert got.code == "InterferenceOverBudget"
        assert "over the 1.45x budget" in got.message
    else:
        assert got == want


def test_a_best_effort_share_is_bounded_to_what_the_model_allows() -> None:
    rules = Colocation(budget=1.35, trace=greedy)
    allowed = best_effort_share(greedy(CB), greedy(MB), 1.35)
    assert isinstance(allowed, tuple)
    assert 10 <= allowed[0] < 60, "the chosen streams must make the cap matter"
    got = rules.admit((tag("h", HIGH, CB, 40),), tag("p", BE, MB, 60))
    assert got == allowed[0]
    # it never gets more than it asked
    assert rules.admit((tag("h", HIGH, CB, 40),), tag("p", BE, MB, 10)) == 10


def test_other_co_runners_use_up_the_budget_first() -> None:
    rules = Colocation(budget=1.45, trace=greedy)
    other = tag("b1", BE, CB, 20)
    already = rules.pair(CB, CB, 20) - 1.0
    alone = best_effort_share(greedy(CB), greedy(CB), 1.45)
    beside = best_effort_share(greedy(CB), greedy(CB), 1.45 - already)
    assert isinstance(alone, tuple)
    assert isinstance(beside, tuple)
    assert beside[0] < alone[0]
    got = rules.admit((tag("h", HIGH, CB, 30), other), tag("p", BE, CB, 90))
    assert got == beside[0]


def test_a_best_effort_share_that_fits_at_no_percent_is_refused_with_numbers() -> None:
    floor = Colocation(trace=greedy).pair(CB, MB, 10)
    rules = Colocation(budget=floor - 0.005, trace=greedy)
    got = rules.admit((tag("ns/infer", HIGH, CB, 40),), tag("p", BE, MB, 30))
    assert isinstance(got, Reason)
    assert got.message.startswith("High share ns/infer beside it: predicted slowdown ")
    assert "even at 10 percent of the SMs" in got.message
    assert "%" not in got.message  # kube-scheduler runs extender reasons through Go fmt


# ---------------------------------------------------------------- on the live cache
def test_a_second_high_share_is_refused_with_the_gpu_and_the_numbers() -> None:
    s = Colocation().pair(CB, CB, 40)
    c = cache(Colocation(budget=s - 0.01))
    place(c, share("default/infer-a", HIGH, CB, 40))
    why = refused(c, share("default/infer-b", HIGH, CB, 40))
    assert why.code == "InterferenceOverBudget"
    assert not why.unresolvable  # may clear when infer-a leaves
    budget = f"{s - 0.01:.2f}x"
    assert why.message.startswith(
        "gpu 0 of n1: High share default/infer-a beside it: predicted slowdown "
    )
    assert why.message.endswith(f"over the {budget} budget")
    # within the budget the two share the GPU
    c2 = cache(Colocation(budget=s + 0.01))
    a = place(c2, share("default/infer-a", HIGH, CB, 40))
    b = place(c2, share("default/infer-b", HIGH, CB, 40))
    assert (a.node, a.gpu_indices) == (b.node, b.gpu_indices)


def test_the_rules_pick_another_gpu_when_one_is_refused() -> None:
    s = Colocation().pair(CB, CB, 30)
    c = cache(Colocation(budget=s - 0.01), gpus=2)
    a = place(c, share("hp-a", HIGH, CB, 30))
    b = place(c, share("hp-b", HIGH, CB, 30))  # FGD alone would fill hp-a's GPU
    assert a.gpu_indices != b.gpu_indices


def test_a_high_share_beside_best_effort_ones_is_refused_over_budget() -> None:
    s = Colocation().pair(CB, MB, 50)
    c = cache(Colocation(budget=s - 0.01))
    place(c, share("ns/train", BE, MB, 50))
    why = refused(c, share("ns/infer", HIGH, CB, 40))
    assert why.message.startswith(
        "gpu 0 of n1: BestEffort share ns/train (memory-bound, 50 percent) beside it: "
        "predicted slowdown "
    )


def test_the_bounded_percent_is_what_the_cache_holds() -> None:
    rules = Colocation(budget=1.35, trace=greedy)
    allowed = best_effort_share(greedy(CB), greedy(MB), 1.35)
    assert isinstance(allowed, tuple)
    c = cache(rules)
    place(c, share("hp", HIGH, CB, 40))
    got = place(c, share("be", BE, MB, 60))
    assert got.gpu_milli == allowed[0] * 10 == c.holdings["be"].gpu_milli
    st = c.state()
    assert int(st.gpu_left[0, 0]) == 1000 - 400 - allowed[0] * 10
    assert [t.percent for t in st.shares[(0, 0)]] == [40, allowed[0]]
    c.forget("hp")
    assert st.high == set()
    assert [t.pod for t in st.shares[(0, 0)]] == ["be"]


def test_shares_without_a_priority_are_not_subject_to_the_rules() -> None:
    c = cache(Colocation(budget=1.0))  # nothing tagged could share at 1.0x
    place(c, share("hp", HIGH, CB, 40))
    trace_pod = share("openb-pod", None, UNK, 50)
    got = place(c, trace_pod)
    assert got.gpu_milli == 500
    assert [t.pod for t in c.state().shares[(0, 0)]] == ["hp"]


def test_gpu_verdict_names_node_and_gpu() -> None:
    c = cache(Colocation(budget=1.0), gpus=3)
    place(c, share("hp", HIGH, CB, 40))
    st = c.state()
    gpu = c.holdings["hp"].gpu_indices[0]
    got = gpu_verdict(c.colocation, st, 0, gpu, st.spec(share("x", HIGH, CB, 10)))
    assert isinstance(got, Reason)
    assert got.message.startswith(f"gpu {gpu} of n1: ")


# ---------------------------------------------------------------- complementary profiles
def _two_node_state(
    a: tuple[str, WorkloadProfile, int], b: tuple[str, WorkloadProfile, int]
) -> Context:
    nodes = tuple(Node.with_gpus(n, "T4", 1) for n in ("a", "b"))
    st = ClusterState.from_snapshot(ClusterSnapshot(nodes=nodes))
    for i, (name, profile, pct) in enumerate((a, b)):
        st.assign(i, st.spec(share(name, HIGH, profile, pct)), (0,))
    typical = [TypicalPod(cpu=0, milli=500, num_gpus=1, gpu_models="", freq=1.0)]
    frag = FragTracker(FragModel(typical, st.models), st)
    return Context(state=st, frag=frag, rng=np.random.default_rng(0))


def test_ties_go_to_the_complementary_profile_over_the_node_order() -> None:
    ctx = _two_node_state(("hp-mem", MB, 50), ("hp-cmp", CB, 50))
    rules = Colocation(budget=10.0)
    cand = np.arange(2)
    for profile, want in ((MB, 1), (CB, 0)):
        pod = ctx.state.spec(share("be", BE, profile, 50))
        got = choose(Chronotope(), ctx, pod, cand, rules)
        assert got is not None
        assert got.node == want, profile
    # a share without a known profile keeps the node order
    got = choose(Chronotope(), ctx, ctx.state.spec(share("be", BE, UNK, 50)), cand, rules)
    assert got is not None
    assert got.node == 0


def test_fragmentation_still_comes_first() -> None:
    # node a: 500 free (a 50 percent share fills it); node b: 700 free beside a
    # compute-bound share, complementary for a memory-bound pod but leaving 200 idle
    ctx = _two_node_state(("hp-mem", MB, 50), ("hp-cmp", CB, 30))
    pod = ctx.state.spec(share("be", BE, MB, 50))
    cand = np.arange(2)
    got = choose(Chronotope(), ctx, pod, cand, Colocation(budget=10.0))
    assert got is not None
    assert got.node == Fgd().choose(ctx, pod, cand)[0] == 0


def test_complement_key_picks_the_complementary_gpu_among_equal_free_shares() -> None:
    st = ClusterState.from_snapshot(ClusterSnapshot(nodes=(Node.with_gpus("a", "T4", 2),)))
    st.assign(0, st.spec(share("c", HIGH, CB, 50)), (0,))
    st.assign(0, st.spec(share("m", HIGH, MB, 50)), (1,))
    pod = st.spec(share("be", BE, CB, 20))
    got = complement_key(st, pod, np.array([0]), np.array([0]))
    assert got is not None
    assert (int(got[0][0]), int(got[1][0])) == (-1, 1)
    assert (
        complement_key(st, st.spec(share("u", BE, UNK, 20)), np.array([0]), np.array([0])) is None
    )


def test_the_simulators_path_assigns_the_bounded_share() -> None:
    rules = Colocation(budget=1.35, trace=greedy)
    allowed = best_effort_share(greedy(CB), greedy(MB), 1.35)
    assert isinstance(allowed, tuple)
    ctx = _two_node_state(("hp", CB, 40), ("hp2", CB, 40))
    st = ctx.state
    pod = st.spec(share("be", BE, MB, 60))
    got = choose(Chronotope(), ctx, pod, st.feasible(pod), rules)
    assert got is not None
    assert got.pod.milli == allowed[0] * 10
    st.assign(got.node, got.pod, got.gpus)
    assert st.shares[(got.node, 0)][-1] == ShareTag("be", BE, MB, allowed[0])


# ---------------------------------------------------------------- an Orion-style runtime
def test_a_gated_runtime_lets_a_best_effort_share_run_at_more_than_a_static_cap() -> None:
    """Static MPS caps the BE all the time; a runtime that gates its kernels needs none here."""
    holders = (tag("h", HIGH, CB, 50),)
    static = Colocation(trace=long_request).admit(holders, tag("b", BE, MB, 100))
    gated = Colocation(trace=long_request, runtime="gated").admit(holders, tag("b", BE, MB, 100))
    # full-GPU kernels side by side: even a 10 percent cap costs the High share 1.10x
    assert isinstance(static, Reason)
    assert "even at 10 percent of the SMs" in static.message
    assert gated == 100
    rules = Colocation(trace=long_request, runtime="gated")
    assert rules.pair(CB, MB, 100, BE) < 1.10 < rules.pair(CB, MB, 100, HIGH)


def test_a_gated_runtime_still_refuses_what_no_percent_protects() -> None:
    rules = Colocation(runtime="gated")  # the declared classes: 1 us kernels on both sides
    got = rules.admit((tag("ns/infer", HIGH, MB, 50),), tag("p", BE, MB, 50))
    assert isinstance(got, Reason)
    assert got.code == "InterferenceOverBudget"
    assert got.message.startswith("High share ns/infer beside it: no MPS percent keeps")
    assert "%" not in got.message
    assert rules.admit((tag("ns/infer", HIGH, CB, 50),), tag("p", BE, MB, 50)) == 50


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match="runtime 'orion' is not one of mps, gated"):
        Colocation(runtime="orion")


def test_a_trial_places_as_place_does_and_holds_nothing() -> None:
    # two High shares over the budget together: `place` spreads them over two GPUs and
    # refuses a third; a trial on another cache in the same state says the same, and
    # its cache's arrays and holdings are as before
    s = Colocation().pair(CB, CB, 30)
    reqs = [share(f"hp-{i}", HIGH, CB, 30) for i in range(3)]
    placed = cache(Colocation(budget=s - 0.01), gpus=2)
    want = [placed.place(r.name, r, ["n1"], Chronotope(), now=0.0) for r in reqs]
    assert [isinstance(w, Placement) for w in want] == [True, True, False]
    tried = cache(Colocation(budget=s - 0.01), gpus=2)
    before = tried.state().gpu_left.copy()
    decisions, after = tried.trial(reqs, ["n1"], Chronotope())
    got = [None if d is None else d.gpus for d in decisions]
    assert got == [w.gpu_indices if isinstance(w, Placement) else None for w in want]
    assert after.gpu_left[0].tolist() == [700, 700]
    assert (tried.state().gpu_left == before).all()
    assert not tried.holdings
