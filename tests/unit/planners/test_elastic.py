"""The SAILOR-style elastic planner on a small OPT-350M fixture."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronotope.planners.elastic import PlannerSettings, plan_elastic
from chronotope.planners.partition import partition_layers
from chronotope.planners.profile import ModelProfile, load_model_profile
from chronotope.solver.model import Node

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sailor" / "OPT-350"
GIB = 1024**3
MEM = {"A100-40": 40 * 1024, "V100-16": 16 * 1024}  # MiB per GPU


@lru_cache(maxsize=1)
def _profile() -> ModelProfile:
    return load_model_profile(FIXTURE, FIXTURE / "training_config.json")


def _nodes(a100: list[int], v100: list[int]) -> list[Node]:
    out = [
        Node.with_gpus(f"a{i}", "A100-40", n, gpu_memory_mib=MEM["A100-40"])
        for i, n in enumerate(a100)
    ]
    out += [
        Node.with_gpus(f"v{i}", "V100-16", n, gpu_memory_mib=MEM["V100-16"])
        for i, n in enumerate(v100)
    ]
    return out


def test_profile_loads_both_gpu_types() -> None:
    prof = _profile()
    assert set(prof.gpus) == {"A100-40", "V100-16"}
    assert prof.num_all_layers == 26
    assert (1, 1) in prof.gpus["A100-40"].options()


def test_partition_is_balanced_and_contiguous() -> None:
    assert partition_layers([1, 1, 1, 1], 2) == [2, 4]
    assert partition_layers([4, 1, 1, 1, 1], 2) == [1, 5]
    assert partition_layers([1.0] * 5, 5) == [1, 2, 3, 4, 5]


def test_plan_prefers_faster_gpus_and_fits_memory() -> None:
    result = plan_elastic(_profile(), _nodes([4, 4], [4, 4]), PlannerSettings())
    assert result.plan is not None
    plan = result.plan
    assert plan.gpu_type == "A100-40"
    assert plan.memory_per_gpu_bytes <= plan.memory_limit_bytes
    assert plan.dp * plan.tp * plan.pp == plan.gpus
    assert sum(plan.stage_layers) == 26
    assert sum(n for _, n in plan.nodes) == plan.gpus
    assert plan.throughput_samples_s == pytest.approx(1024 / plan.iteration_s)


def test_per_dollar_objective_can_choose_fewer_gpus() -> None:
    nodes = _nodes([4, 4], [])
    fast = plan_elastic(_profile(), nodes, PlannerSettings(), objective="throughput").plan
    cheap = plan_elastic(
        _profile(), nodes, PlannerSettings(), objective="throughput_per_dollar"
    ).plan
    assert fast is not None
    assert cheap is not None
    assert cheap.samples_per_dollar >= fast.samples_per_dollar
    assert fast.throughput_samples_s >= cheap.throughput_samples_s


def test_unplaced_is_a_value_with_reasons() -> None:
    none = plan_elastic(_profile(), [], PlannerSettings())
    assert none.plan is None
    assert none.reasons == ("no GPUs are available",)
    unknown = [Node.with_gpus("h", "H100", 8, gpu_memory_mib=80 * 1024)]
    res = plan_elastic(_profile(), unknown, PlannerSettings())
    assert res.plan is None
    assert "no profile for GPU type H100" in res.reasons[0]
    tiny = [Node.with_gpus("t", "V100-16", 1, gpu_memory_mib=4 * 1024)]
    res = plan_elastic(_profile(), tiny, PlannerSettings())
    assert res.plan is None
    assert any("GiB" in r for r in res.reasons)
    res = plan_elastic(_profile(), _nodes([2], []), PlannerSettings(), min_gpus=8)
    assert res.plan is None
    assert any("at least 8 GPUs" in r for r in res.reasons)


def test_replan_after_node_loss_shrinks() -> None:
    before = plan_elastic(_profile(), _nodes([4, 4], []), PlannerSettings()).plan
    after = plan_elastic(_profile(), _nodes([4], []), PlannerSettings()).plan
    assert before is not None
    assert after is not None
    assert after.gpus <= 4 < before.gpus
    assert after.link == "intra-node"


node_counts = st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=3)


@settings(max_examples=20, deadline=None)
@given(a100=node_counts, v100=node_counts, extra=st.integers(min_value=1, max_value=4))
def test_memory_respected_and_more_gpus_never_hurt(
    a100: list[int], v100: list[int], extra: int
) -> None:
    base = plan_elastic(_profile(), _nodes(a100, v100), PlannerSettings())
    more = plan_elastic(_profile(), _nodes([*a100, extra], v100), PlannerSettings())
    for res in (base, more):
        if res.plan is not None:
            assert res.plan.memory_per_gpu_bytes <= res.plan.memory_limit_bytes
        else:
            assert res.reasons
    if base.plan is not None:
        assert more.plan is not None
        assert more.plan.throughput_samples_s >= base.plan.throughput_samples_s - 1e-9
