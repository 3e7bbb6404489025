"""The scheduling pass with queues: the plan-ahead weighs waiting for a type's quota."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.api.v1alpha1.queue import QueueSpec
from chronotope.sharing.labels import GPU_PRODUCT_LABEL as GPU_LABEL
from chronotope.sim.training.queues import QueueSetup, QuotaPolicy
from chronotope.workloads.capacity import NodeCapacity
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.gates import BandView, Decider
from chronotope.workloads.quota import StopCause, Verdict
from chronotope.workloads.training import Action
from chronotope.workloads.training_pass import schedule
from chronotope.workloads.training_policy import LEASE_S, ChronotopePolicy, Job, JobState
from chronotope.workloads.training_quota import QuotaView
from tests.unit.workloads.test_backfill import busy_pod, node

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CAPACITY = [
    NodeCapacity("h100-0", "H100", 8, 0, True),  # a1's
    NodeCapacity("h100-1", "H100", 8, 8, True),  # free, but team-a's H100 quota is all a1's
    NodeCapacity("l4-0", "L4", 8, 8, True),
]


def _job(name: str, created: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "a", "creationTimestamp": created},
        "spec": {
            "replicas": 1,
            "gpu": {"count": 8},
            "gpuTypes": [
                {"name": "H100", "relativeSpeed": 1.0},
                {"name": "L4", "relativeSpeed": 0.25},
            ],
            "estimate": {"referenceGpuType": "H100", "durationSeconds": 3600},
            "utility": {"function": "Step", "deadline": (NOW + timedelta(hours=2)).isoformat()},
            "template": {"spec": {"containers": [{"name": "w", "image": "x"}]}},
        },
        "status": status,
    }


def _view() -> QuotaView:
    quotas = [{"gpuType": "H100", "gpus": 8}, {"gpuType": "L4", "gpus": 8}]
    return QuotaView.parse(
        [{"metadata": {"name": "team-a"}, "spec": {"quotas": quotas}}],
        [{"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}}],
    )


def _a1(ends_in: timedelta) -> dict[str, Any]:
    """a1 runs on team-a's whole H100 quota and is predicted to end in `ends_in`."""
    return _job(
        "a1",
        "2030-01-01T10:00:00Z",
        phase="Running",
        plan={
            "gpuType": "H100",
            "workers": 1,
            "totalGpus": 8,
            "startTime": "2030-01-01T11:00:00Z",
            "predictedCompletionTime": (NOW + ends_in).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
    )


def _pass(ends_in: timedelta) -> Any:
    a1 = _a1(ends_in)
    a2 = _job("a2", "2030-01-01T11:30:00Z", phase="Waiting")
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    done = schedule([a1, a2], [], [], _view(), decider=decider, now=NOW, capacity=CAPACITY)
    return done.verdicts["a/a2"].decision


def test_a_job_waits_for_its_types_quota_when_that_meets_its_deadline() -> None:
    # L4 now: 4 h, misses the 2 h deadline; H100 once a1 ends (30 min): done in 1.5 h
    d = _pass(timedelta(minutes=30))
    assert (d.action, d.gpu_type, d.cause) == (Action.WAIT, "H100", "WaitingForQuota")
    assert d.start == NOW + timedelta(minutes=30)
    assert "its queue's H100 quota frees up 2030-01-01 12:30 (a/a1 ends)" in d.reason


def test_a_job_starts_where_quota_admits_it_when_waiting_does_not_pay() -> None:
    # a1 ends in 3 h: waiting for H100 misses the deadline as well; L4 now is no worse
    d = _pass(timedelta(hours=3))
    assert (d.action, d.gpu_type) == (Action.START, "L4")
    assert "queue team-a admits it within its nominal quota" in d.reason


def test_a_job_ahead_waiting_for_the_types_quota_takes_it_first() -> None:
    # a0 (H100 only, 3 h, higher priority) waits for team-a's H100 quota ahead of a2:
    # once a1 ends at 12:30 it is a0's; a2's turn on H100 comes at 15:30, past its
    # deadline, so L4 now (alone, a2 waits for 12:30: the first test)
    a1 = _a1(timedelta(minutes=30))
    a0 = _job("a0", "2030-01-01T11:00:00Z", phase="Waiting")
    a0["spec"]["gpuTypes"] = [{"name": "H100", "relativeSpeed": 1.0}]
    a0["spec"]["estimate"]["durationSeconds"] = 3 * 3600
    a0["spec"]["priority"] = 1
    del a0["spec"]["utility"]
    a2 = _job("a2", "2030-01-01T11:30:00Z", phase="Waiting")
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    done = schedule([a1, a0, a2], [], [], _view(), decider=decider, now=NOW, capacity=CAPACITY)
    first = done.verdicts["a/a0"].decision
    assert (first.action, first.cause, first.start) == (
        Action.WAIT,
        "QuotaExceeded",
        NOW + timedelta(minutes=30),
    )
    d = done.verdicts["a/a2"].decision
    assert (d.action, d.gpu_type) == (Action.START, "L4")
    admission = done.verdicts["a/a2"].admission
    assert admission is not None
    assert admission.preferred == (
        "H100",
        (NOW + timedelta(hours=3, minutes=30)).timestamp(),
        "a/a0",
    )


def _plain(name: str, created: str, hours: float, **status: Any) -> dict[str, Any]:
    job = _job(name, created, **status)
    job["spec"]["gpuTypes"] = [{"name": "H100", "relativeSpeed": 1.0}]
    job["spec"]["estimate"]["durationSeconds"] = int(hours * 3600)
    del job["spec"]["utility"]
    return job


def test_the_pass_hands_the_policy_what_finished_jobs_reveal_about_estimates() -> None:
    """Succeeded jobs' `estimateRatio` reaches the fleet policy (the case of test_fleet)."""
    fresh = _plain("fresh", "2030-01-01T11:00:00Z", 2, phase="Waiting")
    nearly = _plain("nearly", "2030-01-01T11:00:00Z", 1, phase="Waiting", completedFraction=0.9)
    finished = [
        _plain(f"f{i}", "2030-01-01T09:00:00Z", 1, phase="Succeeded", estimateRatio=r)
        for i, r in enumerate([0.5, 0.5, 0.5, 0.5, 10.0])
    ]
    one_h100 = [NodeCapacity("h100-1", "H100", 8, 8, True)]
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])

    def starts(jobs: list[dict[str, Any]]) -> set[str]:
        done = schedule(
            jobs, [], [], QuotaView.parse([], []), decider=decider, now=NOW, capacity=one_h100
        )
        return {k for k, v in done.verdicts.items() if v.decision.action is Action.START}

    assert starts([fresh, nearly]) == {"a/nearly"}  # 6 min left on its estimate
    assert starts([fresh, nearly, *finished]) == {"a/fresh"}  # likely one of the 10x kind


def test_a_job_whose_admitted_types_gpus_the_jobs_ahead_take_starts_on_another_type() -> None:
    # team-a's H100 quota (16) counts a node that is gone: quota admits b1 and b2 on H100,
    # b1 takes the 8 H100 GPUs there are; b2 accepts L4 too, where its quota and GPUs have
    # room: it starts there in the same pass (a second round), not "queued behind b1"
    b1 = _plain("b1", "2030-01-01T11:00:00Z", 1, phase="Waiting")
    b2 = _plain("b2", "2030-01-01T11:01:00Z", 1, phase="Waiting")
    b2["spec"]["gpuTypes"].append({"name": "L4", "relativeSpeed": 1.0})
    quotas = [{"gpuType": "H100", "gpus": 16}, {"gpuType": "L4", "gpus": 8}]
    view = QuotaView.parse(
        [{"metadata": {"name": "team-a"}, "spec": {"quotas": quotas}}],
        [{"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}}],
    )
    capacity = [
        NodeCapacity("h100-1", "H100", 8, 8, True),
        NodeCapacity("l4-0", "L4", 8, 8, True),
    ]
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    done = schedule([b1, b2], [], [], view, decider=decider, now=NOW, capacity=capacity)
    assert (done.verdicts["a/b1"].decision.action, done.verdicts["a/b1"].decision.gpu_type) == (
        Action.START,
        "H100",
    )
    second = done.verdicts["a/b2"]
    assert (second.decision.action, second.decision.gpu_type) == (Action.START, "L4")
    assert second.admission is not None
    assert second.admission.demand is not None
    assert second.admission.demand.gpu_type == "L4"  # the quota it starts on is L4's
    assert "queue team-a admits it within its nominal quota" in second.decision.reason


def test_a_later_round_reclaims_and_preempts_nothing() -> None:
    spec = {
        "quotas": [{"gpuType": "H100", "gpus": 8}],
        "cohort": "ml",
        "reclaim": {
            "policy": "PreemptBorrowed",
            "withinQueue": "LowerPriority",
            "fairShare": "Preempt",
            "gracePeriodSeconds": 90,
        },
    }
    view = QuotaView.parse([{"metadata": {"name": "team-a"}, "spec": spec}], [])
    calm = view.without_preemption().queues["team-a"]
    reclaim = calm.reclaim
    assert (reclaim.policy, reclaim.within_queue, reclaim.fair_share) == ("Never",) * 3
    assert calm.reclaim.grace_period_seconds == 90
    assert calm.quotas == view.queues["team-a"].quotas
    assert view.queues["team-a"].reclaim.policy.value == "PreemptBorrowed"  # a copy


def _checkpointing(
    name: str, namespace: str, hours: float, types: dict[str, float], **status: Any
) -> dict[str, Any]:
    """A preemptible, checkpointing 8-GPU job of `hours` on its fastest type."""
    job = _job(name, "2030-01-01T10:00:00Z", **status)
    job["metadata"]["namespace"] = namespace
    job["spec"]["gpuTypes"] = [{"name": t, "relativeSpeed": s} for t, s in types.items()]
    job["spec"]["estimate"] = {"referenceGpuType": "H100", "durationSeconds": int(hours * 3600)}
    job["spec"]["checkpoint"] = {"path": "/ckpt/x"}
    del job["spec"]["utility"]
    return job


def _running_on(job: dict[str, Any], gpu_type: str) -> dict[str, Any]:
    job["status"] = {
        "phase": "Running",
        "plan": {
            "gpuType": gpu_type,
            "workers": 1,
            "totalGpus": 8,
            "startTime": "2030-01-01T11:00:00Z",
        },
    }
    return job


def _teams(**quotas: dict[str, int]) -> QuotaView:
    """One Queue per team (`team-x` for namespace `x`), with its GPUs per type."""
    return QuotaView.parse(
        [
            {
                "metadata": {"name": f"team-{ns}"},
                "spec": {"quotas": [{"gpuType": t, "gpus": n} for t, n in q.items()]},
            }
            for ns, q in quotas.items()
        ],
        [
            {"metadata": {"name": "default", "namespace": ns}, "spec": {"queue": f"team-{ns}"}}
            for ns in quotas
        ],
    )


def test_a_job_is_not_moved_to_a_type_its_queues_quota_does_not_admit() -> None:
    # the policy would move a 10 h job from V100 to a free H100 4x faster; its queue has
    # no H100 quota, so it would only restart on V100 (and be moved again, every pass)
    slow = _running_on(_checkpointing("slow", "a", 10, {"H100": 1.0, "V100": 0.25}), "V100")
    capacity = [
        NodeCapacity("v100-0", "V100", 8, 0, True),
        NodeCapacity("h100-0", "H100", 8, 8, True),
    ]
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])

    def stops(view: QuotaView) -> dict[str, str]:
        run = schedule([slow], [], [], view, decider=decider, now=NOW, capacity=capacity)
        return dict(run.stops)

    assert "moves it from V100 to H100" in stops(QuotaView.parse([], []))["a/slow"]
    assert "moves it from V100 to H100" in stops(_teams(a={"V100": 8, "H100": 8}))["a/slow"]
    assert stops(_teams(a={"V100": 8})) == {}


def test_a_lease_is_not_given_to_a_job_on_a_type_its_queue_does_not_admit_it_on() -> None:
    # team-b's 10 h job holds the H100s; team-a's 1 h job accepts H100 and L4, but
    # team-a's quota is L4 only: it starts on the free L4s, and the 10 h job keeps its
    # lease (stopping it would free H100s that team-a's quota cannot use)
    long = _running_on(_checkpointing("long", "b", 10, {"H100": 1.0}), "H100")
    short = _checkpointing("short", "a", 1, {"H100": 1.0, "L4": 0.5}, phase="Waiting")
    capacity = [
        NodeCapacity("h100-0", "H100", 8, 0, True),
        NodeCapacity("l4-0", "L4", 8, 8, True),
    ]
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])

    def run(view: QuotaView) -> Any:
        return schedule([long, short], [], [], view, decider=decider, now=NOW, capacity=capacity)

    free = run(QuotaView.parse([], []))
    assert "gives its H100 GPUs to a/short" in free.stops["b/long"]
    assert free.verdicts["a/short"].decision.action is Action.WAIT  # for the H100s
    quota = run(_teams(a={"L4": 8}, b={"H100": 8}))
    assert quota.stops == {}
    d = quota.verdicts["a/short"].decision
    assert (d.action, d.gpu_type) == (Action.START, "L4")


def test_a_running_job_of_a_deleted_queue_keeps_its_lease() -> None:
    # team-b's Queue is gone: its running work keeps running (docs/queues.md) and is not
    # stopped for team-a's shorter job, since it could not be admitted again
    long = _running_on(_checkpointing("long", "b", 10, {"H100": 1.0}), "H100")
    short = _checkpointing("short", "a", 1, {"H100": 1.0}, phase="Waiting")
    capacity = [NodeCapacity("h100-0", "H100", 8, 0, True)]
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    both = _teams(a={"H100": 8}, b={"H100": 8})
    run = schedule([long, short], [], [], both, decider=decider, now=NOW, capacity=capacity)
    assert "gives its H100 GPUs to a/short" in run.stops["b/long"]
    gone = replace(both, queues={"team-a": both.queues["team-a"]})
    run = schedule([long, short], [], [], gone, decider=decider, now=NOW, capacity=capacity)
    assert run.stops == {}
    assert run.verdicts["a/short"].decision.action is Action.WAIT


def _l4_job(name: str, created: str, hours: float) -> dict[str, Any]:
    """A waiting 2-GPU L4 job of team-a (no deadline)."""
    job = _job(name, created, phase="Waiting")
    job["spec"] |= {
        "gpu": {"count": 2},
        "gpuTypes": [{"name": "L4", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "L4", "durationSeconds": hours * 3600},
    }
    del job["spec"]["utility"]
    return job


def _l4_view(gpus: int) -> QuotaView:
    """Queue team-a with `gpus` L4 GPUs of quota; namespace a's LocalQueue names it."""
    quotas = [{"gpuType": "L4", "gpus": gpus}]
    return QuotaView.parse(
        [{"metadata": {"name": "team-a"}, "spec": {"quotas": quotas}}],
        [{"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}}],
    )


def _simulated_team_a() -> tuple[list[Job], QuotaPolicy]:
    """The simulator's queues on the same: team-a's 2 L4s, a 4 h job then a 1 h one."""
    specs = {"team-a": QueueSpec.model_validate({"quotas": [{"gpuType": "l4", "gpus": 2}]})}
    jobs = [
        Job(0, -7200.0, 2, 4 * 3600.0, "trainingjob", {"l4": 1.0}),
        Job(1, -3600.0, 2, 1 * 3600.0, "trainingjob", {"l4": 1.0}),
    ]
    queues = {0: "team-a", 1: "team-a"}
    return jobs, QuotaPolicy(
        ChronotopePolicy(round_s=LEASE_S), QueueSetup(specs, {"team-a": 1.0}), queues
    )


def test_freed_quota_goes_to_the_job_the_cluster_policy_runs_first_as_in_the_simulator() -> None:
    # team-a's L4 quota holds one of its two 2-GPU jobs; 4 L4 GPUs are free. Quota
    # used to admit the older one (4 h) and the fleet policy only saw that one, so
    # quota ran its queue oldest first. The simulator's queues admit the policy's wish
    # first, in its order (`sim.training.queues.QuotaPolicy`): the short job (1 h)
    view = _l4_view(2)
    old = _l4_job("old", "2030-01-01T10:00:00Z", hours=4)
    new = _l4_job("new", "2030-01-01T11:00:00Z", hours=1)
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    l4 = [NodeCapacity("l4-0", "L4", 4, 4, True)]
    done = schedule([old, new], [], [], view, decider=decider, now=NOW, capacity=l4)
    assert done.verdicts["a/new"].decision.action is Action.START
    assert done.verdicts["a/old"].decision.action is Action.WAIT
    assert "queue team-a: L4 2/2 in use" in done.verdicts["a/old"].decision.reason

    # the simulator's queues, on the same jobs and quota: the same job runs
    jobs, sim = _simulated_team_a()
    states = [JobState(job=j, remaining_s=j.work_s) for j in jobs]
    assert sim.allocate(0.0, states, {"l4": 4}) == {1: "l4"}


def test_a_full_queue_gives_a_lease_to_the_job_the_policy_runs_in_its_place() -> None:
    # team-a's 2 L4 quota and both L4 GPUs are held by `long` (4 h left, checkpoints);
    # `short` (1 h) waits. Without queues the cluster policy gives long's lease to short;
    # with them quota used to hold short back (2/2 in use), so the policy never saw it.
    # Now quota stops long for short within the queue (pass 6, cause Lease), as the
    # simulator's queues admit the policy's wish
    view = _l4_view(2)
    long = _l4_job("long", "2030-01-01T10:00:00Z", hours=4)
    long["spec"] |= {"preemptible": True, "checkpoint": {"path": "/ckpt/long"}}
    long["status"] = {
        "phase": "Running",
        "plan": {
            "gpuType": "L4",
            "workers": 1,
            "totalGpus": 2,
            "startTime": NOW.isoformat(),
            "predictedCompletionTime": (NOW + timedelta(hours=4)).isoformat(),
        },
    }
    short = _l4_job("short", "2030-01-01T11:00:00Z", hours=1)
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    l4 = [NodeCapacity("l4-0", "L4", 2, 0, True)]
    done = schedule([long, short], [], [], view, decider=decider, now=NOW, capacity=l4)
    verdict = done.verdicts["a/short"]
    assert verdict.admission is not None
    assert verdict.admission.verdict is Verdict.RECLAIM
    assert verdict.admission.cause is StopCause.LEASE
    assert verdict.admission.victims == ("a/long",)
    assert verdict.decision.cause == "PreemptingWithinQueue"
    assert "stopping a/long (checkpoint" in verdict.decision.reason

    # the simulator's queues: the same job runs, the long one stops
    jobs, sim = _simulated_team_a()
    states = [JobState(job=jobs[0], remaining_s=jobs[0].work_s, gpu_type="l4")]
    states.append(JobState(job=jobs[1], remaining_s=jobs[1].work_s))
    assert sim.allocate(0.0, states, {"l4": 2}) == {1: "l4"}


def test_no_lease_of_a_job_the_wish_moves_ahead_to_a_type_its_queue_cannot_admit() -> None:
    # `long` runs on team-a's 2 L4s (3 h left there, 1 h on the A100s, which only team-b
    # has quota for); `short` (2 h, L4 only) waits. Quota aside, the policy moves long to
    # the idle A100s and gives short its L4 lease. Stopping long for short (pass 6) would
    # only start it again: quota admits long first (the wish runs it first) and, with no
    # A100 quota, on L4, where it ran; the next pass gave short its lease again, and so on
    # (a job stopped every other pass, found in process at scale). The simulator's queues
    # keep long on L4 and short waits: so does the pass
    view = QuotaView.parse(
        [
            {"metadata": {"name": "team-a"}, "spec": {"quotas": [{"gpuType": "L4", "gpus": 2}]}},
            {"metadata": {"name": "team-b"}, "spec": {"quotas": [{"gpuType": "A100", "gpus": 4}]}},
        ],
        [{"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}}],
    )
    long = _l4_job("long", "2030-01-01T10:00:00Z", hours=3)
    long["spec"] |= {"preemptible": True, "checkpoint": {"path": "/ckpt/long"}}
    long["spec"]["gpuTypes"].append({"name": "A100", "relativeSpeed": 3.0})
    long["status"] = {
        "phase": "Running",
        "plan": {"gpuType": "L4", "workers": 1, "totalGpus": 2, "startTime": NOW.isoformat()},
    }
    short = _l4_job("short", "2030-01-01T11:00:00Z", hours=2)
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    nodes = [NodeCapacity("l4-0", "L4", 2, 0, True), NodeCapacity("a100-0", "A100", 4, 4, True)]
    done = schedule([long, short], [], [], view, decider=decider, now=NOW, capacity=nodes)
    verdict = done.verdicts["a/short"]
    assert verdict.admission is not None
    assert verdict.admission.verdict is Verdict.WAIT
    assert verdict.admission.victims == ()
    assert done.stops == {}

    # the simulator's queues, on the same jobs and quota: long keeps L4, short waits
    specs = {
        "team-a": QueueSpec.model_validate({"quotas": [{"gpuType": "l4", "gpus": 2}]}),
        "team-b": QueueSpec.model_validate({"quotas": [{"gpuType": "a100", "gpus": 4}]}),
    }
    jobs = [
        Job(0, -7200.0, 2, 3 * 3600.0, "trainingjob", {"l4": 1.0, "a100": 3.0}),
        Job(1, -3600.0, 2, 2 * 3600.0, "trainingjob", {"l4": 1.0}),
    ]
    sim = QuotaPolicy(
        ChronotopePolicy(round_s=LEASE_S),
        QueueSetup(specs, {"team-a": 1.0, "team-b": 1.0}),
        {0: "team-a", 1: "team-a"},
    )
    states = [JobState(job=jobs[0], remaining_s=jobs[0].work_s, gpu_type="l4")]
    states.append(JobState(job=jobs[1], remaining_s=jobs[1].work_s))
    assert sim.inner.allocate(0.0, states, {"l4": 2, "a100": 4}) == {0: "a100", 1: "l4"}
    assert sim.allocate(0.0, states, {"l4": 2, "a100": 4}) == {0: "l4"}


def test_quota_admits_a_wished_job_on_the_type_the_policy_wishes_it_on_as_in_the_simulator() -> (
    None
):
    # Four G3 and four G2 GPUs, all free. Team-b's `first` (20 min, G3 only) comes first
    # in the policy's order and takes the G3s; team-a's `quick` (30 min on G3, 39 on G2)
    # comes next, and the policy runs it on G2. Team-a has quota for both types. Quota
    # asked for quick's own fastest type first and admitted it on G3, whose GPUs `first`
    # takes: quick waited beside idle G2s (and at scale, a job restarted on a type the
    # policy then moved it off, again and again). The simulator's queues ask for the
    # wished type first; so does the pass now: both start
    quotas = [{"gpuType": "G3", "gpus": 4}, {"gpuType": "G2", "gpus": 4}]
    view = QuotaView.parse(
        [
            {"metadata": {"name": "team-a"}, "spec": {"quotas": quotas}},
            {"metadata": {"name": "team-b"}, "spec": {"quotas": quotas[:1]}},
        ],
        [
            {"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}},
            {"metadata": {"name": "default", "namespace": "b"}, "spec": {"queue": "team-b"}},
        ],
    )
    quick = _l4_job("quick", "2030-01-01T10:00:00Z", hours=0.5)
    quick["spec"] |= {
        "gpu": {"count": 4},
        "gpuTypes": [{"name": "G3", "relativeSpeed": 1.3}, {"name": "G2", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "G3", "durationSeconds": 1800},
    }
    first = _l4_job("first", "2030-01-01T11:00:00Z", hours=1 / 3)
    first["metadata"]["namespace"] = "b"
    first["spec"] |= {
        "gpu": {"count": 4},
        "gpuTypes": [{"name": "G3", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "G3", "durationSeconds": 1200},
    }
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    nodes = [NodeCapacity("g3-0", "G3", 4, 4, True), NodeCapacity("g2-0", "G2", 4, 4, True)]
    done = schedule([quick, first], [], [], view, decider=decider, now=NOW, capacity=nodes)
    started = {
        k: v.decision.gpu_type
        for k, v in done.verdicts.items()
        if v.decision.action is Action.START
    }
    assert started == {"b/first": "G3", "a/quick": "G2"}

    # the simulator's queues, on the same jobs and quota
    specs = {
        "team-a": QueueSpec.model_validate(
            {"quotas": [{"gpuType": "g3", "gpus": 4}, {"gpuType": "g2", "gpus": 4}]}
        ),
        "team-b": QueueSpec.model_validate({"quotas": [{"gpuType": "g3", "gpus": 4}]}),
    }
    jobs = [
        Job(0, -7200.0, 4, 1800.0 * 1.3, "trainingjob", {"g3": 1.3, "g2": 1.0}),
        Job(1, -3600.0, 4, 1200.0, "trainingjob", {"g3": 1.0}),
    ]
    sim = QuotaPolicy(
        ChronotopePolicy(round_s=LEASE_S),
        QueueSetup(specs, {"team-a": 1.0, "team-b": 1.0}),
        {0: "team-a", 1: "team-b"},
    )
    states = [JobState(job=j, remaining_s=j.work_s) for j in jobs]
    assert sim.allocate(0.0, states, {"g3": 4, "g2": 4}) == {1: "g3", 0: "g2"}


def _long_on(nodes: list[str], per_worker: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`long` (4 h, checkpoints) of team-a running one worker of `per_worker` L4s per node."""
    long = _l4_job("long", "2030-01-01T10:00:00Z", hours=4)
    long["spec"] |= {"preemptible": True, "checkpoint": {"path": "/ckpt/long"}}
    long["spec"] |= {"replicas": len(nodes), "gpu": {"count": per_worker}}
    plan = {"gpuType": "L4", "workers": len(nodes), "totalGpus": len(nodes) * per_worker}
    long["status"] = {"phase": "Running", "plan": plan | {"startTime": NOW.isoformat()}}
    workers = []
    for rank, where in enumerate(nodes):
        pod = busy_pod(f"long-g0-{rank}", where, per_worker)
        pod["metadata"] |= {"namespace": "a", "labels": {JOB_LABEL: "long"}}
        workers.append(pod)
    return long, workers


def test_a_lease_within_a_queue_is_given_only_where_the_job_fits_once_it_has_stopped() -> None:
    # team-a's 4 L4 quota is held by `long`; every L4 GPU is busy. `short` wants one
    # 4-GPU worker. With long's workers 2 + 2 on nodes a and b (the other team's pods
    # hold the rest), counted per type its 4 GPUs would do, but no node would hold short
    # once long stopped: long keeps its lease, nobody is stopped. With long's one
    # 4-GPU worker on a, short fits there once it has stopped: the lease is given
    view = _l4_view(4)
    nodes = [node("a", "L4", 4), node("b", "L4", 4)]
    short = _l4_job("short", "2030-01-01T11:00:00Z", hours=1)
    short["spec"]["gpu"]["count"] = 4
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    long, workers = _long_on(["a", "b"], 2)
    pods = [*workers, busy_pod("x", "a", 2), busy_pod("y", "b", 2)]
    done = schedule([long, short], nodes, pods, view, decider=decider, now=NOW)
    verdict = done.verdicts["a/short"]
    assert verdict.admission is not None
    assert verdict.admission.verdict is Verdict.WAIT
    assert done.stops == {}
    long, workers = _long_on(["a"], 4)
    pods = [*workers, busy_pod("y", "b", 4)]
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    done = schedule([long, short], nodes, pods, view, decider=decider, now=NOW)
    verdict = done.verdicts["a/short"]
    assert verdict.admission is not None
    assert verdict.admission.victims == ("a/long",)
    # while a worker of ours waits to bind (here on another type), no lease is given (a
    # later pass gives it)
    binding = busy_pod("other-g0-0", "", 1)
    binding["spec"] |= {"schedulerName": "chronotope", "nodeSelector": {GPU_LABEL: "V100"}}
    del binding["spec"]["nodeName"]
    binding["status"] = {"phase": "Pending"}
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    done = schedule([long, short], nodes, [*pods, binding], view, decider=decider, now=NOW)
    verdict = done.verdicts["a/short"]
    assert verdict.admission is not None
    assert verdict.admission.verdict is Verdict.WAIT


def _running_l4(name: str, namespace: str, created: str, hours: float) -> dict[str, Any]:
    """A 2-GPU L4 job of `namespace` that checkpoints and runs now, `hours` left."""
    job = _l4_job(name, created, hours=hours)
    job["metadata"]["namespace"] = namespace
    job["spec"] |= {"preemptible": True, "checkpoint": {"path": f"/ckpt/{name}"}}
    job["status"] = {
        "phase": "Running",
        "plan": {"gpuType": "L4", "workers": 1, "totalGpus": 2, "startTime": NOW.isoformat()},
    }
    return job


def test_a_job_the_policy_runs_takes_the_lease_its_own_queue_gives_up_as_in_the_simulator() -> None:
    # team-a and team-b each have 2 L4s of quota, and each runs a long job on them (6 h
    # and 5 h left; the node's 4 L4s are busy). Each has a short job waiting (b's 1 h,
    # a's 2 h). Quota aside, the policy runs both short jobs in place of both long ones,
    # and pairs the leases across the queues (b's short job in place of a's long one),
    # which quota cannot give: neither queue lends. The leases within a queue used to
    # be those pairs only, so both short jobs waited behind long ones for good. The
    # simulator's queues admit each queue's wished job before the job the wish drops:
    # so does the pass now, each short job taking its own queue's lease
    quota = [{"gpuType": "L4", "gpus": 2}]
    view = QuotaView.parse(
        [
            {"metadata": {"name": "team-a"}, "spec": {"quotas": quota}},
            {"metadata": {"name": "team-b"}, "spec": {"quotas": quota}},
        ],
        [
            {"metadata": {"name": "default", "namespace": "a"}, "spec": {"queue": "team-a"}},
            {"metadata": {"name": "default", "namespace": "b"}, "spec": {"queue": "team-b"}},
        ],
    )
    jobs = [
        _running_l4("along", "a", "2030-01-01T09:00:00Z", hours=6),
        _running_l4("blong", "b", "2030-01-01T09:30:00Z", hours=5),
        _l4_job("bshort", "2030-01-01T11:00:00Z", hours=1),
        _l4_job("ashort", "2030-01-01T11:30:00Z", hours=2),
    ]
    jobs[2]["metadata"]["namespace"] = "b"
    decider = Decider(lambda _n, name: f"model profile {name} not found", lambda *_: [])
    l4 = [NodeCapacity("l4-0", "L4", 4, 0, True)]
    wish, _ = decider.band_on(BandView(l4, jobs), NOW, 0)
    assert wish.yields == {"b/bshort": ("L4", ("a/along",)), "a/ashort": ("L4", ("b/blong",))}
    assert wish.giving == {"L4": ("a/along", "b/blong")}

    done = schedule(jobs, [], [], view, decider=decider, now=NOW, capacity=l4)
    for taker, victim in (("a/ashort", "a/along"), ("b/bshort", "b/blong")):
        admission = done.verdicts[taker].admission
        assert admission is not None
        assert (admission.verdict, admission.cause) == (Verdict.RECLAIM, StopCause.LEASE)
        assert admission.victims == (victim,)

    # the simulator's queues, on the same jobs and quota: both short jobs run
    specs = {n: QueueSpec.model_validate({"quotas": [{"gpuType": "l4", "gpus": 2}]}) for n in "ab"}
    sim_jobs = [
        Job(0, -9000.0, 2, 6 * 3600.0, "trainingjob", {"l4": 1.0}),
        Job(1, -7200.0, 2, 5 * 3600.0, "trainingjob", {"l4": 1.0}),
        Job(2, -3600.0, 2, 1 * 3600.0, "trainingjob", {"l4": 1.0}),
        Job(3, -1800.0, 2, 2 * 3600.0, "trainingjob", {"l4": 1.0}),
    ]
    sim = QuotaPolicy(
        ChronotopePolicy(round_s=LEASE_S),
        QueueSetup(specs, {"a": 1.0, "b": 1.0}),
        {0: "a", 1: "b", 2: "b", 3: "a"},
    )
    states = [JobState(job=j, remaining_s=j.work_s, gpu_type="l4") for j in sim_jobs[:2]]
    states += [JobState(job=j, remaining_s=j.work_s) for j in sim_jobs[2:]]
    assert sim.allocate(0.0, states, {"l4": 4}) == {2: "l4", 3: "l4"}
