"""Fuzzing the custom resource models and the admission check with hypothesis (issue 20).

Each shipped sample is mutated at a random place in its spec (a value
replaced by arbitrary JSON, or removed). Whatever comes out, the model either
parses it or raises pydantic's ValidationError (a ValueError: the API edge
turns it into a 400 or an InvalidSpec condition), and the admission webhook's
decision (for the kinds the webhook sees: TrainingJob, InferencePipeline,
ModelVariant) answers allowed or denied with a message: neither ever raises
anything else.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chronotope.api.v1alpha1 import MODELS
from chronotope.kube.admission import pod_template_types
from chronotope.workloads.admission import KINDS as WEBHOOK_KINDS
from chronotope.workloads.admission import validate
from tests.unit.workloads.test_admission import FakeLookups

SAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "samples"
DOCS = [
    d
    for path in sorted(SAMPLES.glob("*.yaml"))
    for d in yaml.safe_load_all(path.read_text())
    if d and d.get("kind") in MODELS
]
POD_TYPES = pod_template_types()

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into `value` (dict keys and list indices), the root excluded."""
    out: list[tuple[Any, ...]] = []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        out.append((*at, key))
        out += _paths(child, (*at, key))
    return out


def _mutate(doc: dict[str, Any], path: tuple[Any, ...], new: Any, remove: bool) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    parent: Any = doc["spec"]
    for key in path[:-1]:
        parent = parent[key]
    if remove and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return doc


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = draw(st.sampled_from(DOCS))
    paths = _paths(doc["spec"])
    path = draw(st.sampled_from(paths))
    return doc, _mutate(doc, path, draw(JSON), draw(st.booleans()))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_sample_parses_and_is_admitted(doc: dict[str, Any]) -> None:
    MODELS[doc["kind"]].model_validate(doc)
    if doc["kind"] not in WEBHOOK_KINDS:
        return
    review = validate(doc["kind"], doc, None, FakeLookups(), POD_TYPES)
    assert review.allowed, review.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_a_mutated_object_is_parsed_or_refused_never_crashes(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    sample, doc = pair
    with contextlib.suppress(ValidationError):
        MODELS[doc["kind"]].model_validate(doc)
    if doc["kind"] not in WEBHOOK_KINDS:
        return
    review = validate(doc["kind"], doc, None, FakeLookups(), POD_TYPES)
    assert review.allowed or review.message
    # as an update of the sample it came from (immutable fields of a running job included)
    running = sample | {"status": {"phase": "Running"}}
    update = validate(doc["kind"], doc, running, FakeLookups(), POD_TYPES)
    assert update.allowed or update.message


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(MODELS)), JSON)
def test_any_json_spec_is_parsed_or_refused(kind: str, spec: Any) -> None:
    obj = {"apiVersion": "chronotope.dev/v1alpha1", "kind": kind, "metadata": {"name": "x"}}
    with contextlib.suppress(ValidationError):
        MODELS[kind].model_validate(obj | {"spec": spec})
    if kind not in WEBHOOK_KINDS:
        return
    review = validate(kind, obj | {"spec": spec}, None, FakeLookups(), POD_TYPES)
    assert review.allowed or review.message
