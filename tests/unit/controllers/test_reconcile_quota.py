"""`reconcile` with Queues: quota holds, borrows, reclaims, pins the GPU type (fake ops)."""

from __future__ import annotations

from typing import Any

from chronotope.controllers.queues import drain, reclaim_for_serving
from chronotope.controllers.trainingjob import preemption_cause, reconcile
from chronotope.sharing.labels import PREEMPTED_BY_ANNOTATION
from tests.quota_inputs import serving_pod
from tests.unit.controllers.test_reconcile import NOW, FakeOps, job, node


def queue(
    name: str,
    gpus: int,
    *,
    cohort: str | None = None,
    gpu_type: str = "H100",
    reclaim: str = "Never",
    limit: int | None = None,
    within: str = "Never",
    fair: str = "Never",
    weight: float = 1,
) -> dict[str, Any]:
    quota: dict[str, Any] = {"gpuType": gpu_type, "gpus": gpus}
    if limit is not None:
        quota["borrowingLimit"] = limit
    spec: dict[str, Any] = {
        "quotas": [quota],
        "reclaim": {
            "policy": reclaim,
            "gracePeriodSeconds": 5,
            "withinQueue": within,
            "fairShare": fair,
        },
        "weight": weight,
    }
    if cohort:
        spec["cohort"] = cohort
    return {"metadata": {"name": name}, "spec": spec}


def local_queue(namespace: str, target: str, name: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"queue": target}}


def team_job(name: str, namespace: str, second: int = 0) -> dict[str, Any]:
    j = job(name)
    j["metadata"]["namespace"] = namespace
    j["metadata"]["creationTimestamp"] = f"2030-01-01T00:00:{second:02d}Z"
    return j


def running(j: dict[str, Any], start: str = "2030-01-01T11:00:00Z") -> dict[str, Any]:
    """Mark `j` started, holding 8 H100s (its gang exists in `ops`)."""
    j["status"] = {
        "phase": "Running",
        "plan": {"gpuType": "H100", "workers": 1, "totalGpus": 8, "startTime": start},
    }
    return j


def ops_with(nodes: int, jobs: list[dict[str, Any]], queues: list[dict[str, Any]]) -> FakeOps:
    ops = FakeOps([node(f"h-{i}") for i in range(nodes)], jobs)
    ops.queue_objs = queues
    ops.local_queue_objs = [local_queue("a", "team-a"), local_queue("b", "team-b")]
    return ops


def _cond(out: Any, kind: str = "Schedulable") -> tuple[str, str]:
    """The status condition `kind` of the outcome: (status, reason)."""
    (c,) = [c for c in out.status["conditions"] if c["type"] == kind]
    return c["status"], c["reason"]


def _quota(out: Any) -> tuple[str, str]:
    """The job's QuotaReserved condition (Kueue's name): (status, reason)."""
    return _cond(out, "QuotaReserved")


def test_without_a_local_queue_a_job_waits_and_says_so() -> None:
    me = team_job("x", "c")
    ops = ops_with(2, [me], [queue("team-a", 8)])
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Waiting"
    assert out.status["whyWaiting"] == "no LocalQueue default in namespace c"
    assert _cond(out) == ("True", "LocalQueueMissing")
    assert _quota(out) == ("False", "LocalQueueMissing")
    assert ops.started == []
    assert ops.preempted == []


def test_a_job_over_its_quota_waits_with_the_queue_and_the_quota() -> None:
    first, second = running(team_job("a1", "a")), team_job("a2", "a", 1)
    ops = ops_with(2, [first, second], [queue("team-a", 8)])
    out = reconcile(second, ops, NOW)
    assert ops.started == []
    assert out.status["whyWaiting"] == "queue team-a: H100 8/8 in use, no cohort to borrow from"
    assert _cond(out) == ("True", "QuotaExceeded")
    assert _quota(out) == ("False", "QuotaExceeded")  # a Kueue user's "not admitted"


def test_a_pipeline_waiting_for_quota_before_a_job_keeps_the_quota_from_it() -> None:
    # team-a has 8 H100s, all free; a pipeline of namespace a asked for them first
    me = team_job("a2", "a", 30)
    ops = ops_with(1, [me], [queue("team-a", 8)])
    pipeline: dict[str, Any] = {
        "metadata": {"name": "web", "namespace": "a", "creationTimestamp": "2030-01-01T00:00:10Z"},
        "spec": {},
        "status": {
            "phase": "Pending",
            "whyWaiting": "waiting for quota: queue team-a: ...",
            "quotaDemand": [{"gpuType": "H100", "gpus": 8}],
        },
    }
    ops.pipeline_objs = [pipeline]
    out = reconcile(me, ops, NOW)
    assert ops.started == []
    assert _quota(out) == ("False", "QuotaExceeded")
    # a pipeline younger than the job does not keep it from starting
    pipeline["metadata"]["creationTimestamp"] = "2030-01-01T00:00:40Z"
    started = reconcile(me, ops, NOW)
    assert started.status["phase"] == "Starting"


def test_a_job_borrows_idle_quota_of_its_cohort() -> None:
    first, second = running(team_job("a1", "a")), team_job("a2", "a", 1)
    queues = [queue("team-a", 8, cohort="ml"), queue("team-b", 8, cohort="ml")]
    ops = ops_with(2, [first, second], queues)
    out = reconcile(second, ops, NOW)
    assert out.status["phase"] == "Starting"
    assert "queue team-a borrows 8 H100 GPU(s) in its cohort" in out.events[0][2]
    assert _quota(out) == ("True", "QuotaReserved")
    assert out.admitted == ("team-a", 12 * 3600.0 - 1)  # its wait, by the Queue admitting it


def test_the_borrowing_limit_holds() -> None:
    first, second = running(team_job("a1", "a")), team_job("a2", "a", 1)
    queues = [queue("team-a", 8, cohort="ml", limit=4), queue("team-b", 8, cohort="ml")]
    out = reconcile(second, ops_with(2, [first, second], queues), NOW)
    assert out.status["whyWaiting"] == "queue team-a: H100 8/8 in use, borrowing limit 4"


def test_a_lender_reclaims_its_quota_from_the_newest_borrower() -> None:
    a1 = running(team_job("a1", "a"), "2030-01-01T11:00:00Z")
    a2 = running(team_job("a2", "a", 1), "2030-01-01T11:30:00Z")  # borrowed, newest
    b1 = team_job("b1", "b", 2)
    queues = [
        queue("team-a", 8, cohort="ml"),
        queue("team-b", 8, cohort="ml", reclaim="PreemptBorrowed"),
    ]
    ops = ops_with(2, [a1, a2, b1], queues)
    out = reconcile(b1, ops, NOW)
    assert ops.preempted == [("a/a2", "b/b1")]
    assert ops.started == []
    assert _cond(out) == ("True", "ReclaimingQuota")
    assert _quota(out) == ("False", "ReclaimingQuota")  # admitted once the victims stop
    assert "stopping borrowed a/a2 (checkpoint, grace 5s)" in out.status["whyWaiting"]
    assert [e[1] for e in out.events] == ["ReclaimingQuota"]


def test_a_borrower_below_its_fair_share_stops_a_borrower_above_it() -> None:
    # team-c (8, no jobs) lends its 8 to team-a (a2); team-b (weight 2) wants to borrow 8
    a1 = running(team_job("a1", "a"), "2030-01-01T11:00:00Z")
    a2 = running(team_job("a2", "a", 1), "2030-01-01T11:30:00Z")  # borrows team-c's 8
    b1 = running(team_job("b1", "b"), "2030-01-01T11:00:00Z")
    b2 = team_job("b2", "b", 2)

    def queues(fair: str) -> list[dict[str, Any]]:
        return [
            queue("team-a", 8, cohort="ml", fair=fair),
            queue("team-b", 8, cohort="ml", fair=fair, weight=2),
            queue("team-c", 8, cohort="ml", fair=fair),
        ]

    ops = ops_with(3, [a1, a2, b1, b2], queues("Preempt"))
    out = reconcile(b2, ops, NOW)
    # with it team-b's share is 8/24 / 2, below team-a's 8/24: a2 is stopped for it
    assert ops.preempted == [("a/a2", "b/b2")]
    assert ops.annotated["a/a2"] == "b/b2 (fair share of queue team-b)"
    assert _quota(out) == ("False", "ReclaimingQuota")
    assert out.status["whyWaiting"] == (
        "queue team-b borrows H100 for its fair share of cohort ml: stopping borrowed a/a2 "
        "(checkpoint, grace 5s), then it starts"
    )
    # without fairShare: Preempt it waits for team-a's borrowed job to end
    never = ops_with(3, [a1, a2, b1, b2], queues("Never"))
    waits = reconcile(b2, never, NOW)
    assert never.preempted == []
    assert waits.status["whyWaiting"].startswith("queue team-b: H100 8/8 in use, cohort ml has 0")
    # the victim counts its preemption by cause and the queue it was stopped for
    assert _preempted(a2, ops).preempted == ("FairShare", "team-b")


def test_a_higher_priority_job_preempts_its_queues_lower_priority_work() -> None:
    low = running(team_job("a1", "a"))
    low["spec"]["preemptible"] = True
    high = team_job("a2", "a", 1)
    high["spec"]["priority"] = 10
    ops = ops_with(1, [low, high], [queue("team-a", 8, within="LowerPriority")])
    out = reconcile(high, ops, NOW)
    assert ops.preempted == [("a/a1", "a/a2")]
    assert ops.started == []
    assert _cond(out) == ("True", "PreemptingWithinQueue")
    assert out.status["whyWaiting"] == (
        "queue team-a: H100 quota is held by its own lower-priority work; priority 10 "
        "preempts it: stopping lower-priority preemptible a/a1 (checkpoint, grace 5s), "
        "then it starts"
    )
    # without withinQueue, or with a victim that is not preemptible, it waits for quota
    for within, preemptible in (("Never", True), ("LowerPriority", False)):
        low["spec"]["preemptible"] = preemptible
        ops = ops_with(1, [low, high], [queue("team-a", 8, within=within)])
        out = reconcile(high, ops, NOW)
        assert ops.preempted == []
        assert _cond(out) == ("True", "QuotaExceeded")


def test_without_reclaim_a_lender_waits_for_the_borrowers() -> None:
    a1 = running(team_job("a1", "a"))
    a2 = running(team_job("a2", "a", 1), "2030-01-01T11:30:00Z")
    b1 = team_job("b1", "b", 2)
    queues = [queue("team-a", 8, cohort="ml"), queue("team-b", 8, cohort="ml")]
    ops = ops_with(2, [a1, a2, b1], queues)
    out = reconcile(b1, ops, NOW)
    assert ops.preempted == []
    assert "reclaim policy Never waits for the borrowers to finish" in out.status["whyWaiting"]


def test_quota_pins_the_gpu_type_it_admits() -> None:
    me = team_job("a1", "a")
    me["spec"]["gpuTypes"] = [
        {"name": "H100", "relativeSpeed": 2.0},
        {"name": "A100", "relativeSpeed": 1.0},
    ]
    a100 = node("a-0")
    a100["metadata"]["labels"]["nvidia.com/gpu.product"] = "A100"
    ops = ops_with(1, [me], [queue("team-a", 8, gpu_type="A100")])
    ops._nodes.append(a100)
    out = reconcile(me, ops, NOW)
    assert out.status["phase"] == "Starting"
    assert out.status["plan"]["gpuType"] == "A100"  # the faster H100 has no quota
    assert "queue team-a admits it within its nominal quota" in out.events[0][2]


def test_a_job_that_can_never_run_takes_no_quota_from_the_jobs_behind_it() -> None:
    # a1 (older) names a model profile that does not exist: it is impossible, not admitted
    stuck, behind = team_job("a1", "a"), team_job("a2", "a", 1)
    stuck["spec"]["parallelism"] = {"modelProfile": "missing"}
    ops = ops_with(1, [stuck, behind], [queue("team-a", 8)])
    never = reconcile(stuck, ops, NOW)
    assert never.status["phase"] == "Pending"
    assert _quota(never) == ("False", "Inadmissible")
    out = reconcile(behind, ops, NOW)
    assert out.status["phase"] == "Starting"
    assert _quota(out) == ("True", "QuotaReserved")
    assert "queue team-a admits it within its nominal quota" in out.events[0][2]


def _preempted(victim: dict[str, Any], ops: FakeOps) -> Any:
    """The victim's own reconcile once its workers are gone: what it reports."""
    key = f"{victim['metadata']['namespace']}/{victim['metadata']['name']}"
    victim["metadata"]["annotations"] = {PREEMPTED_BY_ANNOTATION: ops.annotated[key]}
    return reconcile(victim, ops, NOW)


def test_a_victim_reports_the_cause_and_the_queue_it_was_preempted_for() -> None:
    # reclaim: team-b takes back the quota a/a2 borrowed
    a1 = running(team_job("a1", "a"), "2030-01-01T11:00:00Z")
    a2 = running(team_job("a2", "a", 1), "2030-01-01T11:30:00Z")
    b1 = team_job("b1", "b", 2)
    queues = [
        queue("team-a", 8, cohort="ml"),
        queue("team-b", 8, cohort="ml", reclaim="PreemptBorrowed"),
    ]
    ops = ops_with(2, [a1, a2, b1], queues)
    reconcile(b1, ops, NOW)
    out = _preempted(a2, ops)
    assert out.preempted == ("Reclaim", "team-b")
    assert [e[1] for e in out.events] == ["Preempted"]
    # within its queue: a higher-priority job of team-a stops a preemptible one
    low = running(team_job("l1", "a"))
    low["spec"]["preemptible"] = True
    high = team_job("h1", "a", 1)
    high["spec"]["priority"] = 10
    ops = ops_with(1, [low, high], [queue("team-a", 8, within="LowerPriority")])
    reconcile(high, ops, NOW)
    assert _preempted(low, ops).preempted == ("WithinQueue", "team-a")
    # a job that was not preempted (its gang is just gone) reports no preemption
    lost = running(team_job("g1", "a"))
    assert reconcile(lost, ops_with(1, [lost], []), NOW).preempted is None


def test_preemption_cause_reads_each_why_the_preemptors_write() -> None:
    assert preemption_cause("b/b1 (reclaiming quota of queue team-b)") == ("Reclaim", "team-b")
    assert preemption_cause("a/h (higher priority in queue q-1)") == ("WithinQueue", "q-1")
    assert preemption_cause("b/b2 (fair share of queue team-b)") == ("FairShare", "team-b")
    assert preemption_cause("Queue q (draining queue q)") == ("Drain", "q")
    assert preemption_cause("a/h (higher priority)") == ("Priority", "")
    assert preemption_cause("a/h") == ("Priority", "")  # an older operator's annotation


def test_a_stopped_queue_holds_its_jobs_and_a_drained_one_stops_what_runs() -> None:
    a1 = running(team_job("a1", "a"))
    a2 = team_job("a2", "a", 1)
    held = queue("team-a", 16)
    held["spec"]["stopPolicy"] = "Hold"
    ops = ops_with(2, [a1, a2], [held])
    out = reconcile(a2, ops, NOW)  # 8 of 16 GPUs free, but the queue admits nothing
    assert out.status["phase"] == "Waiting"
    assert _cond(out) == ("True", "QueueStopped")
    assert out.status["whyWaiting"].startswith("queue team-a is stopped (stopPolicy Hold)")
    assert ops.started == []
    assert drain(ops) == []  # Hold: a1 keeps running
    held["spec"]["stopPolicy"] = "HoldAndDrain"
    assert drain(ops) == ["a/a1"]
    assert ops.annotated["a/a1"] == "Queue team-a (draining queue team-a)"
    stopped = _preempted(a1, ops)
    assert stopped.preempted == ("Drain", "team-a")
    assert [e[1] for e in stopped.events] == ["Preempted"]
    # once re-queued it waits for the queue too; the platform team lifts the stop: both start
    a1["status"] = {"phase": "Waiting"}
    a1["metadata"]["annotations"] = {}
    assert reconcile(a1, ops, NOW).status["phase"] == "Waiting"
    held["spec"]["stopPolicy"] = "None"
    assert reconcile(a1, ops, NOW).status["phase"] == "Starting"
    assert reconcile(a2, ops, NOW).status["phase"] == "Starting"


def test_when_can_preempt_preempt_reclaims_the_preferred_type_instead_of_a_slower_one() -> None:
    # team-a's 8 H100 are lent: team-b runs b1 within its own 8 and b2 (newest) on team-a's;
    # team-a's L4 quota and an L4 node are free. a1 prefers H100, accepts L4 at 0.3x.
    b1 = running(team_job("b1", "b"), "2030-01-01T11:00:00Z")
    b2 = running(team_job("b2", "b", 1), "2030-01-01T11:30:00Z")
    a1 = team_job("a1", "a", 2)
    a1["spec"]["gpuTypes"] = [
        {"name": "H100", "relativeSpeed": 1.0},
        {"name": "L4", "relativeSpeed": 0.3},
    ]
    l4 = node("l-0")
    l4["metadata"]["labels"]["nvidia.com/gpu.product"] = "L4"

    def setup(preempt: str) -> FakeOps:
        team_a = queue("team-a", 8, cohort="ml", reclaim="PreemptBorrowed")
        team_a["spec"]["quotas"].append({"gpuType": "L4", "gpus": 8})
        team_a["spec"]["flavorFungibility"] = {"whenCanPreempt": preempt}
        ops = ops_with(2, [b1, b2, a1], [team_a, queue("team-b", 8, cohort="ml")])
        ops.nodes().append(l4)
        return ops

    ops = setup("TryNextFlavor")  # Kueue's default: its free L4 quota first
    out = reconcile(a1, ops, NOW)
    assert ops.preempted == []
    assert out.status["phase"] == "Starting"
    assert out.status["plan"]["gpuType"] == "L4"

    ops = setup("Preempt")
    out = reconcile(a1, ops, NOW)
    assert ops.preempted == [("b/b2", "a/a1")]
    assert _cond(out) == ("True", "ReclaimingQuota")


def test_serving_pods_borrowing_for_their_fair_share_stop_a_borrower_above_it() -> None:
    # as the TrainingJob fair-share test: team-a borrows team-c's 8 (a2); team-b (weight 2)
    # runs b1 on its own 8 and its pipeline web's 8 pods (borrowing 8) wait unbound
    a1 = running(team_job("a1", "a"), "2030-01-01T11:00:00Z")
    a2 = running(team_job("a2", "a", 1), "2030-01-01T11:30:00Z")
    b1 = running(team_job("b1", "b"), "2030-01-01T11:00:00Z")
    queues = [
        queue("team-a", 8, cohort="ml", fair="Preempt"),
        queue("team-b", 8, cohort="ml", fair="Preempt", weight=2),
        queue("team-c", 8, cohort="ml", fair="Preempt"),
    ]
    ops = ops_with(3, [a1, a2, b1], queues)
    ops._pods = [
        serving_pod(f"web-{i}", "H100", namespace="b", pipeline="web")
        | {"status": {"phase": "Pending"}}
        for i in range(8)
    ]
    assert reclaim_for_serving(ops) == ["a/a2"]
    assert ops.annotated["a/a2"] == "InferencePipeline b/web (fair share of queue team-b)"
    assert _preempted(a2, ops).preempted == ("FairShare", "team-b")


def test_serving_pods_waiting_for_lent_quota_stop_the_borrower_once() -> None:
    # team-a runs a1 on its own 8 H100 and a2 on team-b's 8; team-b's pipeline web
    # (8 pods x 1 H100, within team-b's nominal quota) is applied: its pods wait unbound
    a1 = running(team_job("a1", "a"), "2030-01-01T11:00:00Z")
    a2 = running(team_job("a2", "a", 1), "2030-01-01T11:30:00Z")
    queues = [
        queue("team-a", 8, cohort="ml"),
        queue("team-b", 8, cohort="ml", reclaim="PreemptBorrowed"),
    ]
    ops = ops_with(2, [a1, a2], queues)
    web = [
        serving_pod(f"web-{i}", "H100", namespace="b", pipeline="web")
        | {"status": {"phase": "Pending"}}
        for i in range(8)
    ]
    ops._pods = web
    assert reclaim_for_serving(ops) == ["a/a2"]
    assert ops.annotated["a/a2"] == "InferencePipeline b/web (reclaiming quota of queue team-b)"
    stopped = _preempted(a2, ops)  # the annotation is on it now: it is not asked again
    assert reclaim_for_serving(ops) == []
    assert stopped.preempted == ("Reclaim", "team-b")
    assert [e[1] for e in stopped.events] == ["Preempted"]
    # re-queued, it waits: the pipeline's pods hold team-b's quota
    a2["status"] = {"phase": "Waiting"}
    a2["metadata"]["annotations"] = {}
    again = reconcile(a2, ops, NOW)
    assert again.status["phase"] == "Waiting"
    assert _quota(again) == ("False", "QuotaExceeded")
    # under reclaim policy Never nobody is stopped
    queues[1]["spec"]["reclaim"]["policy"] = "Never"
    a2 = running(a2)
    ops.annotated.clear()
    assert reclaim_for_serving(ops) == []
