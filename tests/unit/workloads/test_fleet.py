"""The simulator's training policy as the operator's gate for jobs of equal priority."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.workloads.capacity import NodeCapacity
from chronotope.workloads.fleet import FleetJob, estimate_ratios, fleet_gate, plan_band

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
EIGHT_H100 = [NodeCapacity("h0", "H100", 8, 8, True)]


def job(key: str, hours: float, **over: Any) -> FleetJob:
    spec: dict[str, Any] = {
        "replicas": 1,
        "gpu": {"count": 8},
        "gpuTypes": [{"name": "H100", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "H100", "durationSeconds": int(hours * 3600)},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return FleetJob(key, TrainingJobSpec.model_validate(spec | over), NOW, 0.0)


def test_shortest_remaining_work_goes_first() -> None:
    short, long = job("ns/short", 1), job("ns/long", 10)
    assert fleet_gate(short, 8, [long], EIGHT_H100, NOW).starts
    waits = fleet_gate(long, 8, [short], EIGHT_H100, NOW)
    assert not waits.starts
    assert "gives the GPUs now to ns/short" in waits.reason


def test_a_deadline_at_risk_goes_before_shorter_work() -> None:
    deadline = (NOW + timedelta(hours=2.5)).isoformat()
    urgent = job("ns/urgent", 2, utility={"function": "Step", "deadline": deadline})
    short = job("ns/short", 1)
    assert fleet_gate(urgent, 8, [short], EIGHT_H100, NOW).starts
    assert not fleet_gate(short, 8, [urgent], EIGHT_H100, NOW).starts


def test_a_deadline_with_room_lets_much_shorter_work_through_first() -> None:
    # 10 h estimated, due in 30 h: the 1 h job runs first (the deadline job waits an hour)
    deadline = (NOW + timedelta(hours=30)).isoformat()
    roomy = job("ns/roomy", 10, utility={"function": "Step", "deadline": deadline})
    short = job("ns/short", 1)
    assert fleet_gate(short, 8, [roomy], EIGHT_H100, NOW).starts
    assert not fleet_gate(roomy, 8, [short], EIGHT_H100, NOW).starts
    # due in 9.5 h: no room left even on its estimate, so it goes first
    tight = job(
        "ns/tight",
        10,
        utility={"function": "Step", "deadline": (NOW + timedelta(hours=9.5)).isoformat()},
    )
    assert fleet_gate(tight, 8, [short], EIGHT_H100, NOW).starts


def test_running_jobs_keep_their_gpus_in_the_plan() -> None:
    busy = [NodeCapacity("h0", "H100", 16, 8, True)]
    running = FleetJob("ns/run", job("x", 5).spec, NOW, 0.5, running_on="H100", running_gpus=8)
    got = fleet_gate(job("ns/new", 3), 8, [running], busy, NOW)
    assert got.starts
    assert got.gpu_type == "H100"


def test_types_a_job_does_not_accept_are_never_given_to_it() -> None:
    mixed = [NodeCapacity("h0", "H100", 8, 8, True), NodeCapacity("v0", "V100", 8, 8, True)]
    v100_only = job(
        "ns/v",
        1,
        gpuTypes=[{"name": "V100", "relativeSpeed": 1.0}],
        estimate={"referenceGpuType": "V100", "durationSeconds": 3600},
    )
    got = fleet_gate(job("ns/h", 2), 8, [v100_only], mixed, NOW)
    assert got.starts
    assert got.gpu_type == "H100"
    other = fleet_gate(v100_only, 8, [job("ns/h", 2)], mixed, NOW)
    assert other.starts
    assert other.gpu_type == "V100"


def test_types_with_no_gpu_free_are_left_out_of_the_plan() -> None:
    mixed = [NodeCapacity("h0", "H100", 8, 8, True), NodeCapacity("v0", "V100", 8, 0, True)]
    assert fleet_gate(job("ns/h", 2), 8, [job("ns/g", 3)], mixed, NOW).starts


def test_profile_speeds_replace_relative_speeds() -> None:
    mixed = [NodeCapacity("h0", "H100", 8, 8, True), NodeCapacity("v0", "V100", 8, 8, True)]
    both = [{"name": "H100"}, {"name": "V100"}]
    spec = job("ns/p", 2, gpuTypes=both, parallelism={"modelProfile": "p"}).spec
    slow_v100 = FleetJob("ns/p", spec, NOW, 0.0, speeds={"H100": 3.0, "V100": 1.0})
    fast_v100 = FleetJob("ns/p", spec, NOW, 0.0, speeds={"H100": 1.0, "V100": 3.0})
    other = job("ns/o", 2)
    assert fleet_gate(slow_v100, 8, [other], mixed, NOW).gpu_type == "H100"
    assert fleet_gate(fast_v100, 8, [other], mixed, NOW).gpu_type == "V100"


def test_the_policy_gets_the_estimate_and_the_work_done_not_a_true_remaining() -> None:
    from chronotope.workloads.fleet import _job

    spec = job("x", 1).spec  # estimate: 3600 s
    estimate = spec.estimate.duration_seconds

    def believed(**over: float | None) -> float:
        fleet_job = FleetJob("ns/x", spec, NOW, **{"done": 0.0, **over})  # type: ignore[arg-type]
        state = _job(0, fleet_job, NOW, {"H100"}, 8)
        assert state is not None
        assert state.job.estimate_s == estimate
        return state.estimated_remaining_s()

    assert believed(done=0.5) == estimate * 0.5
    assert believed(done=0.25, progress=0.25) == estimate * 0.75
    # 2.5x past its estimate: the doubling rule, as in the simulator's noisy runs
    assert believed(done=0.99, progress=2.5) == estimate * 2.5


def test_finished_jobs_estimate_errors_change_who_goes_first() -> None:
    """The policy learns estimate errors from finished jobs in the operator as in the simulator.

    `nearly` has done 90 % of its 1 h estimate: on the estimate alone it has 6 min left.
    If finished jobs took half their estimate or ten times it, a job still running at
    0.9 of its estimate is one of the ten-times kind (about 9 h left), while a fresh
    2 h job expects 2 h x (4 x 0.5 + 10) / 5 = 4.8 h.
    """
    fresh, nearly = job("ns/fresh", 2), replace(job("ns/nearly", 1), done=0.9)
    assert not fleet_gate(fresh, 8, [nearly], EIGHT_H100, NOW).starts
    learned = [0.5, 0.5, 0.5, 0.5, 10.0]
    assert fleet_gate(fresh, 8, [nearly], EIGHT_H100, NOW, errors=learned).starts
    assert not fleet_gate(nearly, 8, [fresh], EIGHT_H100, NOW, errors=learned).starts


def test_estimate_ratios_are_read_from_succeeded_jobs_only() -> None:
    jobs: list[dict[str, Any]] = [
        {"status": {"phase": "Succeeded", "estimateRatio": 1.5}},
        {"status": {"phase": "Succeeded"}},  # finished before the operator recorded ratios
        {"status": {"phase": "Running", "estimateRatio": 9.0}},
        {"status": {"phase": "Failed", "estimateRatio": 3.0}},
        {"status": {"phase": "Succeeded", "estimateRatio": 0}},
        {},
    ]
    assert estimate_ratios(jobs) == [1.5]


CKPT: dict[str, Any] = {"checkpoint": {"path": "/ckpt/x"}}


def running(key: str, hours: float, gpu_type: str = "H100", **over: Any) -> FleetJob:
    """A job running on `gpu_type` with 8 GPUs, nothing of its `hours` done yet."""
    return replace(job(key, hours, **over), running_on=gpu_type, running_gpus=8)


def test_a_long_running_job_gives_its_lease_to_much_shorter_work() -> None:
    # 10 h of work holds the only 8 H100s; a 1 h job arrives. The policy's lease:
    # giving it up costs a round (360 s) and a restart, and the short job gains 10 h
    held = [NodeCapacity("h0", "H100", 8, 0, True)]
    long = running("ns/long", 10, gpuTypes=[{"name": "H100", "relativeSpeed": 1.0}], **CKPT)
    plan = plan_band([(long, 8), (job("ns/short", 1), 8)], held, NOW)
    assert plan.stops.keys() == {"ns/long"}
    assert "gives its H100 GPUs to ns/short" in plan.stops["ns/long"]
    assert plan.yields == {"ns/short": ("H100", ("ns/long",))}
    out = plan.outcome("ns/short")
    assert not out.starts  # the GPUs are free only once the long job has stopped
    assert out.gpu_type == "H100"
    assert "in place of ns/long" in out.reason


def test_only_preemptible_checkpointing_fixed_size_jobs_give_their_lease_up() -> None:
    held = [NodeCapacity("h0", "H100", 8, 0, True)]
    overs: list[dict[str, Any]] = [
        {},  # no checkpoint: it would lose its work
        {**CKPT, "preemptible": False},
        {**CKPT, "minReplicas": 1, "maxReplicas": 2},  # elastic: SAILOR's rule re-plans it
    ]
    for over in overs:
        long = running("ns/long", 10, **over)
        plan = plan_band([(long, 8), (job("ns/short", 1), 8)], held, NOW)
        assert plan.stops == {}, over
        assert not plan.outcome("ns/short").starts


def test_a_job_on_a_slow_type_moves_when_a_much_faster_one_frees_up() -> None:
    types = [{"name": "H100", "relativeSpeed": 1.0}, {"name": "V100", "relativeSpeed": 0.25}]
    slow = running("ns/slow", 10, "V100", gpuTypes=types, **CKPT)
    cluster = [NodeCapacity("v0", "V100", 8, 0, True), NodeCapacity("h0", "H100", 8, 8, True)]
    plan = plan_band([(slow, 8)], cluster, NOW)
    assert "moves it from V100 to H100" in plan.stops["ns/slow"]


def test_a_move_that_gains_less_than_a_lease_round_is_not_made() -> None:
    # 1 h of work at 0.95 on V100 against 1.0 on a free H100: 3 min sooner, below the
    # round (360 s) plus restart (30 s) that giving the lease up costs
    types = [{"name": "H100", "relativeSpeed": 1.0}, {"name": "V100", "relativeSpeed": 0.95}]
    near = running("ns/near", 1, "V100", gpuTypes=types, **CKPT)
    cluster = [NodeCapacity("v0", "V100", 8, 0, True), NodeCapacity("h0", "H100", 8, 8, True)]
    assert plan_band([(near, 8)], cluster, NOW).stops == {}


def test_a_job_given_a_lease_waits_for_it_rather_than_backfill_a_slower_type() -> None:
    # the policy gives the short job the long one's H100s; it waits for them to be
    # freed rather than start on the idle L4s (which would stop the long job for nobody)
    held = [NodeCapacity("h0", "H100", 8, 0, True), NodeCapacity("l0", "L4", 8, 8, True)]
    long = running("ns/long", 10, gpuTypes=[{"name": "H100", "relativeSpeed": 1.0}], **CKPT)
    short = job(
        "ns/short",
        1,
        gpuTypes=[{"name": "H100", "relativeSpeed": 1.0}, {"name": "L4", "relativeSpeed": 0.5}],
    )
    plan = plan_band([(long, 8), (short, 8)], held, NOW)
    assert plan.yields == {"ns/short": ("H100", ("ns/long",))}
    assert plan.starts == {}
    assert "gives its H100 GPUs to ns/short" in plan.stops["ns/long"]


def test_a_move_to_a_slower_type_says_it_frees_the_faster_one() -> None:
    # two 8-GPU jobs: a long one on the only H100s, a much shorter one on the L4s that
    # gains more from H100 (4x): the policy swaps them, and says why for each
    types = [{"name": "H100", "relativeSpeed": 1.0}, {"name": "L4", "relativeSpeed": 0.25}]
    long = running("ns/long", 40, "H100", gpuTypes=types, **CKPT)
    short = running("ns/short", 2, "L4", gpuTypes=types, **CKPT)
    cluster = [NodeCapacity("h0", "H100", 8, 0, True), NodeCapacity("l0", "L4", 8, 0, True)]
    plan = plan_band([(long, 8), (short, 8)], cluster, NOW)
    assert "moves it from L4 to H100, where it finishes sooner" in plan.stops["ns/short"]
    assert "moves it from H100 to L4, to free its H100 GPUs" in plan.stops["ns/long"]


def test_a_lease_is_given_up_only_for_a_job_whose_workers_fit_once_it_has_stopped() -> None:
    # the long job's 8 H100s are 4 on each of two nodes; the short job's one worker
    # needs 8 on one node. The policy (a pool per type) would stop the long job for it;
    # the nodes say the short job would not fit: the long job keeps its lease, and the
    # short job says why, or backfills the idle L4s where it accepts them
    held = [NodeCapacity("h0", "H100", 8, 0, True), NodeCapacity("h1", "H100", 8, 0, True)]
    long = running("ns/long", 10, gpuTypes=[{"name": "H100", "relativeSpeed": 1.0}], **CKPT)
    short = job("ns/short", 1)
    asked: list[tuple[str, str, tuple[str, ...]]] = []

    def fits(j: FleetJob, gpu_type: str, victims: tuple[FleetJob, ...]) -> bool:
        asked.append((j.key, gpu_type, tuple(v.key for v in victims)))
        return gpu_type != "H100"

    plan = plan_band([(long, 8), (short, 8)], held, NOW, fits=fits)
    assert asked == [("ns/short", "H100", ("ns/long",))]
    assert plan.stops == {}
    assert plan.yields == {}
    out = plan.outcome("ns/short")
    assert not out.starts
    assert out.reason.endswith(
        "would run it now on H100 in place of ns/long, but its workers would not fit the "
        "nodes once they had stopped: they keep their lease"
    )
    # where they fit, as before
    plan = plan_band([(long, 8), (short, 8)], held, NOW, fits=lambda *_: True)
    assert plan.stops.keys() == {"ns/long"}
    assert plan.yields == {"ns/short": ("H100", ("ns/long",))}
    # a job that also accepts idle L4s starts there instead of waiting
    either = job(
        "ns/short",
        1,
        gpuTypes=[{"name": "H100", "relativeSpeed": 1.0}, {"name": "L4", "relativeSpeed": 0.5}],
    )
    idle_l4 = [*held, NodeCapacity("l0", "L4", 8, 8, True)]
    plan = plan_band([(long, 8), (either, 8)], idle_l4, NOW, fits=fits)
    assert plan.stops == {}
    assert plan.starts == {"ns/short": "L4"}
    assert plan.outcome("ns/short").starts


def test_a_job_is_moved_only_to_a_type_its_workers_fit() -> None:
    # the policy would move the slow job to the free H100s (4x faster); the nodes say its
    # workers would not fit there: it keeps its lease (before: stopped, restarted where it
    # was, and moved again at the next pass)
    types = [{"name": "H100", "relativeSpeed": 1.0}, {"name": "V100", "relativeSpeed": 0.25}]
    slow = running("ns/slow", 10, "V100", gpuTypes=types, **CKPT)
    cluster = [NodeCapacity("v0", "V100", 8, 0, True), NodeCapacity("h0", "H100", 8, 8, True)]
    asked: list[tuple[str, str, tuple[str, ...]]] = []

    def fits(j: FleetJob, gpu_type: str, victims: tuple[FleetJob, ...]) -> bool:
        asked.append((j.key, gpu_type, tuple(v.key for v in victims)))
        return False

    assert plan_band([(slow, 8)], cluster, NOW, fits=fits).stops == {}
    assert asked == [("ns/slow", "H100", ())]
    assert "moves it from V100 to H100" in plan_band([(slow, 8)], cluster, NOW).stops["ns/slow"]


def test_a_swap_is_checked_with_the_other_job_gone() -> None:
    # each job of a swap fits its new type only once the other has left it
    types = [{"name": "H100", "relativeSpeed": 1.0}, {"name": "L4", "relativeSpeed": 0.25}]
    long = running("ns/long", 40, "H100", gpuTypes=types, **CKPT)
    short = running("ns/short", 2, "L4", gpuTypes=types, **CKPT)
    cluster = [NodeCapacity("h0", "H100", 8, 0, True), NodeCapacity("l0", "L4", 8, 0, True)]
    asked: dict[str, tuple[str, tuple[str, ...]]] = {}

    def fits(j: FleetJob, gpu_type: str, victims: tuple[FleetJob, ...]) -> bool:
        asked[j.key] = (gpu_type, tuple(v.key for v in victims))
        return bool(victims)

    plan = plan_band([(long, 8), (short, 8)], cluster, NOW, fits=fits)
    assert asked == {"ns/long": ("L4", ("ns/short",)), "ns/short": ("H100", ("ns/long",))}
    assert plan.stops.keys() == {"ns/long", "ns/short"}
    # one that would not fit stays, and frees nothing for the other: both stay

    def short_only(j: FleetJob, gpu_type: str, victims: tuple[FleetJob, ...]) -> bool:
        return j.key == "ns/short" and bool(victims)

    assert plan_band([(long, 8), (short, 8)], cluster, NOW, fits=short_only).stops == {}


def test_with_the_nodes_checked_a_lease_is_given_up_only_to_a_job_that_takes_it() -> None:
    # two short H100 jobs; 8 H100s idle and 8 held by a long job. The policy gives both
    # short jobs H100, and the long job's lease to the second; the nodes refuse both
    # (say, their workers ask more CPU than any H100 node has free): neither starts, no
    # lease is given up, and neither waits for a lease it does not need
    held = [NodeCapacity("h0", "H100", 8, 0, True), NodeCapacity("h1", "H100", 8, 8, True)]
    long = running("ns/long", 10, gpuTypes=[{"name": "H100", "relativeSpeed": 1.0}], **CKPT)
    band = [(long, 8), (job("ns/a", 1), 8), (job("ns/b", 1), 8)]
    assert plan_band(band, held, NOW).stops.keys() == {"ns/long"}  # unchecked, as before
    plan = plan_band(band, held, NOW, fits=lambda *_: False)
    assert (plan.starts, plan.yields, plan.stops) == ({}, {}, {})
    assert not plan.outcome("ns/a").starts


def test_the_starts_are_placed_together_in_the_passs_order() -> None:
    # 8 idle H100s, 4 on each of two nodes (a toy of the node check: a job's one worker
    # takes the first node with room for it). The policy starts a and b (4 GPUs each, short)
    # and leaves c (2 GPUs, long) waiting; a node check of each alone passes both. In the
    # pass's order (b before a) b takes h0, then a h1; with h1 already held by another
    # scheduler's pods (as the plan's node check sees it), a is dropped and c, which fits
    # what is left, starts in its place
    idle = [NodeCapacity("h0", "H100", 8, 4, True), NodeCapacity("h1", "H100", 8, 4, True)]
    a = replace(job("ns/a", 1, gpu={"count": 4}), order=(2,))
    b = replace(job("ns/b", 1, gpu={"count": 4}), order=(1,))
    c = replace(job("ns/c", 10, gpu={"count": 2}), order=(3,))

    def plan(free: dict[str, int]) -> tuple[Any, list[str]]:
        placed: list[str] = []
        left = dict(free)

        def node_for(j: FleetJob) -> str | None:
            need = j.spec.gpu.count or 1
            return next((n for n, f in left.items() if f >= need), None)

        def fits(j: FleetJob, gpu_type: str, victims: tuple[FleetJob, ...]) -> bool:
            return node_for(j) is not None

        def took(j: FleetJob, gpu_type: str) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
            n = node_for(j)
            if n is None:
                return None
            left[n] -= j.spec.gpu.count or 1
            placed.append(j.key)
            return ((n, ()),)

        band = [(a, 4), (b, 4), (c, 2)]
        return plan_band(band, idle, NOW, fits=fits, took=took), placed

    both, placed = plan({"h0": 4, "h1": 4})
    assert both.starts == {"ns/a": "H100", "ns/b": "H100"}
    assert placed == ["ns/b", "ns/a"]  # in the pass's order, not the policy's
    assert (both.placements["ns/b"], both.placements["ns/a"]) == ((("h0", ()),), (("h1", ()),))
    assert both.outcome("ns/a").placements == (("h1", ()),)
    one, placed = plan({"h0": 4, "h1": 2})
    assert one.starts == {"ns/b": "H100", "ns/c": "H100"}
    assert placed == ["ns/b", "ns/c"]
    assert not one.outcome("ns/a").starts
