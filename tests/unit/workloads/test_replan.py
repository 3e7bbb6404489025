"""Re-planning a running elastic gang when GPUs free up: only when it clearly pays."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import cluster_capacity
from chronotope.workloads.podreq import PLANNED_NODE_ANNOTATION
from chronotope.workloads.replan import avoid_after_stuck, better_plan, completed_fraction
from chronotope.workloads.training import Action, Decision

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def running(workers: int, started_h_ago: float, full_h: float) -> dict[str, object]:
    start = NOW - timedelta(hours=started_h_ago)
    return {
        "gpuType": "A100",
        "workers": workers,
        "startTime": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "predictedCompletionTime": (start + timedelta(hours=full_h)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def start(workers: int, full_h: float) -> Decision:
    return Decision(Action.START, "", "A100", workers, 1, NOW + timedelta(hours=full_h), 1.0)


def test_twice_the_workers_halfway_through_pays() -> None:
    # 2 workers, 4 h job, 1 h done: 3 h left; 4 workers take 2 h for the whole job -> 1.5 h left
    why = better_plan(running(2, 1, 4), start(4, 2), NOW)
    assert why is not None
    assert "4 worker(s) on A100" in why
    assert "earlier" in why


def test_no_restart_near_the_end() -> None:
    # 2 min left: a 60 s restart plus half of it is not worth it
    assert better_plan(running(2, 4 - 2 / 60, 4), start(4, 2), NOW) is None


def test_no_restart_for_the_same_plan_or_a_wait() -> None:
    assert better_plan(running(2, 1, 4), start(2, 4), NOW) is None
    assert better_plan(running(2, 1, 4), Decision(Action.WAIT, "busy"), NOW) is None


def test_a_plan_without_times_is_left_alone() -> None:
    assert better_plan({"workers": 2}, start(4, 2), NOW) is None


def test_work_done_accumulates_over_restarts() -> None:
    status = {"phase": "Running", "plan": running(2, 1, 4)}  # a quarter of the way
    assert completed_fraction(status, NOW) == 0.25
    again = {"phase": "Running", "completedFraction": 0.25, "plan": running(4, 1, 3)}
    assert completed_fraction(again, NOW) == 0.5  # a third of the remaining 0.75
    assert completed_fraction({"phase": "Waiting", "completedFraction": 0.5}, NOW) == 0.5
    finished = {"phase": "Running", "plan": running(2, 9, 4)}
    assert completed_fraction(finished, NOW) == 0.99  # never "done" by estimate alone


def _gpu_node(name: str, *, cordoned: bool = False) -> dict[str, object]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "A100"}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_stuck_gang_avoids_its_nodes_but_never_all_the_schedulable_ones() -> None:
    spec = TrainingJobSpec.model_validate(
        {
            "replicas": 1,
            "gpu": {"count": 8},
            "gpuTypes": [{"name": "A100", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "A100", "durationSeconds": 3600},
            "template": {"spec": {"containers": [{"name": "w", "image": "r/t:1"}]}},
        }
    )
    stuck = {"metadata": {"annotations": {PLANNED_NODE_ANNOTATION: "a"}}, "spec": {}}
    bound = {"metadata": {"annotations": {PLANNED_NODE_ANNOTATION: "b"}}, "spec": {"nodeName": "b"}}
    open_b = tuple(cluster_capacity([_gpu_node("a"), _gpu_node("b")], []))
    assert avoid_after_stuck({}, [stuck, bound], spec, open_b) == ["a"]
    # the only other node is cordoned: no way out there now, so nothing is avoided
    cordoned_b = tuple(cluster_capacity([_gpu_node("a"), _gpu_node("b", cordoned=True)], []))
    assert avoid_after_stuck({}, [stuck], spec, cordoned_b) == []
    # a worker with no planned node (placed by the extender's policy) names none
    assert avoid_after_stuck({"avoidNodes": ["x"]}, [{"spec": {}}], spec, open_b) == ["x"]
