"""The event-driven TrainingJob loop: the work queue, who an event wakes, one reconcile."""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from chronotope.controllers.metrics import OperatorMetrics
from chronotope.controllers.trainingjob import PassCache
from chronotope.controllers.trainingjob_loop import (
    JobLoopOps,
    TrainingJobLoop,
    Wake,
    WorkQueue,
    concerned_by_nodes,
    mark_of,
    requeue_after,
    settle_left,
    wake_for,
)
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.training import Action
from tests.unit.controllers.test_reconcile import NOW, FakeOps, job, node


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_key_is_queued_once_and_comes_out_when_due() -> None:
    clock = Clock()
    q = WorkQueue(clock)
    q.add("a", 5.0)
    q.add("a", 1.0)  # an earlier due time wins
    q.add("a", 9.0)
    assert len(q) == 1
    assert q.get(timeout=0) is None  # not due yet
    clock.t = 1.0
    assert q.get(timeout=0) == "a"
    assert q.get(timeout=0) is None


def test_a_key_added_while_processing_comes_back_after_done() -> None:
    clock = Clock()
    q = WorkQueue(clock)
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")  # an event during the reconcile
    assert q.get(timeout=0) is None  # never two workers on one key
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.done("a", requeue_in=3.0)
    clock.t = 3.0
    assert q.get(timeout=0) == "a"


def test_a_key_added_first_goes_ahead_of_the_others_that_are_due() -> None:
    clock = Clock()
    q = WorkQueue(clock)
    q.add("wait-1")
    q.add("wait-2")
    q.add("start", first=True)
    q.add("later-start", 5.0, first=True)  # not due: it holds nobody back
    q.add("wait-1", first=True)  # promoted, and still queued once
    q.add("start")  # a plain add keeps it first
    assert len(q) == 4
    assert [q.get(timeout=0) for _ in range(4)] == ["start", "wait-1", "wait-2", None]
    clock.t = 5.0
    assert q.get(timeout=0) == "later-start"


def test_a_key_added_first_while_processing_comes_back_first() -> None:
    clock = Clock()
    q = WorkQueue(clock)
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("b")
    q.add("a", first=True)  # its pod came up during the reconcile
    q.add("a")
    q.done("a")
    assert q.get(timeout=0) == "a"
    assert q.get(timeout=0) == "b"


def test_close_releases_a_waiting_worker() -> None:
    q = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    q.close()
    worker.join(timeout=5)
    assert got == [None]


def _tj(phase: str | None = None, generation: int = 1, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": "a",
            "generation": generation,
            "annotations": annotations,
        },
        "status": {"phase": phase} if phase else {},
    }


def test_who_a_job_event_wakes() -> None:
    first = wake_for("trainingjobs", "ADDED", _tj(), None)
    assert first.keys == ("ns/a",)
    assert first.open_jobs  # a new job changes every waiting job's queue
    seen = mark_of("trainingjobs", _tj("Waiting"))
    assert wake_for("trainingjobs", "MODIFIED", _tj("Waiting"), seen) == Wake()  # own status
    assert wake_for("trainingjobs", "MODIFIED", _tj("Running"), seen) == Wake(open_jobs=True)
    assert wake_for("trainingjobs", "MODIFIED", _tj("Waiting", 2), seen).keys == ("ns/a",)


def test_a_namespace_label_change_wakes_the_waiting_jobs() -> None:
    # a Queue's namespaceSelector reads namespace labels: a change may admit a waiting job
    ns = {"metadata": {"name": "a", "labels": {"team": "x"}}}
    seen = mark_of("namespaces", ns)
    assert wake_for("namespaces", "MODIFIED", ns, seen) == Wake()  # its status: nothing
    relabelled = {"metadata": {"name": "a", "labels": {"team": "a"}}}
    assert wake_for("namespaces", "MODIFIED", relabelled, seen) == Wake(open_jobs=True)


def test_a_claim_volume_or_class_change_wakes_the_waiting_jobs() -> None:
    # where a job's volumes may be used (node_fit.volume_rules): a claim made or bound
    # may let a waiting job start; its status writes wake nobody
    claim = {"metadata": {"namespace": "a", "name": "data"}, "spec": {}, "status": {}}
    assert wake_for("persistentvolumeclaims", "ADDED", claim, None) == Wake(open_jobs=True)
    seen = mark_of("persistentvolumeclaims", claim)
    phased = {**claim, "status": {"phase": "Pending"}}
    assert wake_for("persistentvolumeclaims", "MODIFIED", phased, seen) == Wake()
    bound = {**claim, "spec": {"volumeName": "pv-1"}}
    assert wake_for("persistentvolumeclaims", "MODIFIED", bound, seen) == Wake(open_jobs=True)
    classed = {**claim, "spec": {"storageClassName": "standard"}}  # a default class given
    assert wake_for("persistentvolumeclaims", "MODIFIED", classed, seen) == Wake(open_jobs=True)
    volume = {"metadata": {"name": "pv-1"}, "spec": {}}
    assert wake_for("persistentvolumes", "ADDED", volume, None) == Wake(open_jobs=True)
    # a static volume reserved for a claim is no longer one another claim may bind to
    seen = mark_of("persistentvolumes", volume)
    status = {**volume, "status": {"phase": "Available"}}
    assert wake_for("persistentvolumes", "MODIFIED", status, seen) == Wake()
    taken = {**volume, "spec": {"claimRef": {"namespace": "a", "name": "data"}}}
    assert wake_for("persistentvolumes", "MODIFIED", taken, seen) == Wake(open_jobs=True)
    runtime = {"metadata": {"name": "kata"}, "handler": "kata"}
    seen = mark_of("runtimeclasses", runtime)
    zoned = {**runtime, "scheduling": {"nodeSelector": {"zone": "x"}}}  # what it adds to pods
    assert wake_for("runtimeclasses", "MODIFIED", zoned, seen) == Wake(open_jobs=True)
    assert wake_for("runtimeclasses", "MODIFIED", {**runtime, "status": {}}, seen) == Wake()
    kind = {"metadata": {"name": "fast"}, "volumeBindingMode": "Immediate"}
    seen = mark_of("storageclasses", kind)
    later = {**kind, "volumeBindingMode": "WaitForFirstConsumer"}
    assert wake_for("storageclasses", "MODIFIED", later, seen) == Wake(open_jobs=True)
    pool = {"metadata": {"name": "p"}, "storageClassName": "fast", "capacity": "10Gi"}
    seen = mark_of("csistoragecapacities", pool)  # where the class may provision, how much
    assert wake_for("csistoragecapacities", "MODIFIED", {**pool, "capacity": "1Gi"}, seen) == Wake(
        open_jobs=True
    )
    assert wake_for("csistoragecapacities", "MODIFIED", {**pool, "status": {}}, seen) == Wake()
    driver = {"metadata": {"name": "csi"}, "spec": {"storageCapacity": False}}
    seen = mark_of("csidrivers", driver)
    reports = {**driver, "spec": {"storageCapacity": True}}
    assert wake_for("csidrivers", "MODIFIED", reports, seen) == Wake(open_jobs=True)
    limit = {"name": "csi", "nodeID": "n", "allocatable": {"count": 1}}
    node = {"metadata": {"name": "n"}, "spec": {"drivers": [limit]}}
    seen = mark_of("csinodes", node)  # how many volumes the node may attach
    more = {**node, "spec": {"drivers": [{**limit, "allocatable": {"count": 2}}]}}
    assert wake_for("csinodes", "MODIFIED", more, seen) == Wake(open_jobs=True)
    attachment = {"metadata": {"name": "va"}, "spec": {"nodeName": "n", "attacher": "csi"}}
    seen = mark_of("volumeattachments", attachment)  # a volume attached there
    assert wake_for("volumeattachments", "DELETED", attachment, seen) == Wake(open_jobs=True)
    assert wake_for("volumeattachments", "MODIFIED", {**attachment, "status": {}}, seen) == Wake()


def _pod(node: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "a-g0-0", "labels": {"chronotope.dev/job": "a"}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


def test_who_a_pod_event_wakes() -> None:
    created = wake_for("pods", "ADDED", _pod(), None)
    assert created == Wake(("ns/a",))  # its job, not the others: it holds no GPU yet
    bound = wake_for("pods", "MODIFIED", _pod("n1"), mark_of("pods", _pod()))
    assert bound == Wake(("ns/a",), open_jobs=True)
    running = wake_for("pods", "MODIFIED", _pod("n1", "Running"), mark_of("pods", _pod("n1")))
    assert running == Wake(("ns/a",))  # the job's status changes; capacity does not
    same = mark_of("pods", _pod("n1", "Running"))
    assert wake_for("pods", "MODIFIED", _pod("n1", "Running"), same) == Wake()
    ended = wake_for("pods", "MODIFIED", _pod("n1", "Succeeded"), same)
    assert ended == Wake(("ns/a",), open_jobs=True, freed=True)  # its GPUs are free
    assert wake_for("pods", "DELETED", _pod("n1"), same).freed
    other = {"metadata": {"namespace": "x", "name": "p"}, "spec": {}, "status": {}}
    assert wake_for("pods", "DELETED", other, None) == Wake()  # never held a GPU


def _node(ready: str = "True", heartbeat: str = "t0", gpus: str = "8") -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "L4"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": gpus},
            "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}],
        },
    }


def test_a_node_heartbeat_wakes_nobody_but_a_change_names_the_node() -> None:
    seen = mark_of("nodes", _node())
    assert wake_for("nodes", "MODIFIED", _node(heartbeat="t1"), seen) == Wake()
    assert wake_for("nodes", "MODIFIED", _node(ready="False"), seen) == Wake(nodes=("n1",))
    assert wake_for("nodes", "MODIFIED", _node(gpus="4"), seen) == Wake(nodes=("n1",))
    assert wake_for("nodes", "ADDED", _node(), None) == Wake(nodes=("n1",))
    assert wake_for("nodes", "DELETED", _node(), seen) == Wake(nodes=("n1",))
    assert wake_for(
        "queues", "MODIFIED", {"metadata": {"name": "q", "generation": 2}}, None
    ).open_jobs
    assert wake_for("pods", "SYNC", {}, None).all_jobs


def _started(name: str, phase: str, workers: int, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"replicas": replicas},
        "status": {"phase": phase, "plan": {"workers": workers}},
    }


def _worker(job_name: str, node_name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": f"{job_name}-0", "labels": {JOB_LABEL: job_name}},
        "spec": {"nodeName": node_name},
    }


def test_a_node_change_concerns_the_gangs_on_it_and_those_below_their_size() -> None:
    jobs = [
        _started("on-n1", "Running", 1, 1),
        _started("elsewhere", "Running", 1, 1),
        _started("small", "Running", 1, 2),  # may grow onto what freed up
        _started("starting", "Starting", 2, 2),
        _started("waiting", "Waiting", 0, 1),  # the pass decides for it
        _started("done", "Succeeded", 1, 1),
    ]
    pods = [
        _worker("on-n1", "n1"),
        _worker("elsewhere", "n2"),
        _worker("starting", "n1"),
        _worker("done", "n1"),
        {"metadata": {"namespace": "ns", "name": "other"}, "spec": {"nodeName": "n1"}},
    ]
    assert concerned_by_nodes(["n1"], jobs, pods) == {"ns/on-n1", "ns/small", "ns/starting"}
    assert concerned_by_nodes(["n3"], jobs, pods) == {"ns/small"}


def test_a_pod_that_frees_gpus_wakes_the_gangs_below_their_size() -> None:
    # another workload's pod goes away: a gang started below its size may grow onto
    # its GPUs, so it is reconciled (no node changed, and none of its own pods did)
    jobs = [
        _started("full", "Running", 1, 1),
        _started("small", "Running", 1, 2),
        _started("waiting", "Waiting", 0, 1),
    ]
    ops = LoopOps([node("n1"), node("n2")], jobs)
    ops._pods = [_worker("full", "n1"), _worker("small", "n2")]
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    other = {"metadata": {"namespace": "x", "name": "other"}, "spec": {"nodeName": "n1"}}
    for event, obj in (
        ("ADDED", other),
        ("MODIFIED", other | {"status": {"phase": "Running"}}),
    ):
        loop.on_change("pods", event, copy.deepcopy(obj))
    loop._wake_scope()
    assert not loop.queue._due  # a pod that binds or comes up frees nothing
    for event, obj in (
        ("MODIFIED", other | {"status": {"phase": "Succeeded"}}),
        ("DELETED", other),
    ):
        loop.queue = WorkQueue(loop.clock)
        loop.on_change("pods", event, copy.deepcopy(obj))
        loop._wake_scope()
        assert set(loop.queue._due) == {"ns/small"}, event
    # a pod being deleted frees its GPUs too (the operator counts them free at once)
    loop.queue = WorkQueue(loop.clock)
    again = other | {"metadata": other["metadata"] | {"name": "again"}}
    loop.on_change("pods", "ADDED", copy.deepcopy(again))
    deleting = {**again["metadata"], "deletionTimestamp": "2030-01-01T00:00:00Z"}
    loop.on_change("pods", "MODIFIED", again | {"metadata": deleting})
    loop._wake_scope()
    assert set(loop.queue._due) == {"ns/small"}


def test_only_starting_and_resizing_jobs_look_again_by_themselves() -> None:
    assert requeue_after({"phase": "Starting"}) is not None
    assert requeue_after({"phase": "Resizing"}) is not None
    assert requeue_after({"phase": "Running"}) is None
    assert requeue_after({"phase": "Waiting"}) is None


class LoopOps(FakeOps):
    def __init__(self, nodes: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        super().__init__(nodes, jobs)
        self.writes: list[tuple[dict[str, Any], dict[str, str], list[tuple[str, str, str]]]] = []

    def training_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(
            (
                j
                for j in self._jobs
                if (j["metadata"]["namespace"], j["metadata"]["name"]) == (namespace, name)
            ),
            None,
        )

    def write(
        self,
        job: Mapping[str, Any],
        status: Mapping[str, Any],
        annotations: Mapping[str, str],
        events: Sequence[tuple[str, str, str]],
    ) -> None:
        self.writes.append((dict(status), dict(annotations), list(events)))
        stored = self.training_job(job["metadata"]["namespace"], job["metadata"]["name"])
        assert stored is not None
        stored["status"] = {**stored.get("status", {}), **status}
        stored["metadata"]["annotations"] |= annotations


def _check(ops: LoopOps) -> JobLoopOps:
    return ops  # mypy checks the fake against the Protocol


def test_a_reconcile_writes_what_changed_once_then_stays_quiet() -> None:
    me = job("a")
    ops = LoopOps([node("h-0")], [me])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    again = loop.reconcile_key("ns/a")
    ((status, annotations, events),) = ops.writes
    assert annotations == {}
    assert status["plan"]["plannedForReplicas"] == 1
    assert status["phase"] == "Starting"
    assert [e[1] for e in events] == ["Started"]
    assert again is not None  # a starting gang is checked for being stuck
    for pod in ops._pods:
        pod["spec"]["nodeName"] = "h-0"
        pod["status"] = {"phase": "Running"}
    assert loop.reconcile_key("ns/a") is None
    assert ops.writes[-1][0]["phase"] == "Running"
    writes = len(ops.writes)
    loop.reconcile_key("ns/a")  # nothing changed: nothing written
    assert len(ops.writes) == writes


def test_an_invalid_spec_marks_the_job_once() -> None:
    me = job("a")
    me["spec"]["gpu"] = {"count": "many"}
    ops = LoopOps([node("h-0")], [me])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    loop.reconcile_key("ns/a")
    ((status, _, events),) = ops.writes
    assert status["phase"] == "Pending"
    assert [e[1] for e in events] == ["InvalidSpec"]
    # neither schedulable nor holding quota (the accounting leaves such a job out)
    assert {(c["type"], c["status"], c["reason"]) for c in status["conditions"]} == {
        ("Schedulable", "False", "InvalidSpec"),
        ("QuotaReserved", "False", "InvalidSpec"),
    }
    loop.reconcile_key("ns/a")
    assert len(ops.writes) == 1


def test_a_deleted_job_is_left_alone() -> None:
    ops = LoopOps([node("h-0")], [])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    assert loop.reconcile_key("ns/gone") is None
    assert ops.writes == []


def _three_jobs_decided() -> tuple[list[dict[str, Any]], LoopOps, TrainingJobLoop, list[int]]:
    """Three one-node jobs on two nodes, each reconciled once and its own write fed back.

    Returns the jobs, the ops, the loop and the sizes of the passes it made.
    """
    jobs = [job(n) for n in ("a", "b", "c")]
    for i, j in enumerate(jobs):
        j["metadata"]["creationTimestamp"] = f"2030-01-01T00:00:0{i}Z"
    ops = LoopOps([node("h-0"), node("h-1")], jobs)
    passes: list[int] = []
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    loop.passes.on_pass = lambda _s, n: passes.append(n)
    for j in jobs:
        loop.on_change("trainingjobs", "ADDED", copy.deepcopy(j))
    for key in ("ns/a", "ns/b", "ns/c"):
        loop.reconcile_key(key)
        written = ops.training_job(*key.split("/"))
        assert written is not None
        # the job's own write of its verdict comes back as an event: the pass still holds
        loop.on_change("trainingjobs", "MODIFIED", copy.deepcopy(written))
    return jobs, ops, loop, passes


def test_one_pass_serves_every_waiting_job_until_something_unpredicted_changes() -> None:
    # three one-node jobs on two nodes: one pass decides all three (two start, one waits)
    jobs, ops, loop, passes = _three_jobs_decided()
    assert passes == [3]
    assert [j["status"]["phase"] for j in jobs] == ["Starting", "Starting", "Waiting"]
    assert "queued behind ns/a" in jobs[2]["status"]["whyWaiting"]
    loop.schedule()  # nothing unpredicted: no new pass
    assert passes == [3]
    # a worker bound to a node was not predicted by the pass: the loop makes a new one and
    # wakes the job whose verdict changed (c no longer waits behind a, nothing is free)
    pod = ops._pods[0]
    loop.on_change("pods", "ADDED", pod)
    loop.queue = WorkQueue(loop.clock)
    loop.on_change("pods", "MODIFIED", pod | {"spec": pod["spec"] | {"nodeName": "h-0"}})
    assert set(loop.queue._due) == {"ns/a"}  # the pod's own job only
    loop.schedule()
    assert passes == [3, 1]
    assert set(loop.queue._due) == {"ns/a", "ns/c"}
    loop.reconcile_key("ns/c")
    assert "queued behind" not in jobs[2]["status"]["whyWaiting"]


def test_a_started_job_going_running_needs_no_new_pass() -> None:
    # the pass counted a started job's gang from its start: Starting -> Running (its own
    # status write once its workers run) changes no verdict; a worker's bind still does
    _, ops, loop, passes = _three_jobs_decided()
    a = ops.training_job("ns", "a")
    assert a is not None
    assert a["status"]["phase"] == "Starting"
    a["status"]["phase"] = "Running"
    loop.on_change("trainingjobs", "MODIFIED", copy.deepcopy(a))
    loop.schedule()
    assert passes == [3]
    a["status"]["phase"] = "Resizing"  # anything else about a started job is a change
    loop.on_change("trainingjobs", "MODIFIED", copy.deepcopy(a))
    loop.schedule()
    assert passes == [3, 1]  # c, the one job left waiting (a has its gang)


def test_a_node_change_wakes_the_job_on_it_and_makes_a_new_pass() -> None:
    # a and b started on h-0 and h-1, c waits: h-0 going NotReady wakes a only (its
    # reconcile checks its workers); b's reconcile would change nothing; c is the pass's
    _, ops, loop, passes = _three_jobs_decided()
    for pod, where in zip(ops._pods, ("h-0", "h-1"), strict=True):
        pod["spec"]["nodeName"] = where
    h0 = ops._nodes[0]
    loop.on_change("nodes", "ADDED", copy.deepcopy(h0))
    loop.queue = WorkQueue(loop.clock)
    h0["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    loop.on_change("nodes", "MODIFIED", copy.deepcopy(h0))
    loop._wake_scope()
    assert set(loop.queue._due) == {"ns/a"}
    loop.schedule()
    assert passes == [3, 1]  # the node change made the pass stale: c is decided again
    loop.queue = WorkQueue(loop.clock)
    loop.on_change("pods", "SYNC", {})  # a relist still wakes every started job
    loop._wake_scope()
    assert set(loop.queue._due) == {"ns/a", "ns/b"}


def test_a_first_event_after_the_start_or_a_relist_is_compared_with_the_cache() -> None:
    # the loop marks what the cache holds when it starts (and after each relist), so the
    # first heartbeat of a node it has seen no event of yet makes no pass
    _, ops, loop, passes = _three_jobs_decided()
    h1 = ops._nodes[1]
    h1["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t9"}]
    loop.seed()
    loop.on_change("nodes", "MODIFIED", copy.deepcopy(h1))
    loop.schedule()
    assert passes == [3]
    # unseeded, the same kind of event is taken for a change
    fresh = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    fresh.on_change("nodes", "MODIFIED", copy.deepcopy(h1))
    assert fresh._nodes_changed == {"h-1"}
    # after a relist the loop marks the relisted objects: a later heartbeat is no change
    h1["metadata"]["labels"] = {"nvidia.com/gpu.product": "H100", "zone": "b"}
    loop.on_change("nodes", "SYNC", {})  # the store holds the relisted node
    loop._wake_scope()
    loop.schedule()
    assert passes == [3, 1]  # a relist makes a pass
    loop.on_change("nodes", "MODIFIED", copy.deepcopy(h1))
    loop.schedule()
    assert passes == [3, 1]


class TickingStop(threading.Event):
    """A stop event whose waits advance a fake clock instead of sleeping."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.t += timeout or 0.0
        return self.is_set()


def test_the_next_pass_waits_until_the_latest_passs_starts_are_enacted() -> None:
    # two of three jobs start in the first pass; the loop makes no new pass before both
    # are enacted and written (a scheduling cycle commits its decisions), however many
    # events come meanwhile, and it waits `hold_s` at most for a start nobody enacts
    jobs = [job(n) for n in ("a", "b", "c")]
    for i, j in enumerate(jobs):
        j["metadata"]["creationTimestamp"] = f"2030-01-01T00:00:0{i}Z"
    ops = LoopOps([node("h-0"), node("h-1")], jobs)
    clock = Clock()
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics(), hold_s=5.0, clock=clock)
    loop.schedule()
    assert loop.passes.starts_left() == 2
    loop.reconcile_key("ns/c")  # it waits: enacting its verdict is not a start
    assert loop.passes.starts_left() == 2
    loop.reconcile_key("ns/a")
    assert loop.passes.starts_left() == 1
    stop = TickingStop(clock)
    loop._hold(stop)
    assert clock.t >= 5.0  # b was never reconciled: the hold gave up after hold_s
    assert loop.passes.starts_left() == 1
    loop.reconcile_key("ns/b")
    assert loop.passes.starts_left() == 0
    before = clock.t
    loop._hold(stop)
    assert clock.t == before  # nothing left to enact: no wait at all
    assert [j["status"]["phase"] for j in ops._jobs] == ["Starting", "Starting", "Waiting"]


def test_a_start_of_a_deleted_job_holds_nothing_back() -> None:
    ops = LoopOps([node("h-0")], [job("a")])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    loop.schedule()
    assert loop.passes.starts_left() == 1
    ops._jobs.clear()
    assert loop.reconcile_key("ns/a") is None
    assert loop.passes.starts_left() == 0


def test_a_new_pass_waits_for_the_verdicts_being_enacted() -> None:
    ops = LoopOps([node("h-0")], [job("a")])
    passes = PassCache()
    with ops.decide_lock:
        passes.ensure(ops, NOW)
    first = passes.latest
    made = threading.Event()

    def refresh() -> None:
        with ops.decide_lock:
            passes.invalidate()
            passes.refresh(ops, NOW)
        made.set()

    with passes.enacting("ns/a") as entered:  # a worker starting a gang of the latest pass
        assert entered
        thread = threading.Thread(target=refresh)
        thread.start()
        assert not made.wait(0.3)  # the next pass would not see that gang yet: it waits
        assert passes.latest is first
    assert made.wait(10)
    thread.join()
    assert passes.latest is not first


def test_a_start_while_the_next_pass_is_made_is_deferred_then_woken_by_that_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a start never blocks its worker behind a pass being made (reconcile latency): it
    # defers, is not timed, writes nothing, and the loop reconciles it once the pass is made
    ops = LoopOps([node("h-0")], [job("a")])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    with ops.decide_lock:
        loop.passes.ensure(ops, NOW)
    making = threading.Event()
    release = threading.Event()
    original = ops.training_jobs

    def held_jobs() -> list[dict[str, Any]]:  # the pass reads the jobs, then waits
        jobs = original()
        making.set()
        assert release.wait(10)
        return jobs

    monkeypatch.setattr(ops, "training_jobs", held_jobs)
    loop.passes.invalidate()
    maker = threading.Thread(target=loop.schedule)
    maker.start()
    assert making.wait(10)
    count = "chronotope_trainingjob_reconcile_seconds_count"
    timed = loop.metrics.registry.get_sample_value(count, {"result": "ok"})
    again = loop.reconcile_key("ns/a")
    assert again is not None
    assert again > 0  # the fallback, should no pass wake it
    assert ops.writes == []  # nothing enacted, nothing written
    assert ops._pods == []
    assert loop.metrics.registry.get_sample_value(count, {"result": "ok"}) == timed
    loop.queue = WorkQueue(loop.clock)
    release.set()
    maker.join(10)
    assert "ns/a" in loop.queue._due  # the pass it waited for wakes it, verdict unchanged
    monkeypatch.setattr(ops, "training_jobs", original)
    loop.reconcile_key("ns/a")
    assert ops.writes[-1][0]["phase"] == "Starting"


def test_a_passs_starts_are_queued_ahead_of_its_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # the next pass waits for the latest's starts (`_hold`), so they are enacted first,
    # whatever order the pass decided them in; a started gang's pod events go first too
    ops = LoopOps([node("h-0")], [])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())

    def verdict(action: Action) -> Any:
        return SimpleNamespace(decision=SimpleNamespace(action=action, reason=str(action)))

    made = SimpleNamespace(
        verdicts={
            "ns/w1": verdict(Action.WAIT),
            "ns/s1": verdict(Action.START),
            "ns/w2": verdict(Action.WAIT),
            "ns/s2": verdict(Action.START),
        },
        stops={},
    )
    monkeypatch.setattr(loop.passes, "refresh", lambda *_: made)
    loop.schedule()
    pod = {"metadata": {"namespace": "ns", "name": "r-0", "labels": {JOB_LABEL: "r"}}}
    loop.on_change("pods", "ADDED", pod)
    order = [loop.queue.get(timeout=0) for _ in range(6)]
    assert order == ["ns/s1", "ns/s2", "ns/r", "ns/w1", "ns/w2", None]


def test_a_job_waiting_for_its_profile_configmap_is_decided_again_after_a_while() -> None:
    # ConfigMaps are not watched: no event says the profile now exists
    me = job("a")
    me["spec"]["parallelism"] = {"modelProfile": "opt"}
    ops = LoopOps([node("h-0")], [me])
    clock = Clock()
    passes = PassCache(clock=clock)
    with ops.decide_lock:
        passes.ensure(ops, NOW)
    verdict = passes.verdict_of("ns/a")
    assert verdict is not None
    assert verdict.decision.cause == "ProfileMissing"
    assert not passes.due(10.0)
    clock.t = 11.0
    assert passes.due(10.0)
    # a pass of started or merely waiting jobs is never due: events announce their changes
    ops._jobs = [job("b")]
    with ops.decide_lock:
        passes.invalidate()
        passes.refresh(ops, NOW)
    clock.t = 30.0
    assert not passes.due(10.0)


def test_a_pass_waits_for_a_burst_of_submissions_to_end_up_to_a_bound() -> None:
    # poked at 10 s; the gap is 0.5 s and a burst may hold the pass 3 s at most
    assert settle_left(10.0, 10.0, -1.0, 0.5, 3.0) == 0.5  # no job arriving: the gap only
    assert settle_left(10.5, 10.0, -1.0, 0.5, 3.0) == 0.0
    assert settle_left(10.5, 10.0, 10.4, 0.5, 3.0) == pytest.approx(0.4)  # jobs still coming
    assert settle_left(11.0, 10.0, 10.4, 0.5, 3.0) == 0.0  # quiet for a gap: decide now
    assert settle_left(12.9, 10.0, 12.8, 0.5, 3.0) == pytest.approx(0.1)  # the bound
    assert settle_left(13.0, 10.0, 12.99, 0.5, 3.0) == 0.0


def test_a_created_job_marks_an_arrival_that_holds_the_next_pass() -> None:
    ops = LoopOps([node("h-0")], [])
    loop = TrainingJobLoop(ops, lambda: ops._jobs, OperatorMetrics())
    before = loop._arrived
    loop.on_change("trainingjobs", "MODIFIED", job("a"))
    assert loop._arrived == before  # an edit is no arrival
    loop.on_change("trainingjobs", "ADDED", job("a"))
    assert loop._arrived > before
