"""`KubeClusterOps.write`: one status patch per start, and the fallback for an older CRD."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from chronotope.kube import trainingjob_ops
from chronotope.sharing.labels import PLANNED_FOR_ANNOTATION

JOB = {"metadata": {"namespace": "ns", "name": "j", "uid": "u-1", "annotations": {}}}
STARTED = {"phase": "Starting", "plan": {"gpuType": "L4", "workers": 2, "plannedForReplicas": 2}}


class FakeCustomObjects:
    """The two TrainingJob patches; `prunes` drops what an older CRD's schema lacks."""

    def __init__(self, prunes: bool) -> None:
        self.prunes = prunes
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def patch_namespaced_custom_object_status(self, *args: Any) -> dict[str, Any]:
        body: dict[str, Any] = copy.deepcopy(args[-1])
        self.calls.append(("status", body))
        if self.prunes:
            body["status"].get("plan", {}).pop("plannedForReplicas", None)
        return copy.deepcopy(JOB) | body

    def patch_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("object", args[-1]))
        return copy.deepcopy(JOB)


@pytest.mark.parametrize("prunes", [False, True])
def test_a_start_is_one_status_patch_unless_the_crd_prunes_the_planned_replicas(
    monkeypatch: pytest.MonkeyPatch, prunes: bool, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeCustomObjects(prunes)
    monkeypatch.setattr(client, "CustomObjectsApi", lambda _api: fake)
    ops = trainingjob_ops.KubeClusterOps(api=None)
    ops.write(JOB, STARTED, {}, [])
    ops.write(JOB, STARTED, {}, [])
    if not prunes:
        assert [kind for kind, _ in fake.calls] == ["status", "status"]
        assert "CRD" not in caplog.text
        return
    # an older CRD: the replicas go to the annotation the reconcile falls back to
    assert [kind for kind, _ in fake.calls] == ["status", "object", "status", "object"]
    assert fake.calls[1][1] == {"metadata": {"annotations": {PLANNED_FOR_ANNOTATION: "2"}}}
    assert caplog.text.count("older than this operator") == 1  # warned once


def test_a_status_without_a_plan_needs_no_annotation(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCustomObjects(prunes=True)
    monkeypatch.setattr(client, "CustomObjectsApi", lambda _api: fake)
    ops = trainingjob_ops.KubeClusterOps(api=None)
    ops.write(JOB, {"phase": "Waiting", "whyWaiting": "queued"}, {}, [])
    assert [kind for kind, _ in fake.calls] == ["status"]
