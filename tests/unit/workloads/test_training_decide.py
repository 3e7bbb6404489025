"""TetriSched-style decisions for TrainingJobs: run now, wait for faster GPUs, or never."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.sharing.assignment import GpuAssignment
from chronotope.workloads.capacity import NodeCapacity, cluster_capacity
from chronotope.workloads.gang import worker_pods
from chronotope.workloads.training import Action, decide, utility_at

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def spec(**over: Any) -> TrainingJobSpec:
    base: dict[str, Any] = {
        "replicas": 2,
        "gpu": {"count": 4},
        "gpuTypes": [
            {"name": "H100", "relativeSpeed": 2.0},
            {"name": "V100", "relativeSpeed": 0.5},
        ],
        "estimate": {"referenceGpuType": "H100", "durationSeconds": 7200},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return TrainingJobSpec.model_validate(base | over)


def nodes(model: str, count: int, total: int, free: int) -> list[NodeCapacity]:
    return [NodeCapacity(f"{model}-{i}", model, total, free, True) for i in range(count)]


def test_runs_on_the_fastest_type_with_room() -> None:
    d = decide(spec(), nodes("H100", 1, 8, 8) + nodes("V100", 2, 4, 4), NOW)
    assert (d.action, d.gpu_type, d.workers) == (Action.START, "H100", 2)
    assert d.finish == NOW + timedelta(seconds=7200 / 2.0)


def test_waits_for_faster_gpus_when_the_deadline_says_it_pays() -> None:
    # V100 now: 2 h -> misses a 1.5 h step deadline; H100 frees in 30 min: done in 1 h
    deadline = {"function": "Step", "deadline": (NOW + timedelta(hours=1.5)).isoformat()}
    d = decide(
        spec(utility=deadline, estimate={"referenceGpuType": "H100", "durationSeconds": 3600}),
        nodes("H100", 1, 8, 0) + nodes("V100", 2, 4, 4),
        NOW,
        frees_at={"H100": NOW + timedelta(minutes=30)},
    )
    assert (d.action, d.gpu_type) == (Action.WAIT, "H100")
    assert "running now on V100" in d.reason
    assert "utility 0.00" in d.reason
    assert d.start == NOW + timedelta(minutes=30)  # the plan-ahead's start (predictedStartTime)


def test_runs_on_slower_gpus_when_waiting_does_not_pay() -> None:
    d = decide(
        spec(),
        nodes("H100", 1, 8, 0) + nodes("V100", 2, 4, 4),
        NOW,
        frees_at={"H100": NOW + timedelta(hours=10)},
    )
    assert (d.action, d.gpu_type) == (Action.START, "V100")  # constant utility: no reason to wait


def test_elastic_job_starts_smaller_when_only_part_fits() -> None:
    d = decide(
        spec(replicas=4, minReplicas=2, maxReplicas=4, checkpoint={"path": "/c"}),
        nodes("H100", 1, 8, 8),
        NOW,
    )
    assert (d.action, d.workers) == (Action.START, 2)


@pytest.mark.parametrize(
    ("cluster", "text"),
    [
        (nodes("A100", 2, 8, 8), "no node has H100 GPUs"),
        (nodes("H100", 1, 2, 2) + nodes("V100", 1, 2, 2), "holds at most 0 worker(s)"),
    ],
)
def test_impossible_jobs_say_why(cluster: list[NodeCapacity], text: str) -> None:
    d = decide(spec(), cluster, NOW)
    assert d.action is Action.IMPOSSIBLE
    assert text in d.reason


def test_busy_cluster_means_wait_not_impossible() -> None:
    d = decide(spec(), nodes("H100", 1, 8, 0), NOW)
    assert d.action is Action.WAIT
    assert "room for 0 of 2 worker(s) now" in d.reason


def test_utility_functions() -> None:
    soft, hard = NOW + timedelta(hours=1), NOW + timedelta(hours=3)
    linear = spec(
        utility={
            "function": "LinearDecay",
            "value": 10,
            "softDeadline": soft.isoformat(),
            "deadline": hard.isoformat(),
        }
    )
    assert utility_at(linear.utility, soft) == 10
    assert utility_at(linear.utility, NOW + timedelta(hours=2)) == pytest.approx(5)
    assert utility_at(linear.utility, hard + timedelta(seconds=1)) == 0
    assert utility_at(None, hard) == 1.0


def test_capacity_counts_bound_assignments_and_promised_workers() -> None:
    node = {
        "metadata": {"name": "h", "labels": {"nvidia.com/gpu.product": "H100"}},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    bound = {
        "metadata": {
            "name": "a",
            "namespace": "n",
            "annotations": GpuAssignment(
                node="h",
                gpu_indices=(0, 2, 5),
                gpu_uuids=("GPU-h-0", "GPU-h-2", "GPU-h-5"),
                memory_mib=None,
                compute_percent=None,
                handshake="hs",
            ).to_annotations(),
        },
        "spec": {"schedulerName": "chronotope", "nodeName": "h", "containers": []},
    }
    pending = {
        "metadata": {"name": "b", "namespace": "n"},
        "spec": {
            "schedulerName": "chronotope",
            "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}],
        },
    }
    (cap,) = cluster_capacity([node], [bound, pending])
    assert (cap.total, cap.free) == (8, 1)
    assert cap.free_gpus == (7,)  # untouched: 1, 3, 4, 6, 7; four promised to the pending gang


@pytest.mark.parametrize(
    ("spec_", "schedulable"),
    [
        ({}, True),
        ({"unschedulable": True}, False),  # cordoned
        # Ready, but the node lifecycle controller has not lifted its not-ready taint yet:
        # kube-scheduler places no worker there, so the pass must not plan one there
        ({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]}, False),
        ({"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}, False),
        # a taint of the cluster's own: the job's pod template may tolerate it
        ({"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}, True),
        ({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "PreferNoSchedule"}]}, True),
    ],
)
def test_a_node_is_schedulable_unless_cordoned_or_tainted_by_a_condition(
    spec_: dict[str, Any], schedulable: bool
) -> None:
    node = {
        "metadata": {"name": "h", "labels": {"nvidia.com/gpu.product": "H100"}},
        "spec": spec_,
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    (cap,) = cluster_capacity([node], [])
    assert cap.schedulable is schedulable


def test_worker_pods_carry_gang_labels_and_launcher_env() -> None:
    job = {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u-1"},
    }
    s = spec(placement={"strategy": "StrictSpread"})
    d = decide(s, nodes("H100", 2, 8, 8), NOW)
    pods = worker_pods(job, s, d, generation=3)
    assert [p["metadata"]["name"] for p in pods] == ["j-g3-0", "j-g3-1"]
    first = pods[1]
    assert first["spec"]["schedulerName"] == "chronotope"
    assert first["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "H100"
    assert first["metadata"]["labels"]["chronotope.dev/pod-group"] == "j-g3"
    assert first["metadata"]["annotations"]["chronotope.dev/pod-group-size"] == "2"
    assert first["metadata"]["annotations"]["chronotope.dev/placement-strategy"] == "StrictSpread"
    env = {e["name"]: e["value"] for e in first["spec"]["containers"][0]["env"]}
    assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "2")
    assert env["MASTER_ADDR"] == "j-0.j.ns.svc"
    assert first["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert first["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert "chronotope.dev/planned-node" not in first["metadata"]["annotations"]
    assert "chronotope.dev/placement-topology" not in first["metadata"]["annotations"]
    # a required topology reaches the extender's own gang reservation; a wish does not
    for required, expect in ((True, "Rack"), (False, None)):
        placement = {"strategy": "StrictSpread", "topology": "Rack", "required": required}
        ranked = spec(placement=placement)
        got = worker_pods(job, ranked, d, generation=3)[0]["metadata"]["annotations"]
        assert got.get("chronotope.dev/placement-topology") == expect
    planned = replace(d, placements=(("h-0", (0, 1, 2, 3)), ("h-1", (4, 5, 6, 7))))
    for pod, (node, gpus) in zip(
        worker_pods(job, s, planned, generation=3), planned.placements, strict=True
    ):
        annotations = pod["metadata"]["annotations"]
        assert annotations["chronotope.dev/planned-node"] == node
        assert annotations["chronotope.dev/planned-gpus"] == ",".join(map(str, gpus))


def test_on_equal_utility_the_job_starts_now() -> None:
    d = decide(
        spec(),
        nodes("H100", 1, 8, 0) + nodes("V100", 2, 4, 4),
        NOW,
        frees_at={"H100": NOW + timedelta(minutes=10)},
    )
    assert (d.action, d.gpu_type) == (Action.START, "V100")


def test_worker_pods_drop_annotations_only_the_scheduler_may_write() -> None:
    job = {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u-1"},
    }
    forged = {
        "chronotope.dev/assigned-gpus": "0,1,2,3",
        "chronotope.dev/assigned-compute-percent": "1",
        "chronotope.dev/handshake": "x",
        "team.example/owner": "ml",
    }
    s = spec(
        template={
            "metadata": {"annotations": forged},
            "spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]},
        }
    )
    d = decide(s, nodes("H100", 2, 8, 8), NOW)
    for pod in worker_pods(job, s, d, generation=1):
        annotations = pod["metadata"]["annotations"]
        assert annotations["team.example/owner"] == "ml"  # the user's own keys stay
        assert not [k for k in annotations if "assigned-" in k or k.endswith("/handshake")]
