"""CP-SAT batch planner: scenario table and properties, all checked with `validate`."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chronotope.solver.batch import BatchSettings, Plan, plan
from chronotope.solver.model import (
    Alternative,
    ClusterSnapshot,
    Gpu,
    Node,
    PlacementStrategy,
    PodRequest,
    Workload,
)
from chronotope.solver.validate import validate
from tests.openb_fixture import NODES, PODS

FAST = BatchSettings(time_limit_s=5.0, seed=1, horizon_slots=3)


def _cluster(n: int = 3, gpus: int = 4, model: str = "A100", rack_of: int = 2) -> ClusterSnapshot:
    return ClusterSnapshot(
        nodes=tuple(
            Node(
                name=f"n{i}",
                cpu_milli=64000,
                memory_mib=262144,
                rack=f"r{i // rack_of}",
                gpus=tuple(Gpu(index=j, model=model, memory_mib=40960) for j in range(gpus)),
            )
            for i in range(n)
        )
    )


def _gang(name: str, replicas: int, gpus: int = 1, milli: int = 1000, **kw: object) -> Workload:
    return Workload(
        name=name,
        pod=PodRequest(name=name, cpu_milli=4000, memory_mib=8192, num_gpus=gpus, gpu_milli=milli),
        replicas=replicas,
        **kw,
    )


def _check(snap: ClusterSnapshot, wl: list[Workload], p: Plan) -> None:
    assert validate(snap, p.placements, workloads=wl) == []


def test_gang_is_all_or_nothing() -> None:
    snap = _cluster(n=2, gpus=2)
    wl = [_gang("big", replicas=5), _gang("small", replicas=2)]
    p = plan(snap, wl, FAST)
    _check(snap, wl, p)
    placed = {pl.pod.rsplit("-", 1)[0] for pl in p.placements}
    assert placed == {"small"}
    assert [u.name for u in p.unplaced] == ["big"]
    (why,) = p.unplaced[0].reasons
    assert why.code == "GangTooLarge"
    assert why.unresolvable
    assert "5 members of 1 whole GPU" in why.message
    assert "at most 4" in why.message


def test_a_gang_that_fits_only_an_emptier_cluster_may_wait() -> None:
    snap = _cluster(n=2, gpus=2)
    busy = snap.model_copy(
        update={
            "nodes": (
                snap.nodes[0].model_copy(
                    update={
                        "gpus": tuple(
                            g.model_copy(update={"free_milli": 0}) for g in snap.nodes[0].gpus
                        )
                    }
                ),
                snap.nodes[1],
            )
        }
    )
    p = plan(busy, [_gang("three", replicas=3)], FAST)
    (why,) = p.unplaced[0].reasons
    assert why.code == "InsufficientGpu"
    assert not why.unresolvable
    assert "only 2 of the gang's 3 members" in why.message


def test_strict_spread_uses_distinct_nodes_and_strict_pack_one() -> None:
    snap = _cluster(n=4, gpus=4)
    wl = [
        _gang("spread", 3, strategy=PlacementStrategy.STRICT_SPREAD),
        _gang("pack", 3, strategy=PlacementStrategy.STRICT_PACK),
    ]
    p = plan(snap, wl, FAST)
    _check(snap, wl, p)
    spread = [pl.node for pl in p.placements if pl.pod.startswith("spread")]
    pack = [pl.node for pl in p.placements if pl.pod.startswith("pack")]
    assert len(set(spread)) == 3
    assert len(set(pack)) == 1


def test_shares_pack_onto_one_gpu() -> None:
    snap = _cluster(n=1, gpus=2)
    wl = [_gang(f"s{i}", 1, milli=250) for i in range(4)]
    p = plan(snap, wl, FAST)
    _check(snap, wl, p)
    assert len({pl.gpu_indices for pl in p.placements}) == 1
    assert p.objective_terms["fragmentation"] > 0


def test_unmeetable_deadline_gives_zero_utility_not_a_crash() -> None:
    snap = _cluster()
    late = _gang(
        "late", 1, deadline_s=100.0, alternatives=(Alternative(gpu_model="A100", duration_s=3600),)
    )
    p = plan(snap, [late], FAST)
    assert p.placements == ()
    assert p.utility == 0
    assert p.unplaced[0].reasons[0].code == "DeadlineUnmeetable"


def test_waits_for_the_better_gpu_rather_than_running_slowly_now() -> None:
    snap = ClusterSnapshot(
        nodes=(
            Node(
                name="fast",
                cpu_milli=64000,
                memory_mib=262144,
                gpus=tuple(Gpu(index=j, model="A100") for j in range(2)),
            ),
            Node(
                name="slow",
                cpu_milli=64000,
                memory_mib=262144,
                gpus=tuple(Gpu(index=j, model="V100") for j in range(2)),
            ),
        )
    )
    alts = (
        Alternative(gpu_model="A100", duration_s=600, utility=2.0),
        Alternative(gpu_model="V100", duration_s=1800, utility=1.0),
    )
    wl = [_gang(f"j{i}", 2, alternatives=alts) for i in range(3)]
    p = plan(snap, wl, FAST)
    _check(snap, wl, p)
    # Utility 2 on A100 even after two slots of delay beats utility 1 on V100 now.
    assert set(p.chosen.values()) == {"A100"}
    assert sorted(d.start_s for d in p.deferred) == [600.0, 1200.0]
    assert {d.gpu_model for d in p.deferred} == {"A100"}


def test_a_queue_longer_than_the_cluster_is_spread_over_later_slots() -> None:
    # One node, two GPUs, six one-slot jobs: two start now and two in each later
    # slot, within each slot's GPU share (the warm start defers them the same way).
    snap = _cluster(n=1, gpus=2)
    wl = [_gang(f"q{i}", 1, default_duration_s=600) for i in range(6)]
    p = plan(snap, wl, BatchSettings(time_limit_s=1.0, seed=1, horizon_slots=3))
    _check(snap, wl, p)
    assert len(p.chosen) == 2
    assert sorted(d.start_s for d in p.deferred) == [600.0, 600.0, 1200.0, 1200.0]
    assert p.unplaced == ()


def test_same_rack_and_warm_start_and_preemption_candidates() -> None:
    snap = _cluster(n=4, gpus=2, rack_of=2)
    wl = [_gang("ring", 4, same_topology="rack")]
    first = plan(snap, wl, FAST)
    _check(snap, wl, first)
    assert len({snap.by_name[pl.node].rack for pl in first.placements}) == 1
    again = plan(snap, wl, FAST.model_copy(update={"hint": first}))
    _check(snap, wl, again)
    assert again.utility == first.utility
    victim = _gang("low", 1, priority=0, preemptible=True, running_on=("n0",))
    urgent = _gang("urgent", 9, priority=5)
    p = plan(snap, [victim, urgent], FAST)
    assert p.preemption_candidates == {"urgent": ("low",)}


@st.composite
def _instances(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[Workload]]:
    snap = _cluster(n=draw(st.integers(1, 4)), gpus=draw(st.sampled_from([1, 2, 4])))
    wl = []
    for i in range(draw(st.integers(1, 6))):
        share = draw(st.booleans())
        wl.append(
            _gang(
                f"w{i}",
                draw(st.integers(1, 3)),
                gpus=1 if share else draw(st.integers(1, 2)),
                milli=draw(st.sampled_from([250, 500])) if share else 1000,
                strategy=draw(st.sampled_from(list(PlacementStrategy))),
                deadline_s=draw(st.sampled_from([None, 10.0, 7200.0])),
            )
        )
    return snap, wl


@settings(max_examples=25, deadline=None)
@given(_instances())
def test_plans_are_always_feasible(case: tuple[ClusterSnapshot, list[Workload]]) -> None:
    snap, wl = case
    p = plan(snap, wl, BatchSettings(time_limit_s=2.0, seed=0, horizon_slots=2))
    _check(snap, wl, p)
    started = {pl.pod.rsplit("-", 1)[0] for pl in p.placements} | {d.workload for d in p.deferred}
    for w in wl:
        if w.deadline_s == 10.0:
            assert w.name not in started
        assert (w.name in started) != any(u.name == w.name for u in p.unplaced)


def test_openb_slice_batch_places_what_fits_and_validates() -> None:

    from chronotope.sim.openb import load_nodes, load_pods
    from chronotope.solver.batch_greedy import greedy_candidates

    snap = load_nodes(NODES)
    pods = load_pods(PODS)[:80]
    wl = [Workload(name=f"w{i}", pod=p) for i, p in enumerate(pods)]
    p = plan(snap, wl, BatchSettings(time_limit_s=5.0, seed=0, horizon_slots=2))
    _check(snap, wl, p)
    assert p.status in {"OPTIMAL", "FEASIBLE"}
    # The greedy warm start is a feasible plan; CP-SAT only improves on it.
    _, picks = greedy_candidates(snap, [(w, m, 1000) for w in wl for m in _models(snap, w)], 12)
    assert len(p.chosen) >= len(picks)


def _models(snap: ClusterSnapshot, w: Workload) -> list[str]:
    if not w.pod.num_gpus:
        return [""]
    return sorted({n.gpu_model for n in snap.nodes if n.gpus and w.pod.allows(n.gpu_model)})


def test_a_pod_that_names_its_nodes_is_placed_only_there() -> None:
    # `PodRequest.nodes`: the node rules of a TrainingJob's template (workloads.joint)
    snap = _cluster(n=3, gpus=2)
    only = _gang("only", replicas=2)
    only = only.model_copy(
        update={"pod": only.pod.model_copy(update={"nodes": frozenset({"n1", "n2"})})}
    )
    p = plan(snap, [only], FAST)
    _check(snap, [only], p)
    assert {pl.node for pl in p.placements} <= {"n1", "n2"}
    assert len(p.placements) == 2
    # a gang larger than the nodes it may use hold does not start (later slots are
    # reserved per GPU model, as for any gang: it may be deferred, never placed now)
    one = only.model_copy(update={"pod": only.pod.model_copy(update={"nodes": frozenset({"n0"})})})
    big = one.model_copy(update={"replicas": 3})
    p = plan(snap, [big], FAST)
    assert p.placements == ()
    assert p.chosen == {}
    # validation refuses a placement off the pod's nodes
    off = plan(snap, [_gang("free", replicas=1)], FAST).placements
    free = _gang("free", replicas=1)
    ruled = free.model_copy(update={"pod": free.pod.model_copy(update={"nodes": frozenset({"x"})})})
    assert any("may not run on node" in e for e in validate(snap, off, workloads=[ruled]))
