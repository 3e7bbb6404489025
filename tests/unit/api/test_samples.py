"""Samples validate against the models; every invalid fixture is rejected naming its field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from chronotope.api.v1alpha1 import MODELS

REPO_ROOT = Path(__file__).resolve().parents[3]
SAMPLES = sorted((REPO_ROOT / "manifests" / "samples").glob("*.yaml"))
INVALID = sorted((REPO_ROOT / "tests" / "fixtures" / "invalid").glob("*.yaml"))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _expectations(path: Path) -> dict[str, str]:
    found = re.findall(r"^# expect-(\w+): (.+)$", path.read_text(), flags=re.M)
    return dict(found)


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_is_valid_and_round_trips(path: Path) -> None:
    for doc in _docs(path):
        model = MODELS[doc["kind"]].model_validate(doc)
        dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
        assert MODELS[doc["kind"]].model_validate(dumped) == model


def test_every_kind_has_a_sample() -> None:
    kinds = {doc["kind"] for path in SAMPLES for doc in _docs(path)}
    assert kinds == set(MODELS)


def _error_paths(error: ValidationError) -> list[str]:
    """Dotted API paths, e.g. `spec.edges[0].fraction`, each followed by its message."""
    found = []
    for item in error.errors():
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        msg = item["msg"].removeprefix("Value error, ")
        for part in msg.split("; "):
            field, sep, _ = part.partition(": ")
            rule_field = f".{field}" if sep and " " not in field else ""
            found.append(f"{loc.lstrip('.')}{rule_field}: {part}")
    return found


def _models_check(path: Path) -> bool:
    """False for fixtures only the API server checks (`# expect-checker: apiserver`).

    Those break a Kubernetes type the CRD embeds (a pod template), whose schema
    comes from the Kubernetes OpenAPI; e2e/api checks them on the real server.
    """
    return _expectations(path).get("checker") != "apiserver"


MODEL_CHECKED = [p for p in INVALID if _models_check(p)]


@pytest.mark.parametrize("path", MODEL_CHECKED, ids=[p.stem for p in MODEL_CHECKED])
def test_invalid_fixture_is_rejected_by_the_models_naming_the_field(path: Path) -> None:
    expect = _expectations(path)
    assert {"field", "message"} <= set(expect), f"{path.name} lacks expect- headers"
    doc = _docs(path)[0]
    with pytest.raises(ValidationError) as caught:
        MODELS[doc["kind"]].model_validate(doc)
    paths = _error_paths(caught.value)
    assert any(p.startswith(f"{expect['field']}:") for p in paths), paths


def test_the_samples_applied_together_admit_every_workload_in_one_namespace() -> None:
    # `kubectl apply -f manifests/samples/` (make demo) creates the Queues, which turns quotas
    # on: every sample workload must find its LocalQueue in that namespace and quota for a
    # GPU type it can use, or the demo shows it waiting (as it once did: "no LocalQueue
    # research in namespace default")
    from chronotope.api.v1alpha1 import InferencePipeline, LocalQueueSpec, QueueSpec, TrainingJob
    from chronotope.workloads.quota import (
        PendingWorkload,
        QuotaBook,
        Unit,
        Verdict,
        admit,
        demands_of,
    )

    docs = [doc for path in SAMPLES for doc in _docs(path)]
    queues = {
        d["metadata"]["name"]: QueueSpec.model_validate(d["spec"])
        for d in docs
        if d["kind"] == "Queue"
    }
    local = {
        ("default", d["metadata"]["name"]): LocalQueueSpec.model_validate(d["spec"])
        for d in docs
        if d["kind"] == "LocalQueue"
    }
    for doc in (d for d in docs if d["kind"] == "TrainingJob"):
        job = TrainingJob.model_validate(doc).spec
        name = doc["metadata"]["name"]
        pending = PendingWorkload(name, "default", job.queue, demands_of(job))
        verdict = admit(QuotaBook(queues, local), [pending])[name]
        assert verdict.verdict in (Verdict.ADMIT, Verdict.BORROW), (name, verdict.message)
    for doc in (d for d in docs if d["kind"] == "InferencePipeline"):
        pipeline = InferencePipeline.model_validate(doc).spec
        book = QuotaBook(queues, local)
        target = book.local_queues.get(("default", pipeline.queue))
        assert target is not None, f"no LocalQueue {pipeline.queue} for {doc['metadata']['name']}"
        quota = book.queues[target]
        for stage in pipeline.stages:
            unit = Unit.SHARE_MILLI if stage.gpu is not None and stage.gpu.shared else Unit.GPUS
            room = [p.gpu_type for p in stage.profiles if book.ceiling(quota, (p.gpu_type, unit))]
            assert room, f"stage {stage.name}: queue {target} holds no {unit.value} of its types"
    if any(d["kind"] == "ModelVariant" for d in docs):  # serving groups use LocalQueue default
        assert ("default", "default") in local
