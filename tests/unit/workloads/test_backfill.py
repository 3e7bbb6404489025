"""Work conservation in the TrainingJob controller: backfill by reservation, stuck heads.

The situation of issue 18 on the demo cluster: every H100, A100 and V100 busy,
7 of the 8 L4 GPUs idle, a head job stuck in Starting on V100 (its workers
never bound), and many one-GPU jobs behind it that accept all four types. The
jobs behind must take the idle L4s in one round of reconciles; a job ahead
holds back only the GPUs its own start now needs; a stuck head is re-planned
and holds nothing; conditions never contradict each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import WHY_WAITING_MAX
from chronotope.controllers.trainingjob import merged_status, reconcile
from chronotope.sharing.labels import GENERATION_ANNOTATION, ZONE_LABEL
from chronotope.workloads.capacity import NodeCapacity
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.gates import Decider, PodsOf
from chronotope.workloads.parallelism import Degrees
from chronotope.workloads.training import Action, Decision
from chronotope.workloads.training_pass import SchedulingPass, schedule
from chronotope.workloads.training_quota import QuotaView
from chronotope.workloads.training_status import (
    pods_status,
    resizing_status,
    started_status,
    waiting_status,
)
from tests.unit.controllers.test_reconcile import FakeOps

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SPEEDS = {"A100-SXM4-80GB": 1.0, "H100-SXM5-80GB": 1.6, "V100-SXM2-32GB": 0.6, "L4": 0.5}
DEMO = [  # the demo cluster's training types: (pool, GPU product, nodes, GPUs per node)
    ("h100", "H100-SXM5-80GB", 2, 8),
    ("a100", "A100-SXM4-80GB", 2, 8),
    ("v100", "V100-SXM2-32GB", 4, 4),
    ("l4", "L4", 2, 4),
]


def node(name: str, product: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "status": {
            "capacity": {"nvidia.com/gpu": str(gpus)},
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def busy_pod(name: str, node_name: str, gpus: int) -> dict[str, Any]:
    """A pod of another scheduler holding `gpus` GPUs of `node_name`."""
    return {
        "metadata": {"name": name, "namespace": "other", "labels": {}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def tjob(
    name: str,
    *,
    created: datetime,
    hours: float = 1.0,
    gpus: int = 1,
    types: Mapping[str, float] = SPEEDS,
    priority: int = 0,
    **status: Any,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "scale",
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {},
        },
        "spec": {
            "replicas": 1,
            "priority": priority,
            "gpu": {"count": gpus},
            "gpuTypes": [{"name": t, "relativeSpeed": s} for t, s in types.items()],
            "estimate": {"referenceGpuType": next(iter(types)), "durationSeconds": hours * 3600},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
        "status": dict(status),
    }


def demo_with_l4s_idle() -> tuple[FakeOps, list[dict[str, Any]]]:
    """The demo cluster with all H100/A100/V100 and one L4 busy, a stuck head and 30 jobs."""
    nodes, busy = [], []
    for pool, product, count, per in DEMO:
        for i in range(count):
            nodes.append(node(f"{pool}-{i}", product, per))
            if pool != "l4":
                busy.append(busy_pod(f"busy-{pool}-{i}", f"{pool}-{i}", per))
    busy.append(busy_pod("busy-l4-0", "l4-0", 1))
    start = NOW - timedelta(seconds=120)
    head = tjob(
        "s000",
        created=NOW - timedelta(hours=2),
        phase="Starting",
        plan={
            "gpuType": "V100-SXM2-32GB",
            "workers": 1,
            "totalGpus": 1,
            "startTime": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "predictedCompletionTime": (start + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        conditions=[
            {
                "type": "Schedulable",
                "status": "True",
                "reason": "Planned",
                "message": "run now on V100-SXM2-32GB",
            },
            {
                "type": "Running",
                "status": "False",
                "reason": "NotStarted",
                "message": "cluster policy ... runs it now on A100-SXM4-80GB, "
                "but A100-SXM4-80GB has no room yet",
            },
        ],
    )
    jobs = [head] + [
        tjob(
            f"s{i:03d}",
            created=NOW - timedelta(hours=1, seconds=-i),
            hours=1 + (i * 7) % 4,
            phase="Waiting",
        )
        for i in range(1, 31)
    ]
    ops = FakeOps(nodes, jobs)
    ops._pods = [*busy, head_pod(head)]
    return ops, jobs


def head_pod(job: dict[str, Any]) -> dict[str, Any]:
    """The head's one worker: created for V100, never bound (Pending, unschedulable)."""
    return {
        "metadata": {
            "name": f"{job['metadata']['name']}-g0-0",
            "namespace": "scale",
            "labels": {JOB_LABEL: job["metadata"]["name"], "chronotope.dev/gang-generation": "0"},
        },
        "spec": {
            "schedulerName": "chronotope",
            "nodeSelector": {"nvidia.com/gpu.product": "V100-SXM2-32GB"},
            "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/16 nodes are available",
                }
            ],
        },
    }


def one_round(ops: FakeOps, jobs: list[dict[str, Any]]) -> list[str]:
    """Reconcile every job once, in name order, writing back status; the jobs that started."""
    started = []
    for job in sorted(jobs, key=lambda j: j["metadata"]["name"]):
        out = reconcile(job, ops, NOW)
        job["status"] = (job.get("status") or {}) | merged_status(
            job.get("status") or {}, out.status
        )
        job["metadata"]["annotations"].update(out.annotations)
        if any(e[1] == "Started" for e in out.events):
            started.append(job["metadata"]["name"])
    return started


def started_on(ops: FakeOps, names: list[str]) -> dict[str, str]:
    return {
        p["metadata"]["labels"][JOB_LABEL]: p["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
        for p in ops.started
        if p["metadata"]["labels"][JOB_LABEL] in names
    }


# ------------------------------------------------------------------ the situation
def busy_l4s(ops: FakeOps) -> int:
    return sum(
        1
        for p in ops._pods
        if (p["spec"].get("nodeSelector") or {}).get("nvidia.com/gpu.product") == "L4"
        or p["metadata"]["name"] == "busy-l4-0"
    )


def test_jobs_behind_a_stuck_head_fill_every_idle_l4() -> None:
    ops, jobs = demo_with_l4s_idle()
    started = one_round(ops, jobs)
    # the head, stuck past the timeout, is re-planned (its worker stopped); the policy
    # plans it on an L4 as well, and every other idle L4 gets a job in the same round
    head = jobs[0]
    assert head["status"]["phase"] == "Resizing"
    assert head["metadata"]["annotations"][GENERATION_ANNOTATION] == "1"
    assert ops.stopped == ["s000-g0-0"]
    assert len(started) == 6
    assert set(started_on(ops, started).values()) == {"L4"}
    waiting = [j for j in jobs if j["status"]["phase"] == "Waiting"]
    assert len(waiting) == 30 - 6
    # the policy plans the others later; those queued behind the re-planned head are held
    # back by the one L4 its own start needs, and nothing else
    queued = [
        j["status"]["whyWaiting"] for j in waiting if "queued behind" in j["status"]["whyWaiting"]
    ]
    assert queued
    assert all("take the GPUs it fits on: scale/s000 (1 on L4)" in q for q in queued)
    # next round the re-planned head takes the last one: all 8 L4s busy
    assert one_round(ops, jobs) == ["s000"]
    assert started_on(ops, ["s000"]) == {"s000": "L4"}
    assert busy_l4s(ops) == 8


def test_freed_gpus_go_to_the_queue_at_once() -> None:
    ops, jobs = demo_with_l4s_idle()
    one_round(ops, jobs)
    ops._pods = [p for p in ops._pods if p["metadata"]["name"] != "busy-v100-0"]
    started = one_round(ops, jobs)
    # the head's L4 and the 4 GPUs of v100-0, none held back by a blocked head
    assert len(started) == 5
    assert sorted(started_on(ops, started).values()) == ["L4"] + ["V100-SXM2-32GB"] * 4
    assert busy_l4s(ops) == 8


# ------------------------------------------------------- the scheduling pass: reservations
def capacity(l4_free: int) -> list[NodeCapacity]:
    return [
        NodeCapacity("v100-0", "V100-SXM2-32GB", 4, 0, True),
        NodeCapacity("l4-0", "L4", 4, min(4, l4_free), True),
        NodeCapacity("l4-1", "L4", 4, max(0, l4_free - 4), True),
    ]


def one_pass(
    jobs: list[dict[str, Any]],
    cap: list[NodeCapacity],
    pods: PodsOf = lambda *_: [],
) -> dict[str, Decision]:
    """Each job's decision in one scheduling pass on `cap` (quotas off)."""
    done = pass_on(jobs, capacity=cap, pods_of=pods)
    return {k.split("/")[1]: v.decision for k, v in done.verdicts.items()}


def pass_on(
    jobs: list[dict[str, Any]],
    nodes: list[dict[str, Any]] | None = None,
    pods: list[dict[str, Any]] | None = None,
    *,
    capacity: list[NodeCapacity] | None = None,
    pods_of: PodsOf = lambda *_: [],
) -> SchedulingPass:
    """One scheduling pass (quotas off) on the nodes and pods, or on `capacity`."""
    return schedule(
        jobs,
        nodes or [],
        pods or [],
        QuotaView.parse([], []),
        decider=Decider(lambda _n, name: f"model profile {name} not found", pods_of),
        now=NOW,
        capacity=capacity,
    )


TYPES = {"V100-SXM2-32GB": 1.2, "L4": 1.0}


@pytest.mark.parametrize(
    ("gpus", "starts"),
    [
        pytest.param(1, True, id="fits-beside-the-head"),
        pytest.param(2, False, id="would-delay-the-head"),
    ],
)
def test_backfill_never_takes_what_the_heads_planned_start_needs(gpus: int, starts: bool) -> None:
    # 5 L4s free; the head (higher priority, first in policy order) starts now on 4 of them
    head = tjob("head", created=NOW, gpus=4, priority=5, types=TYPES, phase="Waiting")
    me = tjob("me", created=NOW - timedelta(hours=1), gpus=gpus, types=TYPES, phase="Waiting")
    d = one_pass([me, head], capacity(5))
    assert d["head"].action is Action.START  # the head's start is untouched by the job behind it
    assert (d["me"].action is Action.START) is starts
    if not starts:
        assert d["me"].reason.startswith("queued behind scale/head (policy order")
        assert "scale/head (4 on L4)" in d["me"].reason


def test_a_head_that_cannot_start_now_holds_nothing_back() -> None:
    head = tjob("head", created=NOW, gpus=8, priority=5, types=TYPES, phase="Waiting")
    me = tjob("me", created=NOW, types=TYPES, phase="Waiting")
    d = one_pass([head, me], capacity(5))
    assert d["head"].action is not Action.START
    assert d["me"].action is Action.START


def test_a_head_whose_workers_exist_already_holds_nothing_back() -> None:
    # its status still says Waiting (the status write is not in the view yet)
    head = tjob("head", created=NOW, gpus=4, priority=5, types=TYPES, phase="Waiting")
    me = tjob("me", created=NOW, gpus=2, types=TYPES, phase="Waiting")
    worker = {
        "metadata": {
            "name": "head-g0-0",
            "namespace": "scale",
            "labels": {JOB_LABEL: "head", "chronotope.dev/gang-generation": "0"},
        }
    }
    d = one_pass([head, me], capacity(5), lambda *_: [worker])
    assert "head" not in d  # decided already: its GPUs are in the capacity
    assert d["me"].action is Action.START


def test_a_job_that_fits_only_on_another_type_beside_the_head_moves_there() -> None:
    cap = [
        NodeCapacity("v100-0", "V100-SXM2-32GB", 4, 2, True),
        NodeCapacity("l4-0", "L4", 4, 4, True),
    ]
    head = tjob(
        "head", created=NOW, gpus=2, priority=5, types={"V100-SXM2-32GB": 1.0}, phase="Waiting"
    )
    me = tjob("me", created=NOW, gpus=2, types=TYPES, phase="Waiting")
    alone = one_pass([me], cap)["me"]
    assert alone.gpu_type == "V100-SXM2-32GB"  # the faster type, with room for either job
    d = one_pass([head, me], cap)
    assert d["head"].gpu_type == "V100-SXM2-32GB"
    assert d["me"].action is Action.START
    assert d["me"].gpu_type == "L4"


def _zoned(name: str, product: str, free: int, zone: str) -> NodeCapacity:
    """A node of 8 GPUs of `product` in `zone`, `free` of them free."""
    labels = {ZONE_LABEL: zone, "nvidia.com/gpu.product": product}
    free_gpus = tuple(range(8 - free, 8))
    return NodeCapacity(name, product, 8, free, True, zone=zone, free_gpus=free_gpus, labels=labels)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        pytest.param("zone", "A100: room for 1 of 2 worker(s) now within one Zone", id="zone"),
        pytest.param("small", "A100: room for 0 of 2 worker(s) now", id="fragmented"),
    ],
)
def test_a_job_starts_where_its_workers_fit_not_where_the_policy_counts_free_gpus(
    case: str, why: str
) -> None:
    # the fleet policy counts A100's 8 free GPUs as one pool and picks it (faster), but
    # the gang of 2 x 4 does not fit them: they are 4 in each zone and it requires one,
    # or 2 on each of four nodes. It starts on V100, where it fits (before: it waited
    # for A100, "has no room yet", with 8 V100s idle, though alone it started on V100:
    # the policy's band needs another job of its priority)
    if case == "zone":
        cap = [_zoned("a-0", "A100", 4, "x"), _zoned("a-1", "A100", 4, "y")]
    else:
        cap = [_zoned(f"a-{i}", "A100", 2, "x") for i in range(4)]
    cap += [_zoned("v-0", "V100", 8, "x"), NodeCapacity("l4-0", "L4", 4, 4, True)]
    me = tjob("me", created=NOW, gpus=4, types={"A100": 1.0, "V100": 0.6}, phase="Waiting")
    me["spec"]["replicas"] = 2
    if case == "zone":
        me["spec"]["placement"] = {"topology": "Zone", "required": True}
    other = tjob("other", created=NOW, types={"L4": 1.0}, phase="Waiting")
    d = one_pass([me, other], cap)
    assert (d["me"].action, d["me"].gpu_type) == (Action.START, "V100")
    assert d["me"].reason.endswith(
        "(the fleet policy would pick A100, counting its 8 free GPUs as one pool, where its "
        f"workers do not fit now: {why})"
    )
    # room for the gang on A100: it starts there, as the policy picks
    cap[1] = _zoned("a-1", "A100", 8, "x")
    d = one_pass([me, other], cap)
    assert (d["me"].action, d["me"].gpu_type) == (Action.START, "A100")


def test_the_policy_gives_a_type_only_to_jobs_whose_workers_fit_its_nodes() -> None:
    # A100 has 8 free GPUs, 2 on each of four nodes. The policy's plan put x (2 workers of
    # 4, shorter, first) there and left y (one worker of 2, A100 only) waiting for them;
    # x then started on V100 (its workers do not fit the A100s) and y waited with the
    # A100s idle, until the next pass. Now the plan checks its starts against the nodes:
    # x goes to V100 and y takes A100 in the same pass
    nodes = [node(f"a{i}", "A100", 4) for i in range(4)] + [node("v0", "V100", 8)]
    pods = [busy_pod(f"b{i}", f"a{i}", 2) for i in range(4)]
    x = tjob("x", created=NOW, gpus=4, types={"A100": 1.0, "V100": 0.6}, phase="Waiting")
    x["spec"]["replicas"] = 2
    y = tjob("y", created=NOW, hours=10, gpus=2, types={"A100": 1.0}, phase="Waiting")
    done = pass_on([x, y], nodes, pods)
    starts = {k: (v.decision.action, v.decision.gpu_type) for k, v in done.verdicts.items()}
    assert starts == {"scale/x": (Action.START, "V100"), "scale/y": (Action.START, "A100")}


def _worker(job: str, node_name: str, gpus: int) -> dict[str, Any]:
    """A running worker of TrainingJob `job` (namespace scale) on `node_name`."""
    pod = busy_pod(f"{job}-g0-{node_name}", node_name, gpus)
    pod["metadata"] |= {"namespace": "scale", "labels": {JOB_LABEL: job}}
    return pod


@pytest.mark.parametrize("split", [True, False], ids=["split", "one-node"])
def test_a_lease_is_given_up_only_where_the_waiting_job_fits_once_it_has_stopped(
    split: bool,
) -> None:
    # a long preemptible, checkpointing job holds 8 H100s; a 1 h job of one 8-GPU worker
    # waits. The policy gives it the long job's lease. Split 4 + 4 over two nodes (the
    # other 4 of each held by another scheduler's pods), the short job would not fit once
    # the long one stopped: before, it was stopped for nothing; now it keeps its lease
    h100 = {"H100": 1.0}
    nodes = [node("h0", "H100", 8), node("h1", "H100", 8)]
    if split:
        pods = [_worker("long", "h0", 4), _worker("long", "h1", 4)]
        pods += [busy_pod("b0", "h0", 4), busy_pod("b1", "h1", 4)]
    else:
        pods = [_worker("long", "h0", 8), busy_pod("b1", "h1", 8)]
    plan = {"gpuType": "H100", "workers": 2 if split else 1, "totalGpus": 8}
    long = tjob("long", created=NOW - timedelta(hours=2), hours=10, gpus=8, types=h100)
    long["spec"] |= {"preemptible": True, "checkpoint": {"path": "/ckpt/long"}}
    long["status"] = {"phase": "Running", "plan": plan | {"startTime": NOW.isoformat()}}
    short = tjob("short", created=NOW, gpus=8, types=h100, phase="Waiting")
    done = pass_on([long, short], nodes, pods)
    assert done.verdicts["scale/short"].decision.action is Action.WAIT
    assert done.stops.keys() == (set() if split else {"scale/long"})


@pytest.mark.parametrize("split", [True, False], ids=["split", "one-node"])
def test_a_running_job_is_moved_only_to_a_type_its_workers_fit(split: bool) -> None:
    # a checkpointing job runs one 4-GPU worker on the slow type; the fast type (4x) has
    # 4 free GPUs, 2 on each of two nodes (or 4 on one). The policy would move it there;
    # split, its worker would not fit: it keeps its lease (before: stopped, restarted on
    # the slow type, and moved again at the next pass)
    nodes = [node("s0", "SLOW", 4), node("f0", "FAST", 4), node("f1", "FAST", 4)]
    pods = [_worker("mover", "s0", 4)]
    if split:
        pods += [busy_pod("b0", "f0", 2), busy_pod("b1", "f1", 2)]
    else:
        pods += [busy_pod("b1", "f1", 4)]
    mover = tjob("mover", created=NOW, hours=10, gpus=4, types={"FAST": 1.0, "SLOW": 0.25})
    mover["spec"] |= {"preemptible": True, "checkpoint": {"path": "/ckpt/mover"}}
    plan = {"gpuType": "SLOW", "workers": 1, "totalGpus": 4, "startTime": NOW.isoformat()}
    mover["status"] = {"phase": "Running", "plan": plan}
    done = pass_on([mover], nodes, pods)
    assert done.stops.keys() == (set() if split else {"scale/mover"})


def test_a_pass_never_starts_more_than_the_capacity_holds() -> None:
    # nine one-GPU jobs in two queues on 5 free L4s: five start, no more
    jobs = [
        tjob(f"j{i}", created=NOW - timedelta(minutes=i), types={"L4": 1.0}, phase="Waiting")
        for i in range(9)
    ]
    for i, j in enumerate(jobs):
        j["spec"]["queue"] = f"q{i % 2}"
    d = one_pass(jobs, capacity(5))
    assert sum(x.action is Action.START for x in d.values()) == 5
    # the oldest five (policy order: priority, deadline, then age) are the ones that start
    assert {k for k, x in d.items() if x.action is Action.START} == {f"j{i}" for i in range(4, 9)}


# ------------------------------------------------------------------ one reason per status
def consistent(status: Mapping[str, Any]) -> None:
    """The conditions agree with the phase and with each other (one source of the reason)."""
    conds = {c["type"]: c for c in status.get("conditions") or []}
    phase = status["phase"]
    assert set(conds) - {"QuotaReserved"} == {"Schedulable", "Running"}
    if phase == "Resizing":  # stopped to re-plan: the quota accounting no longer counts it
        assert conds["QuotaReserved"]["status"] == "False"
    if phase in ("Waiting", "Pending", "Resizing"):
        assert conds["Running"]["status"] == "False"
        assert conds["Schedulable"]["message"] == conds["Running"]["message"]
        assert conds["Running"]["message"] == status["whyWaiting"]
    elif phase == "Starting":
        assert conds["Running"]["status"] == "False"
        assert conds["Running"]["reason"] == "WorkersStarting"
        assert conds["Schedulable"]["status"] == "True"
    else:
        assert phase == "Running"
        assert conds["Running"]["status"] == "True"


def test_no_status_leaves_a_condition_of_an_earlier_phase_behind() -> None:
    wait = Decision(Action.WAIT, "cluster policy runs it now on A100, but A100 has no room yet")
    go = Decision(
        Action.START,
        "run now on V100",
        gpu_type="V100",
        workers=1,
        gpus_per_worker=1,
        finish=NOW + timedelta(hours=1),
    )
    degrees = Degrees(1, 1, 1, None)
    status: dict[str, Any] = {}
    for new in (
        waiting_status(wait, NOW, 1),
        started_status("j", go, degrees, NOW, 1, replicas=1),
        resizing_status({}, "the gang could not be placed within 45s; re-planning", NOW, 1),
        waiting_status(wait, NOW, 1),
        started_status("j", go, degrees, NOW, 1, replicas=1),
        pods_status([], {"workers": 1, "gpuType": "V100"}, NOW, 1),
    ):
        status = status | merged_status(status, new)
        consistent(status)
    assert "A100" not in str(status["conditions"])


def test_a_reason_longer_than_the_crds_limit_is_cut_to_it() -> None:
    # a job of many GPU types says why not per type; past the CRD's maxLength the API
    # server would refuse the whole status write
    long = Decision(Action.WAIT, "waiting for GPUs: " + "; ".join(["T: room for 0"] * 400))
    why = waiting_status(long, NOW, 1)["whyWaiting"]
    assert len(why) == WHY_WAITING_MAX
    assert why.endswith("...")
    assert waiting_status(Decision(Action.WAIT, "short"), NOW, 1)["whyWaiting"] == "short"


def test_the_policys_starts_on_one_type_are_checked_together_against_its_nodes() -> None:
    # A100 has 8 free GPUs: 4 on a0, 2 on a1 and 2 on a2. The policy's plan puts x and y
    # (one 3-GPU worker each, short) there and leaves z (2 workers of 2, long, A100 only)
    # waiting for them. Each of x and y fits a0 alone, but not both: checked one at a
    # time, the plan started x there and y (its workers no longer fitting) went to V100,
    # while z waited with a1 and a2 idle until the next pass. Checked together, y is
    # refused A100 in the plan and z takes a1 and a2 in the same pass
    nodes = [node("a0", "A100", 8), node("a1", "A100", 4), node("a2", "A100", 4)]
    nodes.append(node("v0", "V100", 8))
    pods = [busy_pod("b0", "a0", 4), busy_pod("b1", "a1", 2), busy_pod("b2", "a2", 2)]
    either = {"A100": 1.0, "V100": 0.6}
    x = tjob("x", created=NOW - timedelta(minutes=2), gpus=3, types=either, phase="Waiting")
    y = tjob("y", created=NOW - timedelta(minutes=1), gpus=3, types=either, phase="Waiting")
    z = tjob("z", created=NOW, hours=10, gpus=2, types={"A100": 1.0}, phase="Waiting")
    z["spec"]["replicas"] = 2
    done = pass_on([x, y, z], nodes, pods)
    starts = {k: (v.decision.action, v.decision.gpu_type) for k, v in done.verdicts.items()}
    assert starts == {
        "scale/x": (Action.START, "A100"),
        "scale/y": (Action.START, "V100"),
        "scale/z": (Action.START, "A100"),
    }


def test_a_lower_priority_band_is_planned_on_what_the_higher_ones_start() -> None:
    # h (priority 5) takes the only A100 node; l1 (priority 0) accepts A100 or V100, l2
    # only A100. Each band was planned on the GPUs free before the pass, so band 0 put
    # l1 on the A100s h takes, and l1 waited ("... but A100 has no room yet") with the
    # V100s idle until a later pass. Band 0 is now planned on what band 5's starts leave
    nodes = [node("a0", "A100", 4), node("v0", "V100", 4)]
    h = tjob("h", created=NOW, gpus=4, types={"A100": 1.0}, priority=5, phase="Waiting")
    either = {"A100": 1.0, "V100": 0.5}
    l1 = tjob("l1", created=NOW - timedelta(minutes=2), gpus=4, types=either, phase="Waiting")
    l2 = tjob("l2", created=NOW, hours=10, gpus=4, types={"A100": 1.0}, phase="Waiting")
    done = pass_on([h, l1, l2], nodes)
    starts = {k: (v.decision.action, v.decision.gpu_type) for k, v in done.verdicts.items()}
    assert starts["scale/h"] == (Action.START, "A100")
    assert starts["scale/l1"] == (Action.START, "V100")
    assert starts["scale/l2"][0] is Action.WAIT


def test_a_running_job_is_not_moved_to_a_slower_type_when_no_job_takes_its_gpus() -> None:
    # as above (split), and the long job also accepts L4s, 8 of them idle. The policy
    # moves it to the L4s, a slower type, to give its H100s to the short job; the short
    # job's worker would not fit them: before, the long job was moved anyway (checkpoint,
    # stop, restart on the slower L4s) with nobody taking its H100s; now it stays
    h100 = {"H100": 1.0}
    nodes = [node("h0", "H100", 8), node("h1", "H100", 8), node("l0", "L4", 8)]
    pods = [_worker("long", "h0", 4), _worker("long", "h1", 4)]
    pods += [busy_pod("b0", "h0", 4), busy_pod("b1", "h1", 4)]
    plan = {"gpuType": "H100", "workers": 2, "totalGpus": 8, "startTime": NOW.isoformat()}
    long = tjob("long", created=NOW, hours=10, gpus=4, types={"H100": 1.0, "L4": 0.5})
    long["spec"] |= {"replicas": 2, "preemptible": True, "checkpoint": {"path": "/ckpt/l"}}
    long["status"] = {"phase": "Running", "plan": plan}
    short = tjob("short", created=NOW, gpus=8, types=h100, phase="Waiting")
    done = pass_on([long, short], nodes, pods)
    assert done.verdicts["scale/short"].decision.action is Action.WAIT
    assert done.stops == {}
    # where the short job fits once the long one has moved, the move is made
    pods[2:] = [busy_pod("b1", "h1", 8)]
    pods[:2] = [_worker("long", "h0", 8)]
    long["status"]["plan"] |= {"workers": 1}
    long["spec"] |= {"replicas": 1}
    long["spec"]["gpu"]["count"] = 8
    done = pass_on([long, short], nodes, pods)
    assert "moves it from H100 to L4" in done.stops["scale/long"]


def test_a_pass_never_starts_more_than_the_capacity_holds_when_gpu_indices_are_unknown() -> None:
    # the plan's placements name nodes but no GPUs when the capacity does not know which
    # GPUs are free: the pass then places the starts itself, and counts each one's GPUs
    # (else the two starts of priority 5 took none, and the job of priority 0, which its
    # band's plan leaves out, found the 4 GPUs still free)
    cap = [NodeCapacity("l4-0", "L4", 4, 4, True)]  # no free_gpus
    jobs = [
        tjob(f"j{i}", created=NOW, gpus=2, types={"L4": 1.0}, priority=p, phase="Waiting")
        for i, p in enumerate((5, 5, 0))
    ]
    done = pass_on(jobs, [node("l4-0", "L4", 4)], capacity=cap)
    starts = [k for k, v in done.verdicts.items() if v.decision.action is Action.START]
    assert len(starts) == 2
