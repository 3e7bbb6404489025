"""`chronotope` policy: FGD's decision except the CPU-only tie rule."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronotope.solver.frag import FragModel, FragTracker, typical_pods
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.model import ClusterSnapshot, Gpu, Node, PodRequest
from chronotope.solver.policies import Choice, Context, Fgd, Policy
from chronotope.solver.state import ClusterState


def _node(name: str, free: tuple[int, ...], cpu: int = 64000) -> Node:
    return Node(
        name=name,
        cpu_milli=cpu,
        memory_mib=262144,
        gpus=tuple(Gpu(index=i, model="T4", free_milli=f) for i, f in enumerate(free)),
    )


def _ctx(nodes: list[Node], pods: list[PodRequest]) -> Context:
    state = ClusterState.from_snapshot(ClusterSnapshot(nodes=tuple(nodes)))
    frag = FragTracker(FragModel(typical_pods(pods), state.models), state)
    return Context(state=state, frag=frag, rng=np.random.default_rng(0))


def _cpu_pod_on(nodes: list[Node]) -> Callable[[Policy], Choice]:
    """Where a policy puts a 16-core CPU-only pod on these nodes (typical pods: MIX)."""
    ctx = _ctx(nodes, MIX)
    cpu = ctx.state.spec(PodRequest(name="c", cpu_milli=16000))
    cand = ctx.state.feasible(cpu)
    return lambda policy: policy.choose(ctx, cpu, cand)


MIX = [
    PodRequest(name="s", cpu_milli=4000, num_gpus=1, gpu_milli=500),
    PodRequest(name="w", cpu_milli=8000, num_gpus=1, gpu_milli=1000),
]


def test_cpu_pod_goes_to_a_node_whose_gpus_are_all_taken() -> None:
    # "a" comes first in the node order and keeps room for one typical pod
    # after the CPU pod, so FGD's score ties and FGD takes "a". But the pod
    # would leave "a" 14 cores for two idle GPUs, whose typical pods need 8
    # cores per GPU (MIX: 6 cores per 0.75 GPU), so chronotope spends the CPU
    # on "b", whose GPUs are all taken.
    nodes = [_node("a", (1000, 1000), cpu=30000), _node("b", (0, 0))]
    where = _cpu_pod_on(nodes)
    assert where(Fgd()) == (0, ())
    assert where(Chronotope()) == (1, ())
    assert where(Chronotope(cpu_rule="fgd")) == (0, ())


def test_cpu_pod_keeps_fgd_node_while_its_cpu_is_ample() -> None:
    # With 64 cores "a" keeps 48 after the pod, more than its two idle GPUs
    # need, so the kept rule stays with FGD; rule "zero" still moves the pod.
    nodes = [_node("a", (1000, 1000)), _node("b", (0, 0))]
    where = _cpu_pod_on(nodes)
    assert where(Chronotope()) == where(Fgd()) == (0, ())
    assert where(Chronotope(cpu_rule="zero")) == (1, ())


def test_dead_holes_need_no_cpu() -> None:
    # "a" has only 60m holes (no typical pod fits one): draining its CPU strands
    # nothing, so the pod stays with FGD; rule "short" counted the holes as idle
    # GPUs short of CPU and moved it.
    nodes = [_node("a", (60, 60), cpu=16500), _node("b", (0, 0))]
    where = _cpu_pod_on(nodes)
    assert where(Chronotope()) == where(Fgd()) == (0, ())
    assert where(Chronotope(cpu_rule="short")) == (1, ())


def test_cpu_pod_keeps_fgd_choice_without_a_full_node() -> None:
    nodes = [_node("a", (1000, 1000)), _node("b", (500, 0))]
    where = _cpu_pod_on(nodes)
    assert where(Chronotope()) == where(Fgd())


def test_unknown_rule_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        Chronotope(cpu_rule="nope")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from([0, 190, 500, 1000]), min_size=1, max_size=4),
            st.integers(0, 64000),
        ),
        min_size=1,
        max_size=6,
    ),
    st.lists(
        st.tuples(
            st.sampled_from([(1, 190), (1, 500), (1, 810), (1, 1000), (2, 1000)]),
            st.integers(0, 16000),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_gpu_pods_follow_fgd_exactly(
    nodes_in: list[tuple[list[int], int]], pods_in: list[tuple[tuple[int, int], int]]
) -> None:
    nodes = [_node(f"n{i}", tuple(free), cpu=64000) for i, (free, _) in enumerate(nodes_in)]
    pods = [
        PodRequest(name=f"p{k}", cpu_milli=cpu, num_gpus=num, gpu_milli=milli)
        for k, ((num, milli), cpu) in enumerate(pods_in)
    ]
    ctx = _ctx(nodes, pods)
    for i, (_, cpu_left) in enumerate(nodes_in):
        ctx.state.cpu_left[i] = cpu_left
    assert ctx.frag is not None
    ctx.frag = FragTracker(ctx.frag.model, ctx.state)
    ours, fgd = Chronotope(), Fgd()
    for pod in pods:
        spec = ctx.state.spec(pod)
        cand = ctx.state.feasible(spec)
        if len(cand) == 0:
            continue
        choice = ours.choose(ctx, spec, cand)
        assert choice == fgd.choose(ctx, spec, cand)
        ctx.state.assign(choice[0], spec, choice[1])
        ctx.frag.refresh(choice[0])


@pytest.mark.parametrize(
    ("b_cpu", "expected"),
    [
        # b's 64 cores outlast what the CPU-only pods expected before a's idle GPUs
        # fill (2 GPUs / 0.5 GPU per pod x 1/3 CPU-only x 16 cores = 21.3 cores)
        pytest.param(64000, (1, ()), id="spare-dead-cpu-deviates"),
        # 20 cores do not: CPU-only pods would end up on GPU nodes anyway, so FGD's node
        pytest.param(20000, (0, ()), id="scarce-dead-cpu-keeps-fgd"),
    ],
)
def test_budget_rule_deviates_only_while_dead_cpu_outlasts_cpu_only_demand(
    b_cpu: int, expected: Choice
) -> None:
    nodes = [_node("a", (1000, 1000), cpu=30000), _node("b", (0, 0), cpu=b_cpu)]
    ctx = _ctx(nodes, [*MIX, PodRequest(name="c", cpu_milli=16000)])
    cpu = ctx.state.spec(PodRequest(name="c", cpu_milli=16000))
    cand = ctx.state.feasible(cpu)
    assert Fgd().choose(ctx, cpu, cand) == (0, ())
    assert Chronotope(cpu_rule="usable").choose(ctx, cpu, cand) == (1, ())
    assert Chronotope(cpu_rule="budget").choose(ctx, cpu, cand) == expected
