"""Online policies: scenario tables and properties, all checked with `validate`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronotope.solver.frag import FragModel, FragTracker, TypicalPod, typical_pods
from chronotope.solver.model import ClusterSnapshot, Gpu, Node, Placement, PodRequest, Unplaced
from chronotope.solver.online import POLICY_NAMES, make_policy, node_reasons
from chronotope.solver.policies import Context
from chronotope.solver.state import ClusterState
from chronotope.solver.validate import validate


def _node(
    name: str, gpus: int, model: str = "T4", cpu: int = 32000, free: tuple[int, ...] = ()
) -> Node:
    left = free or (1000,) * gpus
    return Node(
        name=name,
        cpu_milli=cpu,
        memory_mib=262144,
        gpus=tuple(Gpu(index=i, model=model, free_milli=left[i]) for i in range(gpus)),
    )


SCENARIOS = [
    # (name, nodes, pod, policies, expected node or None for unplaced)
    (
        "share goes to the partly used GPU",
        [_node("a", 2, free=(1000, 1000)), _node("b", 2, free=(500, 1000))],
        PodRequest(name="p", cpu_milli=1000, num_gpus=1, gpu_milli=400),
        ("fgd", "bestfit", "gpupacking", "chronotope"),
        "b",
    ),
    (
        "GPU model constraint is honoured",
        [_node("a", 8, model="T4"), _node("b", 8, model="V100M32")],
        PodRequest(name="p", cpu_milli=1000, num_gpus=1, gpu_milli=1000, gpu_models=("V100M32",)),
        POLICY_NAMES,
        "b",
    ),
    (
        "multi-GPU pod needs whole free GPUs",
        [_node("a", 4, free=(1000, 1000, 1000, 500)), _node("b", 4)],
        PodRequest(name="p", cpu_milli=1000, num_gpus=4, gpu_milli=1000),
        POLICY_NAMES,
        "b",
    ),
    (
        "CPU shortage makes it unplaceable",
        [_node("a", 1, cpu=1000)],
        PodRequest(name="p", cpu_milli=2000, num_gpus=1, gpu_milli=1000),
        POLICY_NAMES,
        None,
    ),
]


def _place(
    snap: ClusterSnapshot, pod: PodRequest, policy: str, typical: list[TypicalPod]
) -> Placement | Unplaced:
    """One simulator step: the feasible nodes, the policy's choice (as `sim.engine`)."""
    state = ClusterState.from_snapshot(snap)
    frag = FragTracker(FragModel(typical, state.models), state)
    spec = state.spec(pod)
    cand = state.feasible(spec)
    if len(cand) == 0:
        return Unplaced(name=pod.name, reasons=tuple(node_reasons(snap, pod)))
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(0))
    node, gpus = make_policy(policy).choose(ctx, spec, cand)
    return Placement(
        pod=pod.name, node=state.names[node], gpu_indices=gpus, gpu_milli=pod.gpu_milli
    )


@pytest.mark.parametrize(("title", "nodes", "pod", "policies", "expected"), SCENARIOS)
def test_scenarios(
    title: str, nodes: list[Node], pod: PodRequest, policies: tuple[str, ...], expected: str | None
) -> None:
    snap = ClusterSnapshot(nodes=tuple(nodes))
    for name in policies:
        big = PodRequest(name="big", cpu_milli=1000, num_gpus=1, gpu_milli=800)
        out = _place(snap, pod, name, typical_pods([pod, big]))
        if expected is None:
            assert isinstance(out, Unplaced), (title, name)
            assert out.reasons
            assert out.reasons[0].nodes >= 1
        else:
            assert isinstance(out, Placement), (title, name, out)
            assert out.node == expected, (title, name)
            assert validate(snap, [out], pods={pod.name: pod}) == []


def test_fragmentation_matches_a_direct_reading_of_the_definition() -> None:
    rng = np.random.default_rng(1)
    nodes = [_node(f"n{i}", 4, model=("T4", "P100")[i % 2]) for i in range(30)]
    pods = [
        PodRequest(
            name=f"p{i}", cpu_milli=int(rng.integers(1, 8)) * 1000, num_gpus=1, gpu_milli=int(m)
        )
        for i, m in enumerate(rng.choice([250, 500, 1000], size=60))
    ] + [
        PodRequest(name="c", cpu_milli=4000),
        PodRequest(name="t", cpu_milli=1000, num_gpus=1, gpu_milli=1000, gpu_models=("T4",)),
    ]
    mix = typical_pods(pods, coverage=1.0)
    state = ClusterState.from_snapshot(ClusterSnapshot(nodes=tuple(nodes)))
    state.gpu_left[:, :4] = rng.choice([0, 100, 500, 750, 1000], size=(30, 4))
    state.cpu_left[:] = rng.integers(0, 32001, size=30)
    got = FragModel(mix, state.models).of_state(state)
    for i in range(30):
        left = state.gpu_left[i, :4]
        want = 0.0
        for t in mix:
            wanted = [m for m in t.gpu_models.split("|") if m]
            access = not wanted or state.models[state.model_idx[i]] in wanted
            fits = (
                access
                and t.milli > 0
                and (left >= t.milli).sum() >= t.num_gpus
                and state.cpu_left[i] >= t.cpu
            )
            want += t.freq * (left[left < t.milli].sum() if fits else left.sum())
        assert got[i] == pytest.approx(want)


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[PodRequest]]:
    n = draw(st.integers(1, 6))
    nodes = []
    for i in range(n):
        g = draw(st.sampled_from([0, 1, 2, 4, 8]))
        free = tuple(draw(st.sampled_from([0, 200, 500, 1000])) for _ in range(g))
        nodes.append(
            Node(
                name=f"n{i}",
                cpu_milli=32000,
                memory_mib=65536,
                cpu_free=draw(st.integers(0, 32000)),
                memory_free=draw(st.integers(0, 65536)),
                gpus=tuple(
                    Gpu(
                        index=j,
                        model=draw(st.sampled_from(["T4", "A10"])) if j == 0 else "T4",
                        free_milli=free[j],
                    )
                    for j in range(g)
                ),
            )
        )
    # keep one model per node
    nodes = [
        nd.model_copy(
            update={
                "gpus": tuple(gp.model_copy(update={"model": nd.gpus[0].model}) for gp in nd.gpus)
            }
        )
        if nd.gpus
        else nd
        for nd in nodes
    ]
    pods = []
    for k in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["cpu", "share", "whole"]))
        num, milli = {
            "cpu": (0, 0),
            "share": (1, draw(st.sampled_from([100, 300, 500, 900]))),
            "whole": (draw(st.sampled_from([1, 2, 4])), 1000),
        }[kind]
        pods.append(
            PodRequest(
                name=f"p{k}",
                cpu_milli=draw(st.integers(0, 16000)),
                memory_mib=draw(st.integers(0, 32768)),
                num_gpus=num,
                gpu_milli=milli,
            )
        )
    return ClusterSnapshot(nodes=tuple(nodes)), pods


@settings(max_examples=60, deadline=None)
@given(_clusters(), st.sampled_from(POLICY_NAMES))
def test_sequences_never_overcommit(
    case: tuple[ClusterSnapshot, list[PodRequest]], policy: str
) -> None:
    snap, pods = case
    state = ClusterState.from_snapshot(snap)
    frag = FragTracker(FragModel(typical_pods(pods), state.models), state)
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(0))
    impl = make_policy(policy)
    placements = []
    for pod in pods:
        spec = state.spec(pod)
        cand = state.feasible(spec)
        if len(cand) == 0:
            continue
        node, gpus = impl.choose(ctx, spec, cand)
        state.assign(node, spec, gpus)
        frag.refresh(node)
        placements.append(
            Placement(
                pod=pod.name, node=state.names[node], gpu_indices=gpus, gpu_milli=pod.gpu_milli
            )
        )
    assert validate(snap, placements, pods={p.name: p for p in pods}) == []


def test_the_nodes_a_pod_may_not_use_are_counted_as_its_node_rules() -> None:
    snap = ClusterSnapshot(nodes=(_node("a", 2), _node("b", 2, free=(0, 0))))
    pod = PodRequest(name="p", num_gpus=1, gpu_milli=1000, nodes=frozenset({"b"}))
    reasons = {r.code: r.message for r in node_reasons(snap, pod)}
    assert reasons == {
        "NodeRules": "1 nodes: its node rules rule them out",
        "InsufficientGpu": "1 nodes: fewer than 1 GPU(s) with 1000m free",
    }
    assert node_reasons(snap, pod.model_copy(update={"nodes": None})) == []
    state = ClusterState.from_snapshot(snap)
    assert state.feasible(state.spec(pod)).tolist() == []
    assert state.feasible(
        state.spec(pod.model_copy(update={"nodes": frozenset({"a"})}))
    ).tolist() == [0]
