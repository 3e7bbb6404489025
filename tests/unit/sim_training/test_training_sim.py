"""Training simulator: hand-checked FIFO, invariants for every policy, exact CSV columns."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest

from chronotope.sim.training.engine import EngineSettings, simulate
from chronotope.sim.training.policies import TRAINING_POLICY_NAMES, make_training_policy
from chronotope.sim.training.report import SUMMARY_COLUMNS, summary_row
from chronotope.sim.training.workload import (
    TraceRow,
    WorkloadSettings,
    build_jobs,
    load_gavel_speeds,
)
from chronotope.sim.training_cli import DEFAULT_GAVEL, run_training
from chronotope.workloads.training_policy import ChronotopePolicy, Job, JobState

NO_OVERHEAD = EngineSettings(round_s=100.0, restart_overhead_s=0.0)
SPEED = {"k80": 0.5, "v100": 1.0}


def _job(i: int, arrival: float, gpus: int, work: float, deadline: float | None = None) -> Job:
    return Job(i, arrival, gpus, work, "t", dict(SPEED), deadline)


def test_fifo_hand_checked() -> None:
    # capacity: 2 K80 (spec order first), 2 V100. FIFO is heterogeneity-agnostic.
    cap = {"k80": 2, "v100": 2}
    jobs = [_job(0, 0, 2, 100), _job(1, 0, 2, 100), _job(2, 10, 2, 50)]
    res = simulate(jobs, cap, make_training_policy("fifo", 100.0, 0.0), NO_OVERHEAD)
    # job 0 on K80 at half speed: 200 s; job 1 on V100: 100 s; job 2 waits for V100 at 100
    assert res.finish_s == {0: 200.0, 1: 100.0, 2: 150.0}
    row = summary_row(jobs, res, cap, seed=7)
    assert row["avg_jct_h"] == round((200 + 100 + 140) / 3 / 3600, 4)
    assert row["makespan_h"] == round(200 / 3600, 4)
    # job 2 waits 10..100 s with all four GPUs busy: nothing idles while it waits
    assert (res.waiting_s, row["busy_while_waiting_pct"]) == (90.0, 100.0)


def test_fifo_head_of_line_blocks() -> None:
    cap = {"v100": 4}
    jobs = [_job(0, 0, 3, 100), _job(1, 1, 4, 10), _job(2, 2, 1, 10)]
    res = simulate(jobs, cap, make_training_policy("fifo", 100.0, 0.0), NO_OVERHEAD)
    assert res.finish_s == {0: 100.0, 1: 110.0, 2: 120.0}
    # 1..100 s: 3 of 4 GPUs busy while jobs wait behind the head; 100..110 s: all 4
    row = summary_row(jobs, res, cap, seed=0)
    assert res.waiting_s == pytest.approx(109.0)
    assert row["busy_while_waiting_pct"] == round((99 * 3 + 10 * 4) / (4 * 109) * 100, 2)


def _random_jobs(seed: int) -> list[Job]:
    rows = [
        TraceRow(submit_s=i * 37.0, duration_s=60 + (i * 7919 % 3000), num_gpus=1 << (i % 3))
        for i in range(25)
    ]
    speeds = {
        "a": {"k80": 0.2, "p100": 0.6, "v100": 1.0},
        "b": {"k80": 0.7, "p100": 0.9, "v100": 1.0},
    }
    return build_jobs(rows, speeds, 4, WorkloadSettings(deadline_share=0.5), seed)


@pytest.mark.parametrize("policy", TRAINING_POLICY_NAMES)
def test_invariants_every_policy(policy: str) -> None:
    cap = {"k80": 4, "p100": 4, "v100": 4}
    jobs = _random_jobs(3)
    res = simulate(
        jobs,
        cap,
        make_training_policy(policy, 100.0, 5.0),
        EngineSettings(round_s=100.0, restart_overhead_s=5.0),
    )
    assert set(res.finish_s) == {j.job_id for j in jobs}  # every job finishes
    assert all(res.peak_usage[g] <= cap[g] for g in cap)  # never over-allocated
    for j in jobs:
        assert res.finish_s[j.job_id] - j.arrival_s >= j.best_runtime_s() - 1e-6


def test_cli_writes_exact_columns(tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 06:00:00,600.0,1,600.0,c\n"
        "2017-10-09 06:01:00,1200.0,2,2400.0,c\n"
        "2017-10-09 06:02:00,300.0,4,1200.0,c\n"
        "2017-10-09 09:00:00,300.0,4,1200.0,c\n"
    )
    root = Path(__file__).resolve().parents[3]
    args = argparse.Namespace(
        trace=trace,
        start="2017-10-09 06:00:00",
        end="2017-10-09 07:00:00",
        cluster=root / "manifests" / "clusters" / "gavel-96.yaml",
        policies=",".join(TRAINING_POLICY_NAMES),
        seed=1,
        out=tmp_path / "out",
        throughputs=DEFAULT_GAVEL,
        deadline_share=0.3,
        round_s=360.0,
        restart_overhead_s=30.0,
        estimate_error="none",
    )
    run_training(args)
    with (tmp_path / "out" / "summary.csv").open() as fh:
        reader = csv.reader(fh)
        header = next(reader)
        body = list(reader)
    assert tuple(header) == SUMMARY_COLUMNS
    expected = (
        "policy,seed,jobs,avg_jct_h,p50_jct_h,p99_jct_h,makespan_h,deadline_met_pct,gpu_util_pct,"
        "busy_while_waiting_pct"
    )
    assert ",".join(header) == expected
    assert [r[0] for r in body] == list(TRAINING_POLICY_NAMES)
    assert all(r[2] == "3" for r in body)
    assert (tmp_path / "out" / "jct_cdf.png").stat().st_size > 0
    with (tmp_path / "out" / "bounds.csv").open() as fh:
        bounds = list(csv.DictReader(fh))
    assert [b["jobs"] for b in bounds] == ["3"]
    assert all(float(r[3]) >= float(bounds[0]["mean_best_runtime_h"]) for r in body)


def _state(i: int, remaining: float, speed: dict[str, float], on: str | None = None) -> JobState:
    job = Job(i, 0.0, 1, remaining, "t", speed)
    return JobState(job=job, remaining_s=remaining, gpu_type=on)


def test_chronotope_plan_queues_waiting_jobs_behind_each_other() -> None:
    # One V100 busy for 100 s; K80 is 10x slower. B waits for the V100 release; C
    # must plan behind B (start 230 = 100 + 30 restart + 100 run), not at 100 too.
    pol = ChronotopePolicy(round_s=360.0, restart_s=30.0)
    slow = {"k80": 0.1, "v100": 1.0}
    a, b, c = _state(0, 100, slow, "v100"), _state(1, 100, slow), _state(2, 100, slow)
    plan = pol._plan([a, b, c], set(), {"k80": 1, "v100": 1}, None)
    assert plan == {0: (0.0, "v100"), 1: (100.0, "v100"), 2: (230.0, "v100")}


def test_chronotope_backfills_idle_gpus_with_waiting_jobs() -> None:
    # B waits for the V100 but the idle K80 runs it meanwhile; A keeps its lease.
    pol = ChronotopePolicy(round_s=360.0, restart_s=30.0)
    slow = {"k80": 0.1, "v100": 1.0}
    a, b = _state(0, 100, slow, "v100"), _state(1, 200, slow)
    assert pol.allocate(0.0, [a, b], {"k80": 1, "v100": 1}) == {0: "v100", 1: "k80"}


def test_chronotope_congestion_leaves_contended_type_to_who_gains_most() -> None:
    # X is shortest and barely slower on the P100; Y and Z are 3x slower there. With
    # jobs queueing for the V100, X takes the P100 and Y the V100 (selfishly X would
    # take the V100 and Y would wait).
    cap = {"p100": 1, "v100": 1}
    x = _state(0, 100, {"p100": 0.95, "v100": 1.0})
    y = _state(1, 200, {"p100": 0.3, "v100": 1.0})
    z = _state(2, 300, {"p100": 0.3, "v100": 1.0})
    assert ChronotopePolicy(round_s=360.0).allocate(0.0, [x, y, z], cap) == {0: "p100", 1: "v100"}
    selfish = ChronotopePolicy(round_s=360.0, congestion=0.0)
    assert selfish.allocate(0.0, [x, y, z], cap) == {0: "v100", 1: "p100"}


def test_chronotope_keeps_a_lease_unless_moving_gains_a_round() -> None:
    # A runs on the P100 (0.8x) and the V100 is idle. Moving gains 1250 - 1030 =
    # 220 s < one round (360 s): A keeps its lease. Without hysteresis it moves.
    cap = {"p100": 1, "v100": 1}
    speed = {"p100": 0.8, "v100": 1.0}
    a = _state(0, 1000, speed, "p100")
    assert ChronotopePolicy(round_s=360.0).allocate(0.0, [a], cap) == {0: "p100"}
    assert ChronotopePolicy(round_s=360.0, switch_s=0.0).allocate(0.0, [a], cap) == {0: "v100"}
    # With 3000 s of work left the gain is 3750 - 3030 = 720 s > 360 s: it moves.
    long = _state(1, 3000, speed, "p100")
    assert ChronotopePolicy(round_s=360.0).allocate(0.0, [long], cap) == {1: "v100"}


def test_chronotope_hysteresis_does_not_block_shorter_jobs() -> None:
    # Hysteresis only weighs a held job's own options: B, much shorter, still takes
    # A's V100 first (SRPT order) and A is backfilled on the idle P100 meanwhile.
    cap = {"p100": 1, "v100": 1}
    slow = {"p100": 0.1, "v100": 1.0}
    a = _state(0, 1000, slow, "v100")
    b = _state(1, 100, slow)
    assert ChronotopePolicy(round_s=360.0).allocate(0.0, [a, b], cap) == {1: "v100", 0: "p100"}


def test_the_shipped_throughputs_give_the_full_files_speeds() -> None:
    full = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gavel"
    full /= "simulation_throughputs.json"
    if not full.is_file():
        pytest.skip("../shared/data is not beside the repository")
    types = ["k80", "p100", "v100"]
    assert load_gavel_speeds(DEFAULT_GAVEL, types) == load_gavel_speeds(full, types)


def test_chronotope_orders_a_held_job_by_its_remaining_work_alone() -> None:
    # No lease discount in the order: B (900 s) goes before A (1000 s, running), which
    # finishes both sooner (930 + 1960 s against 1000 + 1930 s); a 0.8 discount kept A.
    a = _state(0, 1000, {"v100": 1.0}, "v100")
    b = _state(1, 900, {"v100": 1.0})
    assert ChronotopePolicy(round_s=360.0).allocate(0.0, [a, b], {"v100": 1}) == {1: "v100"}
    discounted = ChronotopePolicy(round_s=360.0, lease_discount=0.8)
    assert discounted.allocate(0.0, [a, b], {"v100": 1}) == {0: "v100"}


def test_chronotope_backfill_keeps_a_waiting_job_on_the_type_it_holds() -> None:
    # J waits for the V100 (X holds it for 100 s more) and is backfilled meanwhile on an
    # idle type, a or b, equally fast: it stays on b, which it holds (no restart)
    speed = {"a": 0.5, "b": 0.5, "v100": 1.0}
    x = _state(0, 100, speed, "v100")
    j = _state(1, 1000, speed, "b")
    cap = {"a": 1, "b": 1, "v100": 1}
    assert ChronotopePolicy(round_s=360.0).allocate(0.0, [x, j], cap) == {0: "v100", 1: "b"}
    loose = ChronotopePolicy(round_s=360.0, backfill_keep=1.0)
    assert loose.allocate(0.0, [x, j], cap) == {0: "v100", 1: "a"}
