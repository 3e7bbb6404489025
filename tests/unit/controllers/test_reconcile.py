"""`reconcile` end to end against a fake `ClusterOps` (the seam to the API server)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.controllers.trainingjob import (
    STUCK_AFTER_S,
    ClusterOps,
    PassCache,
    merged_status,
    reconcile,
)
from chronotope.planners.profile import ModelProfile
from chronotope.sharing.labels import (
    GENERATION_ANNOTATION,
    PLANNED_FOR_ANNOTATION,
    PREEMPTED_BY_ANNOTATION,
)
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.node_fit import (
    RuntimeRule,
    VolumeLimits,
    VolumeRule,
    runtime_rules,
    volume_limits,
    volume_rules,
)
from chronotope.workloads.podreq import PLANNED_NODE_ANNOTATION

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class FakeOps:
    """Nodes, pods and jobs in memory; records what `reconcile` asks to write."""

    def __init__(self, nodes: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        self.decide_lock = threading.Lock()
        self._nodes = nodes
        self._pods: list[dict[str, Any]] = []
        self._jobs = jobs
        self.started: list[dict[str, Any]] = []
        self.services: list[dict[str, Any] | None] = []
        self.stopped: list[str] = []
        self.preempted: list[tuple[str, str]] = []
        self.annotated: dict[str, str] = {}
        """job key -> the `preempted-by` annotation `preempt` wrote on it"""
        self.queue_objs: list[dict[str, Any]] = []
        self.local_queue_objs: list[dict[str, Any]] = []
        self.namespace_objs: list[dict[str, Any]] = []
        self.pipeline_objs: list[dict[str, Any]] = []
        self.variant_objs: list[dict[str, Any]] = []
        self.claim_objs: list[dict[str, Any]] = []
        self.volume_objs: list[dict[str, Any]] = []
        self.runtime_objs: list[dict[str, Any]] = []
        self.csi_node_objs: list[dict[str, Any]] = []

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def volume_rules(self) -> dict[str, VolumeRule]:
        return volume_rules(self.claim_objs, self.volume_objs)

    def runtime_rules(self) -> dict[str, RuntimeRule]:
        return runtime_rules(self.runtime_objs)

    def volume_limits(self) -> VolumeLimits:
        return volume_limits(self.csi_node_objs, [], self.volume_objs)

    def pods(
        self, namespace: str | None = None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        out = self._pods
        if namespace is not None:
            out = [p for p in out if p["metadata"]["namespace"] == namespace]
        if selector is not None:
            key, _, value = selector.partition("=")
            out = [p for p in out if p["metadata"].get("labels", {}).get(key) == value]
        return out

    def training_jobs(self) -> list[dict[str, Any]]:
        return self._jobs

    def model_profile(self, namespace: str, name: str) -> ModelProfile | str:
        return f"model profile {name} not found"

    def start(
        self, namespace: str, service: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> None:
        self.services.append(service)
        self.started += pods
        self._pods += pods

    def stop(self, namespace: str, names: Sequence[str]) -> None:
        self.stopped += names
        self._pods = [p for p in self._pods if p["metadata"]["name"] not in names]

    def inference_pipelines(self) -> list[dict[str, Any]]:
        return self.pipeline_objs

    def model_variants(self) -> list[dict[str, Any]]:
        return self.variant_objs

    def queues(self) -> list[dict[str, Any]]:
        return self.queue_objs

    def local_queues(self) -> list[dict[str, Any]]:
        return self.local_queue_objs

    def namespaces(self) -> list[dict[str, Any]]:
        return self.namespace_objs

    def preempt(self, job_key: str, by: str, why: str, grace_seconds: int) -> None:
        self.preempted.append((job_key, by))
        self.annotated[job_key] = f"{by} ({why})"  # as `TrainingJobOps.preempt` writes it


def _pods_are(ops: FakeOps, node_name: str, phase: str) -> None:
    """Every worker `reconcile` created is bound to `node_name` and in `phase`."""
    for pod in ops._pods:
        pod["spec"]["nodeName"] = node_name
        pod["status"] = {"phase": phase}


def _check_protocol(ops: FakeOps) -> ClusterOps:
    return ops  # mypy checks the fake against the Protocol


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100"}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def job(name: str, workers: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": "2030-01-01T00:00:00Z",
            "annotations": {},
        },
        "spec": {
            "replicas": workers,
            "gpu": {"count": 8},
            "gpuTypes": [{"name": "H100", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "H100", "durationSeconds": 3600},
            "checkpoint": {"path": "/ckpt"},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
        "status": dict(status),
    }


def test_a_job_that_fits_starts_its_gang() -> None:
    me = job("a", workers=2)
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Starting"
    assert out.status["plan"]["gpuType"] == "H100"
    assert out.status["plan"]["workers"] == 2
    assert out.status["plan"]["plannedForReplicas"] == 2
    assert out.annotations == {}  # one status patch starts it
    assert [p["metadata"]["name"] for p in ops.started] == ["a-g0-0", "a-g0-1"]
    assert [e[1] for e in out.events] == ["Started"]
    assert [s["metadata"]["name"] for s in ops.services if s] == ["a"]  # its rendezvous
    # no Queue exists: nothing holds it back for quota (Kueue's QuotaReserved condition)
    (quota,) = [c for c in out.status["conditions"] if c["type"] == "QuotaReserved"]
    assert (quota["status"], quota["reason"]) == ("True", "QuotasOff")


def test_a_start_reports_how_long_the_job_waited_since_its_creation() -> None:
    me = job("a")  # created at midnight, started at noon, never waited before
    out = reconcile(me, FakeOps([node("h-0")], [me]), NOW)
    assert out.admitted == ("", 12 * 3600.0)  # no Queues: no queue label


def test_a_requeued_job_waits_from_when_it_last_stopped_running() -> None:
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    _pods_are(ops, "h-gone", "Running")
    ops._nodes.append(node("h-gone"))
    running = reconcile(me, ops, NOW + timedelta(minutes=1))
    assert running.status["phase"] == "Running"
    assert running.admitted is None
    me["status"] |= merged_status(me["status"], running.status)  # as the patch lands
    ops._pods.clear()  # its gang is gone: preempted
    me["metadata"]["annotations"][PREEMPTED_BY_ANNOTATION] = "ns/b (higher priority)"
    stopped = reconcile(me, ops, NOW + timedelta(hours=1))
    assert stopped.preempted == ("Priority", "")
    me["status"] |= merged_status(me["status"], stopped.status)
    me["metadata"]["annotations"].update(stopped.annotations)
    again = reconcile(me, ops, NOW + timedelta(hours=1, seconds=90))
    assert again.status["phase"] == "Starting"
    assert again.admitted == ("", 90.0)  # from the stop, not from its creation


def test_a_one_worker_gang_has_no_service_and_rendezvous_on_localhost() -> None:
    me = job("solo")
    ops = FakeOps([node("h-0")], [me])
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Starting"
    assert ops.services == [None]
    env = {e["name"]: e["value"] for e in ops.started[0]["spec"]["containers"][0]["env"]}
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["RANK"]) == ("localhost", "1", "0")


def test_a_job_that_cannot_fit_says_why_once() -> None:
    me = job("big", workers=3)  # 24 GPUs on a 16-GPU cluster
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Pending"
    assert ops.started == []
    assert "at most 2 worker(s)" in out.status["whyWaiting"]
    assert [e[:2] for e in out.events] == [("Warning", "Unschedulable")]
    assert out.events[0][2] == out.status["whyWaiting"]
    me["status"] = out.status  # the same reason next time: no second event
    assert reconcile(me, ops, NOW).events == []


def test_a_second_job_waits_behind_the_first_in_its_queue() -> None:
    first, second = job("first"), job("second")
    second["metadata"]["creationTimestamp"] = "2030-01-01T00:00:01Z"
    ops = FakeOps([node("h-0")], [first, second])
    assert reconcile(second, ops, NOW).status["whyWaiting"].startswith("queued behind ns/first")
    assert reconcile(first, ops, NOW).status["phase"] == "Starting"


def test_a_running_gang_that_lost_its_node_restarts_from_its_checkpoint() -> None:
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    started = reconcile(me, ops, NOW)
    me["status"] = started.status
    _pods_are(ops, "h-gone", "Running")
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Resizing"
    assert out.status["restarts"] == 1
    assert out.annotations[GENERATION_ANNOTATION] == "1"
    assert out.annotations[PREEMPTED_BY_ANNOTATION] == ""
    assert ops.stopped == ["a-g0-0"]
    assert out.events[0][:2] == ("Warning", "WorkersLost")


def test_a_gang_whose_preemptor_stopped_some_workers_reports_the_preemption_not_lost_ones() -> None:
    # the preemptor annotates the victim, then deletes its workers: its reconcile may see
    # one of two gone while the other still runs. It said "lost 1 worker(s) (node gone or
    # worker failed)" (WorkersLost), seen at scale for the victims of leases in a queue
    me = job("a", workers=2)
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    _pods_are(ops, "h-0", "Running")
    ops._pods.pop()  # the second worker is already stopped
    me["metadata"]["annotations"][PREEMPTED_BY_ANNOTATION] = (
        "ns/b (cluster policy's lease in queue team-a)"
    )
    out = reconcile(me, ops, NOW + timedelta(minutes=1))
    assert out.status["phase"] == "Resizing"
    assert out.preempted == ("Lease", "team-a")
    assert [e[:2] for e in out.events] == [("Warning", "Preempted")]
    assert "preempted by ns/b" in out.events[0][2]
    assert ops.stopped == []  # the preemptor stops the rest with its grace period
    # without the annotation, the same is a lost worker
    del me["metadata"]["annotations"][PREEMPTED_BY_ANNOTATION]
    lost = reconcile(me, ops, NOW + timedelta(minutes=1))
    assert [e[:2] for e in lost.events] == [("Warning", "WorkersLost")]


def test_kubectl_scale_of_a_running_job_restarts_its_gang_at_the_new_size() -> None:
    me = job("a")
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    _pods_are(ops, "h-0", "Running")
    assert reconcile(me, ops, NOW).status["phase"] == "Running"
    me["spec"]["replicas"] = 2  # kubectl scale trainingjob/a --replicas=2
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Resizing"
    assert out.events[0][1] == "Resizing"
    assert "resizing from 1 to 2 worker(s)" in out.events[0][2]
    (quota,) = [c for c in out.status["conditions"] if c["type"] == "QuotaReserved"]
    assert (quota["status"], quota["reason"]) == ("False", "Requeued")  # released while it waits
    assert ops.stopped == ["a-g0-0"]


def test_a_job_started_before_the_plan_recorded_its_replicas_uses_the_annotation() -> None:
    # an operator upgraded under a running job: the plan has no plannedForReplicas
    me = job("a")
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    del me["status"]["plan"]["plannedForReplicas"]
    me["metadata"]["annotations"][PLANNED_FOR_ANNOTATION] = "1"
    _pods_are(ops, "h-0", "Running")
    assert reconcile(me, ops, NOW).status["phase"] == "Running"
    me["spec"]["replicas"] = 2
    assert reconcile(me, ops, NOW).status["phase"] == "Resizing"


def test_a_gang_whose_workers_all_succeeded_is_done() -> None:
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    _pods_are(ops, "h-0", "Succeeded")
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Succeeded"
    got = {c["type"]: (c["status"], c["reason"]) for c in out.status["conditions"]}
    # it runs no more, and holds no quota
    assert got == {"Running": ("False", "Succeeded"), "QuotaReserved": ("False", "Finished")}
    assert reconcile(me | {"status": out.status}, ops, NOW).status == {}  # done: left alone


def test_a_job_that_ran_twice_its_predicted_time_records_an_estimate_ratio_of_two() -> None:
    """The ratio the cluster policy learns estimate errors from (workloads.fleet)."""
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    me["status"] = reconcile(me, ops, NOW).status | {"phase": "Running"}
    plan = me["status"]["plan"]
    start = datetime.fromisoformat(plan["startTime"])
    span = datetime.fromisoformat(plan["predictedCompletionTime"]) - start
    _pods_are(ops, "h-0", "Succeeded")
    out = reconcile(me, ops, start + 2 * span)
    assert out.status["phase"] == "Succeeded"
    assert out.status["estimateRatio"] == 2.0


def test_workers_of_an_old_generation_are_stopped() -> None:
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    me["metadata"]["annotations"][GENERATION_ANNOTATION] = "1"
    reconcile(me, ops, NOW)
    assert "a-g0-0" in ops.stopped
    assert all(p["metadata"]["labels"][JOB_LABEL] == "a" for p in ops.started)


def _failed_worker(restart: dict[str, Any], restarts: int) -> tuple[Any, FakeOps]:
    me = job("a")
    me["spec"]["restart"] = restart
    ops = FakeOps([node("h-0")], [me])
    me["status"] = reconcile(me, ops, NOW).status | {"restarts": restarts}
    _pods_are(ops, "h-0", "Failed")
    return reconcile(me, ops, NOW), ops


def test_a_failed_worker_fails_the_job_when_the_restart_policy_is_never() -> None:
    out, ops = _failed_worker({"policy": "Never", "maxRestarts": 0}, 0)
    assert out.status["phase"] == "Failed"
    assert "spec.restart.policy is Never" in out.status["whyWaiting"]
    assert ops.stopped == ["a-g0-0"]
    assert [e[1] for e in out.events] == ["Failed"]


def test_a_failed_worker_restarts_the_gang_until_max_restarts() -> None:
    again, _ = _failed_worker({"policy": "OnFailure", "maxRestarts": 2}, 1)
    assert again.status["phase"] == "Resizing"
    assert again.status["restarts"] == 2
    done, _ = _failed_worker({"policy": "OnFailure", "maxRestarts": 2}, 2)
    assert done.status["phase"] == "Failed"
    assert "after 2 restart(s)" in done.status["whyWaiting"]


def test_a_gang_whose_start_was_never_recorded_is_restarted_not_lost() -> None:
    # the gang was created, then the status write failed: the pass no longer decides the job
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    first = reconcile(me, ops, NOW)
    assert first.status["phase"] == "Starting"
    out = reconcile(me, ops, NOW)  # its status still empty
    assert ops.stopped == ["a-g0-0"]
    assert out.status["phase"] == "Resizing"
    assert out.annotations[GENERATION_ANNOTATION] == "1"
    assert [e[1] for e in out.events] == ["Replanning"]


def test_a_gang_left_partly_bound_is_re_planned_after_the_stuck_bound() -> None:
    # an extender restart between two members' binds loses the second's reservation;
    # if other pods take its GPUs, the bound member would hold its node for nothing
    me = job("a", workers=2)
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    first = next(p for p in ops._pods if p["metadata"]["name"] == "a-g0-0")
    first["spec"]["nodeName"] = "h-0"
    first["status"] = {"phase": "Running"}
    soon = reconcile(me, ops, NOW + timedelta(seconds=STUCK_AFTER_S - 1))
    assert soon.status["phase"] == "Starting"
    assert ops.stopped == []
    late = reconcile(me, ops, NOW + timedelta(seconds=STUCK_AFTER_S + 1))
    assert late.status["phase"] == "Resizing"
    assert sorted(ops.stopped) == ["a-g0-0", "a-g0-1"]
    assert late.annotations[GENERATION_ANNOTATION] == "1"
    assert [e[1] for e in late.events] == ["Replanning"]
    assert "was bound 1 of 2 within 45s" in late.events[0][2]
    assert "(another workload took the GPUs)" in late.events[0][2]  # nobody said why


def _unschedulable(pod: dict[str, Any], said: str) -> None:
    """kube-scheduler found no node for `pod`, and said why."""
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
        ],
    }


def test_a_stuck_gang_is_re_planned_with_kube_schedulers_reason() -> None:
    me = job("a")
    ops = FakeOps([node("h-0")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    (pod,) = ops._pods
    said = "0/1 nodes are available: 1 Insufficient cpu."
    _unschedulable(pod, said)
    late = reconcile(me, ops, NOW + timedelta(seconds=STUCK_AFTER_S + 1))
    assert late.status["phase"] == "Resizing"
    assert late.events[0][2] == (
        f"the gang could not be placed within 45s (kube-scheduler: {said}); re-planning"
    )


def test_a_stuck_gang_is_re_planned_off_the_node_kube_scheduler_left_it_on() -> None:
    # a filter the plan does not model (here a host port another pod holds) keeps the
    # worker off its planned node: before, the re-plan put it on that node again
    me = job("a")
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    (pod,) = ops._pods
    first = pod["metadata"]["annotations"][PLANNED_NODE_ANNOTATION]
    (other,) = {"h-0", "h-1"} - {first}
    said = "0/2 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
    _unschedulable(pod, said)
    late = reconcile(me, ops, NOW + timedelta(seconds=STUCK_AFTER_S + 1))
    assert late.status["phase"] == "Resizing"
    assert late.status["avoidNodes"] == [first]
    assert late.events[0][2].endswith(f"; re-planning off node(s) {first}")
    me["status"] = merged_status(me["status"], late.status)
    me["metadata"]["annotations"] |= late.annotations
    again = reconcile(me, ops, NOW + timedelta(seconds=STUCK_AFTER_S + 2))
    assert again.status["phase"] == "Starting"
    (pod,) = ops._pods
    assert pod["metadata"]["annotations"][PLANNED_NODE_ANNOTATION] == other
    # kube-scheduler is told too: the worker's node affinity excludes the node by name
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [first]}]}
    ]
    # placed: the node is open to the job's later plans again
    me["status"] = merged_status(me["status"], again.status)
    _pods_are(ops, other, "Running")
    placed = reconcile(me, ops, NOW + timedelta(seconds=STUCK_AFTER_S + 3))
    assert placed.status["phase"] == "Running"
    assert "avoidNodes" in placed.status
    assert placed.status["avoidNodes"] is None


def test_a_whole_gang_still_starting_is_not_re_planned() -> None:
    me = job("a", workers=2)
    ops = FakeOps([node("h-0"), node("h-1")], [me])
    me["status"] = reconcile(me, ops, NOW).status
    for i, pod in enumerate(ops._pods):
        pod["spec"]["nodeName"] = f"h-{i}"
        pod["status"] = {"phase": "Pending"}  # bound, its container not up yet
    out = reconcile(me, ops, NOW + timedelta(seconds=10 * STUCK_AFTER_S))
    assert out.status["phase"] == "Starting"
    assert ops.stopped == []


def test_a_running_job_gives_its_lease_to_much_shorter_work_and_it_starts() -> None:
    # the simulator's lease: a 10 h job holding the only node's 8 GPUs is checkpointed
    # and stopped when a 1 h job arrives; the short job starts on its GPUs
    long, short = job("long"), job("short")
    long["spec"]["estimate"]["durationSeconds"] = 36000
    ops = FakeOps([node("h-0")], [long])
    long["status"] = reconcile(long, ops, NOW).status
    _pods_are(ops, "h-0", "Running")
    long["status"] |= merged_status(long["status"], reconcile(long, ops, NOW).status)
    assert long["status"]["phase"] == "Running"
    ops._jobs.append(short)
    later = NOW + timedelta(minutes=5)
    passes = PassCache()
    with ops.decide_lock:
        passes.ensure(ops, later)
    out = reconcile(long, ops, later, passes)
    assert out.status["phase"] == "Resizing"
    assert out.events[0][1] == "LeaseGivenUp"
    assert "gives its H100 GPUs to ns/short" in out.events[0][2]
    assert out.preempted == ("Lease", "")
    assert ops.stopped == ["long-g0-0"]
    long["status"] |= merged_status(long["status"], out.status)
    long["metadata"]["annotations"].update(out.annotations)
    with ops.decide_lock:
        passes.invalidate()
        passes.refresh(ops, later)
    assert reconcile(short, ops, later, passes).status["phase"] == "Starting"
    waits = reconcile(long, ops, later, passes).status
    assert waits["phase"] == "Waiting"


def test_a_gang_started_after_the_pass_is_not_stopped_by_it() -> None:
    # the pass gave up the lease of the gang it saw; a gang started since keeps running
    long, short = job("long"), job("short")
    long["spec"]["estimate"]["durationSeconds"] = 36000
    ops = FakeOps([node("h-0")], [long])
    long["status"] = reconcile(long, ops, NOW).status | {"phase": "Running"}
    ops._jobs.append(short)
    passes = PassCache()
    later = NOW + timedelta(minutes=5)
    with ops.decide_lock:
        passes.ensure(ops, later)
    plan = long["status"]["plan"]
    assert passes.stop_of("ns/long", plan) is not None
    restarted = plan | {"startTime": (later + timedelta(seconds=1)).isoformat()}
    assert passes.stop_of("ns/long", restarted) is None
