"""TrainingJob decisions driven by a model profile (the SAILOR planner inside `decide`).

Profile: the OPT-350M fixture (tests/fixtures/sailor/OPT-350, from SAILOR's
profiles), with its A100-40 and V100-16 layer times renamed to the node
products "A100" and "V100".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.planners.profile import ModelProfile, profile_from_data, profile_to_data
from chronotope.workloads.capacity import NodeCapacity
from chronotope.workloads.profiled import ProfilePlanner
from chronotope.workloads.training import Action, decide

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sailor" / "OPT-350"
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def profile_data() -> dict[str, str]:
    return profile_to_data(
        FIXTURE, FIXTURE / "training_config.json", {"A100-40": "A100", "V100-16": "V100"}
    )


def profile() -> ModelProfile:
    return profile_from_data(profile_data())


def spec(**over: Any) -> TrainingJobSpec:
    base: dict[str, Any] = {
        "replicas": 4,
        "minReplicas": 1,
        "maxReplicas": 8,
        "gpu": {"count": 1},
        "gpuTypes": [{"name": "A100"}, {"name": "V100"}],
        "estimate": {"referenceGpuType": "A100", "durationSeconds": 3600},
        "checkpoint": {"path": "/ckpt"},
        "parallelism": {"modelProfile": "opt-350"},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return TrainingJobSpec.model_validate(base | over)


def nodes(model: str, count: int, total: int, free: int, memory_gib: int) -> list[NodeCapacity]:
    return [
        NodeCapacity(f"{model}-{i}", model, total, free, True, memory_mib=memory_gib * 1024)
        for i in range(count)
    ]


def planner(s: TrainingJobSpec) -> ProfilePlanner:
    return ProfilePlanner(profile(), "opt-350", s)


def test_profile_round_trips_through_configmap_data() -> None:
    got = profile()
    assert set(got.gpus) == {"A100", "V100"}
    assert got.config.model == "OPT-350"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no config.json"),
        ({"config.json": "{"}, "not a valid training config"),
        ({"config.json": (FIXTURE / "training_config.json").read_text()}, "no profile-"),
        (
            {
                "config.json": (FIXTURE / "training_config.json").read_text(),
                "profile-A100.json": json.dumps({"1": {"1": {"0": "x"}}}),
            },
            "profile-A100.json is not a layer-time profile",
        ),
    ],
)
def test_bad_profile_data_says_what_is_wrong(data: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        profile_from_data(data, source="ConfigMap ns/p")


def test_planner_chooses_workers_degrees_and_speed() -> None:
    s = spec()
    capacity = nodes("A100", 1, 8, 8, 40) + nodes("V100", 2, 4, 4, 16)
    d = decide(s, capacity, NOW, planner=planner(s))
    assert d.action is Action.START
    assert d.gpu_type == "A100"
    assert d.degrees is not None
    assert d.samples_per_second is not None
    total = d.workers * d.gpus_per_worker
    assert d.degrees.data * d.degrees.tensor * d.degrees.pipeline == total
    assert d.degrees.tensor == 1  # one GPU per worker: tensor parallelism stays inside it
    assert 1 <= d.workers <= 4
    assert "profile opt-350" in d.reason
    assert "samples/s predicted" in d.reason


def test_duration_at_the_reference_plan_is_the_estimate() -> None:
    s = spec(minReplicas=4)
    p = planner(s)
    capacity = nodes("A100", 1, 8, 8, 40)
    ref = p.reference(capacity)
    assert not isinstance(ref, str)
    d = decide(s, capacity, NOW, planner=p)
    assert d.action is Action.START
    assert d.samples_per_second is not None
    expected = 3600 * ref.samples_per_second / d.samples_per_second
    assert d.finish == NOW + timedelta(seconds=expected)


def test_slower_type_runs_longer_than_the_reference() -> None:
    s = spec(minReplicas=4)
    capacity = nodes("A100", 1, 8, 0, 40) + nodes("V100", 1, 4, 4, 16)
    d = decide(s, capacity, NOW, planner=planner(s))
    assert d.action is Action.START
    assert d.gpu_type == "V100"
    assert d.finish is not None
    assert d.finish > NOW + timedelta(seconds=3600)


def test_type_missing_from_the_profile_is_never_used() -> None:
    s = spec(gpuTypes=[{"name": "A100"}, {"name": "L4"}])
    capacity = nodes("A100", 1, 8, 0, 40) + nodes("L4", 2, 4, 4, 24)
    d = decide(s, capacity, NOW, planner=planner(s))
    assert d.action is Action.WAIT  # the A100s are busy; L4 is not an alternative
    assert "L4: model profile opt-350 has no layer times for L4" in d.reason


def test_too_little_gpu_memory_is_impossible_with_the_reason() -> None:
    s = spec(
        gpuTypes=[{"name": "V100"}], estimate={"referenceGpuType": "V100", "durationSeconds": 60}
    )
    d = decide(s, nodes("V100", 2, 4, 4, 3), NOW, planner=planner(s))
    assert d.action is Action.IMPOSSIBLE
    assert "GiB" in d.reason
    assert "usable" in d.reason


def test_throughput_per_dollar_prefers_the_cheaper_type_when_utility_ties() -> None:
    types = [
        {"name": "A100", "pricePerGpuHour": 40.0},
        {"name": "V100", "pricePerGpuHour": 0.5},
    ]
    capacity = nodes("A100", 1, 8, 8, 40) + nodes("V100", 2, 4, 4, 16)
    fast = spec(gpuTypes=types)
    cheap = spec(
        gpuTypes=types,
        parallelism={"modelProfile": "opt-350", "objective": "ThroughputPerDollar"},
    )
    assert decide(fast, capacity, NOW, planner=planner(fast)).gpu_type == "A100"
    assert decide(cheap, capacity, NOW, planner=planner(cheap)).gpu_type == "V100"


def test_per_dollar_objective_needs_prices() -> None:
    with pytest.raises(ValueError, match="pricePerGpuHour"):
        spec(parallelism={"modelProfile": "opt-350", "objective": "ThroughputPerDollar"})
