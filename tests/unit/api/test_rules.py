"""Cross-field rules in Python, table-driven; the same rules run as CEL in the API server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from chronotope.api.v1alpha1 import ApiModel, InferencePipelineSpec, TrainingJobSpec
from chronotope.api.v1alpha1._base import camel_alias


def _stage(name: str) -> dict[str, Any]:
    batches = [{"batchSize": 1, "latencyMs": 10, "throughputQPS": 100}]
    return {
        "name": name,
        "model": {"image": "img"},
        "profiles": [{"gpuType": "T4", "batches": batches}],
    }


def _pipeline(stages: list[str], edges: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "stages": [_stage(s) for s in stages],
        "edges": [{"from": a, "to": b} for a, b in edges],
        "slo": {"p99LatencyMs": 100},
        "traffic": {"fixedQPS": 10},
    }


@pytest.mark.parametrize(
    ("stages", "edges", "problem"),
    [
        (["a", "b", "c"], [("a", "b"), ("b", "c"), ("a", "c")], None),
        (["a", "b", "c"], [("a", "c"), ("a", "b")], None),
        (["a", "b"], [("b", "a")], "topological order"),
        (["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "b")], "topological order"),
        (["a", "b"], [("a", "a")], "topological order"),
        (["a", "b"], [("a", "b"), ("a", "b")], "edges must be unique"),
        (["a", "b"], [("a", "x")], "existing stages"),
        (["a", "b", "c"], [("a", "b")], "incoming edge"),
        (["a", "a"], [("a", "a")], "stage names must be unique"),
    ],
)
def test_pipeline_dag_rules(
    stages: list[str], edges: list[tuple[str, str]], problem: str | None
) -> None:
    spec = _pipeline(stages, edges)
    if problem is None:
        InferencePipelineSpec.model_validate(spec)
    else:
        with pytest.raises(ValidationError, match=problem):
            InferencePipelineSpec.model_validate(spec)


def _job(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 4,
        "template": {},
        "gpu": {"count": 1},
        "gpuTypes": [{"name": "A100", "relativeSpeed": 1}],
        "estimate": {"referenceGpuType": "A100", "durationSeconds": 60},
    }
    spec.update(overrides)
    return spec


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"minReplicas": 4, "maxReplicas": 4}, None),
        ({"minReplicas": 2}, "needs checkpoint"),
        ({"minReplicas": 2, "checkpoint": {"path": "/c"}}, None),
        ({"maxReplicas": 3}, "at most maxReplicas"),
        ({"minReplicas": 5, "checkpoint": {"path": "/c"}}, "at least minReplicas"),
        ({"gpuTypes": [{"name": "A100", "relativeSpeed": 1}] * 2}, "unique"),
        ({"gpuTypes": [{"name": "A100"}], "parallelism": {"modelProfile": "p"}}, None),
        ({"gpu": {}}, "exactly one of count"),
        ({"utility": {"function": "LinearDecay", "deadline": "2030-01-01T00:00:00Z"}}, "both"),
        ({"checkpoint": {"path": "relative/dir"}}, "pattern"),
    ],
)
def test_training_job_rules(overrides: dict[str, Any], problem: str | None) -> None:
    if problem is None:
        TrainingJobSpec.model_validate(_job(**overrides))
    else:
        with pytest.raises(ValidationError, match=problem):
            TrainingJobSpec.model_validate(_job(**overrides))


def test_json_names_are_kubernetes_style() -> None:
    assert camel_alias("memory_mib") == "memoryMiB"
    assert camel_alias("fixed_qps") == "fixedQPS"
    assert camel_alias("gpu_types") == "gpuTypes"
    assert camel_alias("p99_latency_ms") == "p99LatencyMs"


def _all_models(model: type[ApiModel], seen: set[type[ApiModel]]) -> set[type[ApiModel]]:
    seen.add(model)
    for field in model.model_fields.values():
        for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
            inner = getattr(arg, "__args__", (arg,))
            for candidate in (arg, *inner):
                is_model = isinstance(candidate, type) and issubclass(candidate, ApiModel)
                if is_model and candidate not in seen:
                    _all_models(candidate, seen)
    return seen


def test_every_rule_has_cel_and_python() -> None:
    for model in _all_models(TrainingJobSpec, set()) | _all_models(InferencePipelineSpec, set()):
        for rule in model.rules:
            assert rule.cel
            assert rule.message
            assert callable(rule.check)
