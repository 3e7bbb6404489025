"""A TrainingJob's worker template must have the shape the operator builds pods from."""

from __future__ import annotations

import re
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec

BASE: dict[str, Any] = {
    "replicas": 1,
    "gpu": {"count": 1},
    "gpuTypes": [{"name": "T4", "relativeSpeed": 1.0}],
    "estimate": {"referenceGpuType": "T4", "durationSeconds": 60},
}
OK = {"name": "w", "image": "registry.example/w:1"}


@pytest.mark.parametrize(
    ("template", "words"),
    [
        pytest.param(
            {"spec": {"containers": "not-a-list"}},
            "spec.containers must be a list",
            id="containers-str",
        ),
        pytest.param({"spec": {"containers": []}}, "at least one container", id="no-containers"),
        pytest.param(
            {"spec": {"containers": [{"name": "w"}]}}, "string name and image", id="no-image"
        ),
        pytest.param(
            {"spec": {"containers": ["w"]}}, "containers[0] must be an object", id="container-str"
        ),
        pytest.param(
            {"spec": {"containers": [OK | {"env": "x"}]}},
            "containers[0].env must be a list",
            id="env",
        ),
        pytest.param(
            {"spec": {"containers": [OK], "nodeSelector": "x"}},
            "nodeSelector must be an object",
            id="selector",
        ),
        pytest.param(
            {"metadata": {"annotations": "x"}},
            "metadata.annotations must be an object",
            id="annotations",
        ),
        pytest.param({"spec": "x"}, "spec must be an object", id="spec-str"),
    ],
)
def test_malformed_templates_are_refused_with_the_field(
    template: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        TrainingJobSpec.model_validate(BASE | {"template": template})


@pytest.mark.parametrize(
    "template",
    [
        pytest.param({}, id="empty"),
        pytest.param({"metadata": {"labels": {"a": "b"}}}, id="metadata-only"),
        pytest.param({"spec": {"containers": [OK | {"env": [], "resources": {}}]}}, id="full"),
    ],
)
def test_well_formed_templates_pass(template: dict[str, Any]) -> None:
    assert TrainingJobSpec.model_validate(BASE | {"template": template}).template == template
