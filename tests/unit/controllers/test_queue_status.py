"""Queue and LocalQueue status from the cluster's TrainingJobs (fake ClusterOps)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

import chronotope.controllers.queues as queues_module
from chronotope.controllers.queues import (
    QueueOps,
    Reports,
    reconcile_local_queue,
    reconcile_queue,
    write_statuses,
)
from tests.unit.controllers.test_reconcile import NOW, FakeOps, job, node
from tests.unit.controllers.test_reconcile_quota import local_queue, queue, running, team_job


class CountingOps(FakeOps):
    reads = 0

    def training_jobs(self) -> list[dict[str, Any]]:
        self.reads += 1
        return super().training_jobs()


def _ops() -> CountingOps:
    a1 = running(team_job("a1", "a"))
    a1["status"]["plan"]["predictedCompletionTime"] = "2030-01-01T14:00:00Z"
    ops = CountingOps([node("h-0"), node("h-1")], [a1, team_job("a2", "a", 1), job("x")])
    ops.queue_objs = [
        queue("team-a", 4, cohort="ml") | {"metadata": {"name": "team-a", "generation": 3}},
        queue("team-b", 8, cohort="ml"),
    ]
    ops.local_queue_objs = [local_queue("a", "team-a"), local_queue("ns", "gone")]
    return ops


def test_a_queue_reports_usage_borrowing_and_its_next_release() -> None:
    ops = _ops()
    out = reconcile_queue(ops.queue_objs[0], ops, NOW)
    (row,) = out.status["gpus"]
    assert (row["gpuType"], row["used"], row["borrowed"]) == ("H100", 8, 4)
    assert (out.status["admittedWorkloads"], out.status["pendingWorkloads"]) == (1, 1)
    (active,) = out.status["conditions"]
    assert active["type"] == "Active"
    assert active["observedGeneration"] == 3
    assert active["message"] == (
        "1 admitted, 1 pending; 8 GPU(s) in use; "
        "next predicted releases: 8 H100 at 2030-01-01 14:00 (a/a1)"
    )
    lender = reconcile_queue(ops.queue_objs[1], ops, NOW)
    assert lender.status["gpus"][0]["lent"] == 4


def test_a_pipeline_waiting_for_quota_is_pending_in_its_queue_and_local_queue() -> None:
    ops = _ops()
    ops.pipeline_objs = [
        {
            "metadata": {"name": "web", "namespace": "a"},
            "spec": {},
            "status": {"phase": "Pending", "whyWaiting": "waiting for quota: queue team-a: ..."},
        }
    ]
    out = reconcile_queue(ops.queue_objs[0], ops, NOW)
    assert (out.status["admittedWorkloads"], out.status["pendingWorkloads"]) == (1, 2)
    assert [q["workload"] for q in out.status["pendingHead"]] == ["a/a2", "a/pipeline:web"]
    assert out.status["conditions"][0]["message"].startswith("1 admitted, 2 pending;")
    local = reconcile_local_queue(ops.local_queue_objs[0], ops, NOW)
    assert local.status["pendingWorkloads"] == 2


def test_a_stopped_queue_is_inactive_and_says_so() -> None:
    ops = _ops()
    ops.queue_objs[0]["spec"]["stopPolicy"] = "HoldAndDrain"
    (active,) = reconcile_queue(ops.queue_objs[0], ops, NOW).status["conditions"]
    assert (active["status"], active["reason"]) == ("False", "Stopped")
    assert active["message"].startswith("stopPolicy HoldAndDrain, draining: admits nothing; ")
    ops.queue_objs[0]["spec"]["stopPolicy"] = "Hold"
    (active,) = reconcile_queue(ops.queue_objs[0], ops, NOW).status["conditions"]
    assert active["message"].startswith("stopPolicy Hold, admits nothing new; 1 admitted")


def test_a_local_queue_of_a_missing_queue_is_inactive() -> None:
    ops = _ops()
    out = reconcile_local_queue(ops.local_queue_objs[1], ops, NOW)
    (active,) = out.status["conditions"]
    assert (active["status"], active["reason"]) == ("False", "QueueMissing")
    assert out.status["pendingWorkloads"] == 1  # job x names LocalQueue default in ns
    ok = reconcile_local_queue(ops.local_queue_objs[0], ops, NOW)
    assert ok.status["conditions"][0]["status"] == "True"


def test_one_reading_serves_every_queue_within_its_ttl() -> None:
    ops = _ops()
    clock = [0.0]
    reports = Reports(ttl_s=1.0, clock=lambda: clock[0])
    for obj in ops.queue_objs:
        reconcile_queue(obj, ops, NOW, reports=reports)
    reconcile_local_queue(ops.local_queue_objs[0], ops, NOW, reports)
    assert ops.reads == 1
    clock[0] = 1.0
    reconcile_queue(ops.queue_objs[0], ops, NOW, reports=reports)
    assert ops.reads == 2


class WritingOps(CountingOps):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def write_queue_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.writes.append((name, dict(status)))
        obj = next(q for q in self.queue_objs if q["metadata"]["name"] == name)
        obj["status"] = {**obj.get("status", {}), **status}

    def write_local_queue_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> None:
        self.writes.append((f"{namespace}/{name}", dict(status)))
        obj = next(
            q
            for q in self.local_queue_objs
            if (q["metadata"]["namespace"], q["metadata"]["name"]) == (namespace, name)
        )
        obj["status"] = {**obj.get("status", {}), **status}


def _check(ops: WritingOps) -> QueueOps:
    return ops  # mypy checks the fake against the Protocol


def test_a_pass_writes_what_changed_reading_the_jobs_once() -> None:
    base = _ops()
    ops = WritingOps(base._nodes, base._jobs)
    ops.queue_objs, ops.local_queue_objs = base.queue_objs, base.local_queue_objs
    assert write_statuses(ops, NOW) == 4
    assert ops.reads == 1
    assert sorted(name for name, _ in ops.writes) == ["a/default", "ns/default", "team-a", "team-b"]
    assert write_statuses(ops, NOW) == 0  # nothing changed: nothing written


def test_the_status_loop_writes_again_only_once_something_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    passes: list[int] = []
    monkeypatch.setattr(queues_module, "write_statuses", lambda *_a, **_k: passes.append(1))
    stop, changed = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=queues_module.run_status_loop,
        args=(FakeOps([], []), stop, 0.05),
        kwargs={"changed": changed, "idle_s": 60.0},
    )
    thread.start()
    try:
        time.sleep(0.5)
        assert len(passes) == 1  # nothing changed: one pass, then quiet
        changed.set()
        time.sleep(0.5)
        assert len(passes) == 2
    finally:
        stop.set()
        thread.join(timeout=5)
