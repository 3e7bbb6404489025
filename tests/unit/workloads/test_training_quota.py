"""TrainingJobs read into the quota accounting: holding, waiting, the Queues' report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.workloads.quota import Admission, StopCause, Unit, Verdict
from chronotope.workloads.training import Action, Decision
from chronotope.workloads.training_quota import (
    QuotaView,
    admission_cycle,
    drain_victims,
    local_queue_report,
    pending_order,
    queue_report,
    quota_wait,
    reclaim_words,
    serving_admission,
    serving_holders,
    serving_reclaim,
    serving_reclaims,
    serving_room,
    serving_workloads,
    waiting_serving,
)
from chronotope.workloads.training_status import waiting_status
from chronotope.workloads.views import explain, queue_place
from tests.variant_fixtures import variant

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def quota_admissions(*args: Any, **kwargs: Any) -> dict[str, Admission]:
    """The verdicts of one admission cycle (`admission_cycle`)."""
    return admission_cycle(*args, **kwargs).admissions


def _job(name: str, ns: str, gpus: int, phase: str | None = None, **extra: Any) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if phase in ("Running", "Starting"):
        status["plan"] = {"gpuType": "L4", "workers": 1, "totalGpus": gpus}
    return {
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": extra.get("t", "")},
        "spec": {
            "replicas": 1,
            "gpu": {"count": gpus},
            "gpuTypes": [{"name": "L4", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "L4", "durationSeconds": 60},
            "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}},
        },
        "status": status,
    }


def _view(*, cohort: bool = True) -> QuotaView:
    spec = {"quotas": [{"gpuType": "L4", "gpus": 4}]} | ({"cohort": "ml"} if cohort else {})
    return QuotaView.parse(
        [
            {"metadata": {"name": "team-a"}, "spec": spec},
            {"metadata": {"name": "team-b"}, "spec": spec},
        ],
        [
            {"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}},
            {"metadata": {"name": "default", "namespace": "b"}, "spec": {"queue": "team-b"}},
            {"metadata": {"name": "default", "namespace": "z"}, "spec": {"queue": "gone"}},
        ],
    )


def test_the_report_counts_started_jobs_and_splits_what_is_lent() -> None:
    jobs = [
        _job("a1", "a", 4, "Running"),
        _job("a2", "a", 2, "Starting"),  # borrows 2 of team-b's idle 4
        _job("a3", "a", 1, "Waiting"),
        _job("a4", "a", 1, "Succeeded"),
        _job("b1", "b", 1),
    ]
    report = queue_report(_view(), jobs)
    (a,), (b,) = report["team-a"].gpus, report["team-b"].gpus
    assert (a.used, a.borrowed, a.lent) == (6, 2, 0)
    assert (b.used, b.borrowed, b.lent) == (0, 0, 2)
    assert (report["team-a"].admitted_workloads, report["team-a"].pending_workloads) == (2, 1)
    assert report["team-b"].pending_workloads == 1


def test_local_queues_report_their_jobs_and_a_missing_queue() -> None:
    jobs = [_job("a1", "a", 4, "Running"), _job("a3", "a", 1), _job("z1", "z", 1)]
    report = local_queue_report(_view(), jobs)
    assert report[("a", "default")] == (1, 1, None)
    assert report[("z", "default")] == (0, 1, "Queue gone does not exist")


def test_a_job_is_admitted_only_after_the_jobs_ahead_of_it() -> None:
    first = _job("a1", "a", 4, t="2030-01-01T00:00:00Z")
    second = _job("a2", "a", 1, t="2030-01-01T00:00:01Z")
    start = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=1)
    late = quota_admissions(_view(cohort=False), [first, second], {"a/a2": start}, NOW)["a/a2"]
    assert late.verdict is Verdict.WAIT
    assert late.message == "queue team-a: L4 4/4 in use, no cohort to borrow from"
    got = quota_admissions(_view(cohort=False), [first, second], {"a/a1": start}, NOW)
    assert got["a/a1"].verdict is Verdict.ADMIT
    held = {
        k for k, d in got.items() if k != "a/a1" and d.verdict in (Verdict.WAIT, Verdict.RECLAIM)
    }
    assert held == {"a/a2"}  # behind it, over the quota: not a contender for GPUs


def test_without_queues_quotas_are_off() -> None:
    view = QuotaView.parse([], [])
    start = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=1)
    job = _job("a1", "a", 4)
    assert quota_admissions(view, [job], {"a/a1": start}, NOW)["a/a1"].verdict is Verdict.ADMIT


def test_an_invalid_queue_is_left_out() -> None:
    view = QuotaView.parse([{"metadata": {"name": "bad"}, "spec": {"quotas": "x"}}], [])
    assert not view.on


def _ends(job: dict[str, Any], at: str) -> dict[str, Any]:
    job["status"]["plan"]["predictedCompletionTime"] = at
    return job


def test_a_job_over_quota_is_told_when_its_quota_frees_up() -> None:
    early = _ends(_job("a1", "a", 2, "Running"), "2030-01-01T14:00:00Z")
    late = _ends(_job("a2", "a", 2, "Running"), "2030-01-01T13:00:00Z")
    waiting = _job("a3", "a", 3, t="2030-01-01T00:00:05Z")
    start = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=3)
    mine = quota_admissions(_view(cohort=False), [early, late, waiting], {"a/a3": start}, NOW)[
        "a/a3"
    ]
    assert mine.verdict is Verdict.WAIT
    # a2 ends first (13:00) but frees only 2; 3 fit once a1 ends too
    assert mine.message == (
        "queue team-a: L4 4/4 in use, no cohort to borrow from; "
        "its quota frees up 2030-01-01 14:00 (a/a1 ends)"
    )
    # the plan-ahead in the job's status: predictedStartTime is when its quota frees up
    wait = quota_wait(mine)
    assert wait.start == datetime(2030, 1, 1, 14, 0, tzinfo=UTC)
    status = waiting_status(wait, NOW, 1)
    assert status["predictedStartTime"] == "2030-01-01T14:00:00Z"
    assert status["conditions"][0]["reason"] == "QuotaExceeded"


def test_the_jobs_waiting_for_quota_take_their_turns_one_after_another() -> None:
    # team-a's 4 L4s are held until 14:00; a2 and a3 want all 4, for 1 h each
    running = _ends(_job("a1", "a", 4, "Running"), "2030-01-01T14:00:00Z")
    second = _job("a2", "a", 4, t="2030-01-01T00:00:01Z")
    third = _job("a3", "a", 4, t="2030-01-01T00:00:02Z")
    hour = Decision(
        Action.START,
        "fits",
        gpu_type="L4",
        workers=1,
        gpus_per_worker=4,
        finish=NOW + timedelta(hours=1),
    )
    jobs = [running, second, third]
    got = quota_admissions(_view(cohort=False), jobs, {"a/a2": hour, "a/a3": hour}, NOW)
    # a3 starts when a2 ends, not when a1 does (a2 takes the quota a1 frees)
    assert got["a/a2"].message.endswith("its quota frees up 2030-01-01 14:00 (a/a1 ends)")
    assert got["a/a3"].message.endswith("its quota frees up 2030-01-01 15:00 (a/a2 ends)")
    assert quota_wait(got["a/a3"]).start == datetime(2030, 1, 1, 15, 0, tzinfo=UTC)
    # a job admitted now holds its quota until its decision's predicted finish
    first = _job("a0", "a", 4, t="2030-01-01T00:00:00Z")
    now_then = {"a/a0": hour, "a/a2": hour}
    got = quota_admissions(_view(cohort=False), [first, second], now_then, NOW)
    assert got["a/a0"].verdict is Verdict.ADMIT
    assert got["a/a2"].message.endswith("its quota frees up 2030-01-01 13:00 (a/a0 ends)")


def test_the_queue_shows_its_next_releases() -> None:
    jobs = [
        _ends(_job("a1", "a", 2, "Running"), "2030-01-01T14:00:00Z"),
        _ends(_job("a2", "a", 1, "Running"), "2030-01-01T13:00:00Z"),
        _ends(_job("b1", "b", 1, "Running"), "2030-01-01T12:30:00Z"),
    ]
    got = queue_report(_view(), jobs)["team-a"].forecast
    assert [(f"{r.at:%H:%M}", r.workload, r.gpu_type, r.gpus) for r in got] == [
        ("13:00", "a/a2", "L4", 1),
        ("14:00", "a/a1", "L4", 2),
    ]
    assert queue_report(_view(), jobs)["team-b"].forecast[0].workload == "b/b1"


def _serving_pod(name: str, ns: str, gpus: int, owner: str = "chronotope.dev/pipeline") -> Any:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {owner: "web"}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "L4"},
            "containers": [{"name": "s", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def test_serving_pods_hold_their_queues_quota_and_are_never_reclaimed() -> None:
    # team-a's web pipeline (2 pods x 2 L4) and serving group (1 x 2 L4) borrow 2 of team-b's
    pods = [
        _serving_pod("web-0", "a", 2),
        _serving_pod("web-1", "a", 2),
        _serving_pod("grp-0", "a", 2, owner="chronotope.dev/serving-group"),
        _serving_pod("done", "a", 2) | {"status": {"phase": "Succeeded"}},
    ]
    serving = serving_workloads(_view(), pods)
    assert [(w.key, w.queue, dict(w.usage)) for w in serving] == [
        ("a/pipeline:web", "team-a", {("L4", Unit.GPUS): 4}),
        ("a/serving-group:web", "team-a", {("L4", Unit.GPUS): 2}),
    ]
    report = queue_report(_view(), [], serving)
    (a,), (b,) = report["team-a"].gpus, report["team-b"].gpus
    assert (a.used, a.borrowed, b.lent) == (6, 2, 2)
    # team-b wants all 4 of its nominal L4s: it would have to reclaim from serving: it waits
    b1 = _job("b1", "b", 4, t="2030-01-01T00:00:01Z")
    start = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=4)
    (verdict,) = quota_admissions(_view(), [b1], {"b/b1": start}, NOW, serving=serving).values()
    assert verdict.verdict is Verdict.WAIT
    assert verdict.victims == ()
    # a TrainingJob of team-a beyond what serving leaves of the cohort waits too
    a1 = _job("a1", "a", 3, t="2030-01-01T00:00:02Z")
    start3 = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=3)
    got = quota_admissions(_view(), [a1], {"a/a1": start3}, NOW, serving=serving)["a/a1"]
    assert got.verdict is Verdict.WAIT


def test_the_serving_room_is_what_the_queue_could_ever_hold_of_one_replica() -> None:
    view = _view()  # team-a: 4 L4 of its own and 4 it may borrow from team-b; no shares
    room = serving_room(view, "a", "default")
    assert room is not None
    assert room.queue == "team-a"
    assert room.holds("L4", {"nvidia.com/gpu": "8"}, {})
    assert not room.holds("L4", {"nvidia.com/gpu": "9"}, {})
    assert not room.holds("T4", {"nvidia.com/gpu": "1"}, {})  # not a type it lists
    share = {"chronotope.dev/gpu-compute-percent": "50", "chronotope.dev/gpu-memory-mib": "1024"}
    assert not room.holds("L4", {"chronotope.dev/gpu-share": "1"}, share)  # no share quota
    assert room.holds("L4", {}, {})  # a pod without GPUs takes no quota
    alone = serving_room(_view(cohort=False), "a", "default")
    assert alone is not None
    assert not alone.holds("L4", {"nvidia.com/gpu": "5"}, {})
    # no limit known: quotas off, or a LocalQueue (or its Queue) missing
    assert serving_room(QuotaView.parse([], []), "a", "default") is None
    assert serving_room(view, "nowhere", "default") is None
    assert serving_room(view, "z", "default") is None


def _deployment(replicas: int, gpus: int, gpu_type: str = "L4") -> dict[str, Any]:
    pod = _serving_pod("x", "a", gpus)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": gpu_type}
    template = {"metadata": {"labels": pod["metadata"]["labels"]}, "spec": pod["spec"]}
    return {"kind": "Deployment", "spec": {"replicas": replicas, "template": template}}


def test_a_serving_workload_above_a_lowered_quota_may_shrink_but_not_grow() -> None:
    # team-a's web pipeline runs 4 pods x 2 L4 = 8: all of its 4 and team-b's 4
    pods = [_serving_pod(f"web-{i}", "a", 2) for i in range(4)]
    view = _view(cohort=False)  # then the cohort goes: team-a's quota is 4 L4, it holds 8

    def admit(*objects: dict[str, Any]) -> str | None:
        return serving_admission(
            view,
            serving_holders(view, [], pods, "a/pipeline:web"),
            local_queue="default",
            objects=objects,
        )

    assert admit(_deployment(3, 2)) is None  # 6 L4, above the quota: it gives 2 back
    assert admit(_deployment(4, 2)) is None  # what it holds
    assert admit(_deployment(5, 2)) == (
        "queue team-a: L4 0/4 in use, no cohort to borrow from; it asks for 10 L4"
    )
    assert admit(_deployment(1, 2, "T4")) is not None  # a pool it holds nothing of
    assert admit(_deployment(2, 2), _deployment(1, 2, "T4")) is not None
    # a new workload of team-a (nothing of its own) is held to the quota, and it is full
    assert (
        serving_admission(
            view,
            serving_holders(view, [], pods, "a/pipeline:new"),
            local_queue="default",
            objects=[_deployment(1, 2)],
        )
        == "queue team-a: L4 8/4 in use, no cohort to borrow from; it asks for 2 L4"
    )


def _stopped_view(stop: str) -> QuotaView:
    spec: dict[str, Any] = {"quotas": [{"gpuType": "L4", "gpus": 4}], "stopPolicy": stop}
    spec["reclaim"] = {"gracePeriodSeconds": 7}
    return QuotaView.parse(
        [{"metadata": {"name": "team-a"}, "spec": spec}],
        [{"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}}],
    )


def test_a_draining_queue_stops_its_started_jobs_once_each() -> None:
    a1, a2 = _job("a1", "a", 2, "Running"), _job("a2", "a", 1, "Starting")
    asked = _job("a3", "a", 1, "Running")
    asked["metadata"]["annotations"] = {"chronotope.dev/preempted-by": "Queue team-a (...)"}
    jobs = [a1, a2, asked, _job("w", "a", 1), _job("other", "b", 1, "Running")]
    assert drain_victims(_stopped_view("HoldAndDrain"), jobs) == [
        ("a/a1", "team-a", 7),
        ("a/a2", "team-a", 7),
    ]
    assert drain_victims(_stopped_view("Hold"), jobs) == []  # Hold: what runs keeps running
    assert drain_victims(_view(), jobs) == []


def test_a_stopped_queue_admits_no_serving_growth_but_a_shrink() -> None:
    pods = [_serving_pod(f"web-{i}", "a", 1) for i in range(2)]

    def admit(replicas: int) -> str | None:
        return serving_admission(
            _stopped_view("Hold"),
            serving_holders(_stopped_view("Hold"), [], pods, "a/pipeline:web"),
            local_queue="default",
            objects=[_deployment(replicas, 1)],
        )

    assert admit(1) is None  # gives one back
    assert admit(3) == (
        "queue team-a is stopped (stopPolicy Hold): it admits nothing until its stopPolicy is None"
    )


def _selected_view(namespaces: list[dict[str, Any]] | None) -> QuotaView:
    spec = {
        "quotas": [{"gpuType": "L4", "gpus": 4}],
        "namespaceSelector": {"matchLabels": {"team": "a"}},
    }
    return QuotaView.parse(
        [{"metadata": {"name": "team-a"}, "spec": spec}],
        [
            {"metadata": {"name": "default", "namespace": ns}, "spec": {"queue": "team-a"}}
            for ns in ("a", "b")
        ],
        namespaces,
    )


NAMESPACES = [
    {"metadata": {"name": "a", "labels": {"team": "a"}}},
    {"metadata": {"name": "b", "labels": {"team": "b"}}},
]


def test_a_namespace_the_queue_does_not_select_gets_no_serving_quota() -> None:
    view = _selected_view(NAMESPACES)
    assert view.namespaces == {"a": {"team": "a"}, "b": {"team": "b"}}

    def admit_in(
        where: QuotaView, ns: str = "a", grown: int = 1, pods: list[dict[str, Any]] | None = None
    ) -> str | None:
        return serving_admission(
            where,
            serving_holders(where, [], pods or [], f"{ns}/pipeline:web"),
            local_queue="default",
            objects=[_deployment(grown, 1)],
        )

    assert admit_in(view, "a") is None
    assert admit_in(view, "b") == "Queue team-a's namespaceSelector does not select namespace b"
    # a shrink still goes through (it gives back), as under a lowered quota
    running = [_serving_pod(f"web-{i}", "b", 1) for i in range(2)]
    assert admit_in(view, "b", 1, running) is None
    room_a = serving_room(view, "a", "default")
    assert room_a is not None
    assert room_a.ceilings
    assert serving_room(view, "b", "default") is None  # admission says why (above)
    unknown = _selected_view(None)  # labels not read: a selecting Queue admits nothing
    assert serving_room(unknown, "a", "default") is None
    assert "namespace labels are unknown" in (admit_in(unknown) or "")


def _two_local_queues() -> QuotaView:
    """team-a fed by LocalQueues a/default and a/batch; team-b by b/default."""
    spec = {"quotas": [{"gpuType": "L4", "gpus": 4}]}
    return QuotaView.parse(
        [{"metadata": {"name": n}, "spec": spec} for n in ("team-a", "team-b")],
        [
            {"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}},
            {"metadata": {"name": "batch", "namespace": "a"}, "spec": {"queue": "team-a"}},
            {"metadata": {"name": "default", "namespace": "b"}, "spec": {"queue": "team-b"}},
            {"metadata": {"name": "default", "namespace": "z"}, "spec": {"queue": "gone"}},
        ],
    )


def _waiting(name: str, ns: str, t: str, **spec: Any) -> dict[str, Any]:
    job = _job(name, ns, 1, "Waiting", t=t)
    job["spec"].update(spec)
    job["status"]["conditions"] = [
        {"type": "Schedulable", "status": "True", "reason": "QuotaExceeded", "message": "m"}
    ]
    return job


def test_pending_jobs_are_listed_per_queue_in_admission_order_with_positions() -> None:
    jobs = [
        _job("a0", "a", 4, "Running", t="2030-01-01T00:00:00Z"),  # started: not pending
        _waiting("a1", "a", "2030-01-01T00:00:01Z"),
        _waiting("a2", "a", "2030-01-01T00:00:02Z", queue="batch"),
        _waiting("a3", "a", "2030-01-01T00:00:03Z", priority=5),  # higher priority: first
        _job("a4", "a", 1, t="2030-01-01T00:00:04Z"),  # no status yet: pending, no reason
        _job("a5", "a", 1, "Succeeded", t="2030-01-01T00:00:05Z"),  # ended: nowhere
        _waiting("b1", "b", "2030-01-01T00:00:06Z"),
        _waiting("z1", "z", "2030-01-01T00:00:07Z"),  # its Queue does not exist: nowhere
    ]
    jobs[1]["status"]["predictedStartTime"] = "2030-01-01T15:00:00Z"
    order = pending_order(_two_local_queues(), jobs)
    assert set(order) == {"team-a", "team-b"}
    got = [
        (q.workload, q.local_queue, q.priority, q.position, q.local_queue_position, q.reason)
        for q in order["team-a"]
    ]
    assert got == [
        ("a/a3", "default", 5, 1, 1, "QuotaExceeded"),
        ("a/a1", "default", 0, 2, 2, "QuotaExceeded"),
        ("a/a2", "batch", 0, 3, 1, "QuotaExceeded"),
        ("a/a4", "default", 0, 4, 3, None),
    ]
    assert [q.workload for q in order["team-b"]] == ["b/b1"]
    # each with its predicted start where its status has one
    assert [q.predicted_start_time for q in order["team-a"]][:2] == [
        None,
        datetime(2030, 1, 1, 15, 0, tzinfo=UTC),
    ]
    # the Queue's status lists the same head, in the same order
    report = queue_report(_two_local_queues(), jobs)
    assert report["team-a"].pending_head == order["team-a"]
    assert report["team-a"].pending_workloads == 4


def _quota_waiting_pipeline(name: str, ns: str, t: str, **status: Any) -> dict[str, Any]:
    """An InferencePipeline as its controller writes it while quota holds all of it back."""
    return {
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": t},
        "spec": {"queue": "batch"},
        "status": {"phase": "Pending", "whyWaiting": "waiting for quota: queue team-a: ..."}
        | status,
    }


def test_serving_workloads_waiting_for_quota_are_pending_in_their_queue() -> None:
    view = _two_local_queues()
    jobs = [_waiting("a1", "a", "2030-01-01T00:00:09Z")]
    pipelines = [
        _quota_waiting_pipeline("web", "a", "2030-01-01T00:00:02Z"),
        _quota_waiting_pipeline("old", "a", "2030-01-01T00:00:01Z"),
        # waits for something else, or serves: not pending for quota
        _quota_waiting_pipeline("gpus", "a", "", whyWaiting="no node has room"),
        _quota_waiting_pipeline("up", "a", "", phase="Serving"),
    ]
    quota_wait = {"type": "Ready", "status": "False", "reason": "QuotaExceeded"}
    variants = [variant(v, group=None) for v in ("v1", "v2")]  # one group: one workload
    for v in variants:
        v["metadata"] |= {"namespace": "b", "creationTimestamp": ""}
        v["status"] = {"phase": "Pending", "conditions": [quota_wait]}
    waiting = waiting_serving(pipelines, variants)
    assert [(w.workload.key, w.workload.local_queue) for w in waiting] == [
        ("b/serving-group:meta-llama-llama-2-7b-hf", "default"),  # no creation time: first
        ("a/pipeline:old", "batch"),
        ("a/pipeline:web", "batch"),
    ]
    report = queue_report(view, jobs, (), waiting)
    assert report["team-a"].pending_workloads == 3
    head = [
        (q.workload, q.position, q.local_queue_position, q.reason)
        for q in report["team-a"].pending_head
    ]
    assert head == [  # after the Queue's TrainingJobs: not in the jobs' admission cycle
        ("a/a1", 1, 1, "QuotaExceeded"),
        ("a/pipeline:old", 2, 1, "QuotaExceeded"),
        ("a/pipeline:web", 3, 2, "QuotaExceeded"),
    ]
    assert report["team-b"].pending_workloads == 1
    local = local_queue_report(view, jobs, (), waiting)
    assert local[("a", "batch")][:2] == (0, 2)
    assert local[("b", "default")][:2] == (0, 1)
    # once its pods exist (they hold or reserve quota) a workload is no longer pending
    serving = serving_workloads(
        view,
        [
            _serving_pod("web-0", "a", 1)
            | {
                "metadata": {
                    "name": "web-0",
                    "namespace": "a",
                    "labels": {"chronotope.dev/pipeline": "web", "chronotope.dev/queue": "batch"},
                }
            }
        ],
    )
    report = queue_report(view, jobs, serving, waiting)
    assert [q.workload for q in report["team-a"].pending_head] == ["a/a1", "a/pipeline:old"]
    assert (report["team-a"].admitted_workloads, report["team-a"].pending_workloads) == (1, 2)
    assert local_queue_report(view, jobs, serving, waiting)[("a", "batch")][1] == 1


def test_an_older_waiting_serving_workload_keeps_its_quota_from_younger_jobs() -> None:
    view = _view(cohort=False)  # team-a: 4 L4, no borrowing
    running = _job("r", "a", 2, "Running", t="2030-01-01T00:00:00Z")  # 2 L4 left
    young = _job("young", "a", 2, t="2030-01-01T00:00:03Z")
    two = {"gpuType": "L4", "gpus": 2}
    web = _quota_waiting_pipeline("web", "a", "2030-01-01T00:00:02Z", quotaDemand=[two])
    web["spec"]["queue"] = "default"
    start = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=2)

    def verdicts(*pipelines: dict[str, Any], jobs: tuple[dict[str, Any], ...] = ()) -> Any:
        waits = waiting_serving(pipelines, [])
        asking = [young, *jobs]
        decided = {f"a/{j['metadata']['name']}": start for j in asking}
        got = admission_cycle(view, [running, *asking], decided, NOW, serving_waits=waits)
        return {k: a.verdict for k, a in got.admissions.items()}

    # alone, the younger job takes the 2 L4s
    assert verdicts() == {"a/young": Verdict.ADMIT}
    # the pipeline asked first and fits: its 2 L4s are kept for it (it gets no verdict here:
    # its own controller admits it), the younger job waits
    assert verdicts(web) == {"a/young": Verdict.WAIT}
    # a job older than the pipeline goes first, as a job does
    old = _job("old", "a", 2, t="2030-01-01T00:00:01Z")
    assert verdicts(web, jobs=(old,)) == {"a/young": Verdict.WAIT, "a/old": Verdict.ADMIT}
    # the Queue lists them in that order
    waits = waiting_serving([web], [])
    head = queue_report(view, [running, young, old], (), waits)["team-a"].pending_head
    assert [q.workload for q in head] == ["a/old", "a/pipeline:web", "a/young"]


def test_a_serving_workload_waiting_on_several_gpu_types_keeps_them_all_or_none() -> None:
    quotas = [{"gpuType": "L4", "gpus": 4}, {"gpuType": "T4", "gpus": 2}]
    view = QuotaView.parse(
        [{"metadata": {"name": "team-a"}, "spec": {"quotas": quotas}}],
        [{"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}}],
    )
    running = _job("r", "a", 2, "Running", t="2030-01-01T00:00:00Z")  # 2 of 4 L4 left
    young = _job("young", "a", 2, t="2030-01-01T00:00:03Z")  # asks 2 L4
    start = Decision(Action.START, "fits", gpu_type="L4", workers=1, gpus_per_worker=2)
    both = [{"gpuType": "L4", "gpus": 2}, {"gpuType": "T4", "gpus": 2}]
    web = _quota_waiting_pipeline("web", "a", "2030-01-01T00:00:02Z", quotaDemand=both)
    web["spec"]["queue"] = "default"

    def young_verdict(*others: dict[str, Any]) -> Verdict:
        waits = waiting_serving([web], [])
        jobs = [running, young, *others]
        got = admission_cycle(view, jobs, {"a/young": start}, NOW, serving_waits=waits)
        return got.admissions["a/young"].verdict

    # the older pipeline fits on both types: its 2 L4 and 2 T4 are kept, the job waits
    assert young_verdict() is Verdict.WAIT
    # with the T4 quota taken it fits on neither (all or none): the younger job takes the L4s
    t4 = _job("t4", "a", 2, "Running", t="2030-01-01T00:00:00Z")
    t4["status"]["plan"]["gpuType"] = "T4"
    t4["spec"] |= {
        "gpuTypes": [{"name": "T4", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "T4", "durationSeconds": 60},
    }
    assert young_verdict(t4) is Verdict.ADMIT
    # its one alternative names every type, and the queue lists it before the job
    (wait,) = waiting_serving([web], [])
    assert not wait.workload.preempts_within_queue  # as its controller, never in its queue
    assert wait.workload.alternatives[0].gpu_types == ("L4", "T4")
    assert wait.workload.alternatives[0].pools() == {
        ("L4", Unit.GPUS): 2,
        ("T4", Unit.GPUS): 2,
    }
    head = queue_report(view, [running, young], (), [wait])["team-a"].pending_head
    assert [q.workload for q in head] == ["a/pipeline:web", "a/young"]


def test_a_queue_status_lists_only_the_first_ten_pending() -> None:
    jobs = [_waiting(f"a{i:02d}", "a", f"2030-01-01T00:00:{i:02d}Z") for i in range(13)]
    head = queue_report(_view(), jobs)["team-a"].pending_head
    assert [q.workload for q in head] == [f"a/a{i:02d}" for i in range(10)]
    assert queue_report(_view(), jobs)["team-a"].pending_workloads == 13


def test_why_a_job_waits_says_where_it_stands_in_its_queue() -> None:
    jobs = [
        _waiting("a1", "a", "2030-01-01T00:00:01Z"),
        _waiting("a2", "a", "2030-01-01T00:00:02Z", queue="batch"),
        _waiting("a3", "a", "2030-01-01T00:00:03Z"),
    ]
    order = pending_order(_two_local_queues(), jobs)
    assert queue_place("a/a3", order) == (
        "queue: 3 of 3 pending in Queue team-a, 2 of 2 in LocalQueue a/default "
        "(admission order: priority, deadline, age; one further back starts first when it "
        "fits and those ahead do not, unless the Queue is StrictFIFO)"
    )
    assert queue_place("a/nope", order) is None
    lines = explain("TrainingJob", jobs[1], [], queue_order=order)
    assert lines[2].startswith(
        "queue: 2 of 3 pending in Queue team-a, 1 of 1 in LocalQueue a/batch"
    )
    assert not any(line.startswith("queue:") for line in explain("TrainingJob", jobs[1], []))


def _lending_view(policy: str = "PreemptBorrowed") -> QuotaView:
    """team-a and team-b, 4 L4 each in cohort ml; team-b reclaims under `policy`."""
    spec = {"quotas": [{"gpuType": "L4", "gpus": 4}], "cohort": "ml"}
    b = spec | {"reclaim": {"policy": policy, "gracePeriodSeconds": 45}}
    return QuotaView.parse(
        [
            {"metadata": {"name": "team-a"}, "spec": spec},
            {"metadata": {"name": "team-b"}, "spec": b},
        ],
        [
            {"metadata": {"name": "default", "namespace": ns}, "spec": {"queue": f"team-{ns}"}}
            for ns in ("a", "b")
        ],
    )


def _borrowers() -> list[dict[str, Any]]:
    """team-a runs 8 L4: its own 4 and all 4 of team-b's (a2 and a3 borrow them)."""
    return [
        _job("a1", "a", 4, "Running"),
        _job("a2", "a", 2, "Running"),
        _job("a3", "a", 2, "Running"),
    ]


def test_a_serving_workload_within_its_nominal_quota_reclaims_what_its_queue_lent() -> None:
    def reclaim(view: QuotaView, replicas: int, jobs: list[dict[str, Any]]) -> Any:
        holders = serving_holders(view, jobs, [], "b/pipeline:web")
        return serving_reclaim(
            view, holders, local_queue="default", objects=[_deployment(replicas, 1)]
        )

    holders = serving_holders(_lending_view(), _borrowers(), [], "b/pipeline:web")
    held = serving_admission(
        _lending_view(), holders, local_queue="default", objects=[_deployment(2, 1)]
    )
    assert held is not None
    assert "only once borrowers in cohort ml give it back" in held
    # 2 of its own 4 L4: one borrower (the newest of the lowest priority: a3) gives 2 back
    back = StopCause.RECLAIM
    assert reclaim(_lending_view(), 2, _borrowers()) == ("team-b", {"a/a3": back})
    assert reclaim(_lending_view(), 4, _borrowers()) == ("team-b", {"a/a3": back, "a/a2": back})
    assert reclaim(_lending_view(), 5, _borrowers()) is None  # beyond nominal: no reclaim
    assert reclaim(_lending_view("Never"), 2, _borrowers()) is None
    assert reclaim(_lending_view(), 2, _borrowers()[:2]) is None  # fits as it is


def test_a_serving_workload_that_would_borrow_stops_borrowers_above_their_fair_share() -> None:
    # cohort ml: team-a 2, team-b 2, team-c 4 (idle), fairShare: Preempt; team-a runs 6
    # (a2 and a3 borrow 4 of team-c's); b's pipeline asks 4 L4: 2 of its own, 2 borrowed
    def view(fair: str) -> QuotaView:
        return QuotaView.parse(
            [
                {
                    "metadata": {"name": f"team-{q}"},
                    "spec": {
                        "quotas": [{"gpuType": "L4", "gpus": n}],
                        "cohort": "ml",
                        "reclaim": {"fairShare": fair, "gracePeriodSeconds": 45},
                    },
                }
                for q, n in (("a", 2), ("b", 2), ("c", 4))
            ],
            [
                {"metadata": {"name": "default", "namespace": ns}, "spec": {"queue": f"team-{ns}"}}
                for ns in ("a", "b")
            ],
        )

    jobs = [_job(f"a{i}", "a", 2, "Running") for i in (1, 2, 3)]
    holders = serving_holders(view("Preempt"), jobs, [], "b/pipeline:web")
    got = serving_reclaim(
        view("Preempt"), holders, local_queue="default", objects=[_deployment(4, 1)]
    )
    # with it team-b's share is 2/8, team-a's without a3 2/8: a3 stops for it
    assert got == ("team-b", {"a/a3": StopCause.FAIR_SHARE})
    assert reclaim_words(*got).startswith("queue team-b borrows for its fair share: stopping")
    # once its pods exist the queue loop stops a3, saying why
    pods = [_unbound(_serving_pod(f"web-{i}", "b", 1)) for i in range(4)]
    (stop,) = serving_reclaims(view("Preempt"), lambda: jobs, pods)
    assert (stop.victim, stop.cause, stop.grace_seconds) == ("a/a3", StopCause.FAIR_SHARE, 45)
    # without fairShare it waits, and its pods would stop nobody
    holders = serving_holders(view("Never"), jobs, [], "b/pipeline:web")
    assert (
        serving_reclaim(view("Never"), holders, local_queue="default", objects=[_deployment(4, 1)])
        is None
    )
    assert serving_reclaims(view("Never"), lambda: jobs, pods) == []


def _unbound(pod: dict[str, Any]) -> dict[str, Any]:
    return pod | {"status": {"phase": "Pending"}}


def test_serving_pods_stop_the_borrowers_of_their_queues_lent_quota_once() -> None:
    view = _lending_view()
    waiting = [_unbound(_serving_pod(f"web-{i}", "b", 1)) for i in range(2)]
    got = serving_reclaims(view, _borrowers, waiting)
    assert [(r.victim, r.queue, r.grace_seconds, r.workload) for r in got] == [
        ("a/a3", "team-b", 45, "b/pipeline:web")
    ]
    # a3 was asked to stop: it counts as gone, and nobody else is asked
    asked = _borrowers()
    asked[2]["metadata"]["annotations"] = {"chronotope.dev/preempted-by": "b/pipeline:web (x)"}
    assert serving_reclaims(view, lambda: asked, waiting) == []
    # pods that free GPUs of the type let run at once reclaim as well: the borrower
    # still holds quota its lender now uses
    bound = [p | {"spec": p["spec"] | {"nodeName": "n1"}} for p in waiting]
    assert [r.victim for r in serving_reclaims(view, _borrowers, bound)] == ["a/a3"]
    # beside a borrower that leaves it the 2 it runs (a1 4 + a2 2 + its 2 = the cohort's 8):
    # nobody; without serving pods the jobs are not even read
    assert serving_reclaims(view, lambda: _borrowers()[:2], bound) == []

    def unread() -> list[dict[str, Any]]:
        raise AssertionError("the jobs were read")

    assert serving_reclaims(view, unread, []) == []
    assert serving_reclaims(_lending_view("Never"), _borrowers, waiting) == []
    # beyond its nominal quota (it would have to borrow what it reclaims): nobody is stopped
    many = [_unbound(_serving_pod(f"web-{i}", "b", 1)) for i in range(5)]
    assert serving_reclaims(view, _borrowers, many) == []
