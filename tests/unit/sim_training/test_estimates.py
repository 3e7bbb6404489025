"""Noisy duration estimates: the policy plans with estimates corrected online, never the truth."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from chronotope.sim.training.engine import EngineSettings, simulate
from chronotope.sim.training.policies import TRAINING_POLICY_NAMES, make_training_policy
from chronotope.sim.training.workload import (
    TraceRow,
    WorkloadSettings,
    build_jobs,
    parse_estimate_error,
    parse_time,
)
from chronotope.workloads.training_policy import ChronotopePolicy, Job, JobState

SPEED = {"v100": 1.0}
ROOT = Path(__file__).resolve().parents[3]


def _state(work: float, estimate: float | None, done: float) -> JobState:
    job = Job(0, 0.0, 1, work, "t", dict(SPEED), None, estimate)
    return JobState(job=job, remaining_s=work - done)


def test_exact_jobs_plan_with_the_truth() -> None:
    assert _state(100, None, 30).estimated_remaining_s() == 70


def test_estimate_minus_progress_until_overrun_then_doubling() -> None:
    # true 1000 s, estimated 100 s: the policy believes 60 s left after 40 s of work
    assert _state(1000, 100, 40).estimated_remaining_s() == 60
    # past its estimate: as much again as it has done (not "nearly finished" forever)
    assert _state(1000, 100, 300).estimated_remaining_s() == 300
    # overestimated: the estimate minus the work done, even near the true end
    assert _state(100, 1000, 90).estimated_remaining_s() == 910


def test_policy_never_reads_the_truth_of_an_estimated_job() -> None:
    # two jobs, one GPU: the one *believed* shorter goes first, though it is longer
    cap = {"v100": 1}
    long_believed_short = Job(0, 0.0, 1, 5000.0, "t", dict(SPEED), None, 100.0)
    short_believed_long = Job(1, 0.0, 1, 200.0, "t", dict(SPEED), None, 4000.0)
    policy = ChronotopePolicy(round_s=360.0, restart_s=0.0)
    pair = (long_believed_short, short_believed_long)
    states = [JobState(job=j, remaining_s=j.work_s) for j in pair]
    assert policy.allocate(0.0, states, cap) == {0: "v100"}
    # with exact estimates, SRPT runs the truly short job first
    exact = [JobState(job=Job(j.job_id, 0.0, 1, j.work_s, "t", dict(SPEED)), remaining_s=j.work_s)
             for j in pair]  # fmt: skip
    assert policy.allocate(0.0, exact, cap) == {1: "v100"}


def test_an_underestimated_job_yields_once_it_overruns() -> None:
    # job 0 claims 100 s but needs 5000 s; job 1 (200 s, estimated right) arrives at 50 s
    cap = {"v100": 1}
    jobs = [
        Job(0, 0.0, 1, 5000.0, "t", dict(SPEED), None, 100.0),
        Job(1, 50.0, 1, 200.0, "t", dict(SPEED), None, 200.0),
    ]
    res = simulate(
        jobs,
        cap,
        ChronotopePolicy(round_s=100.0, restart_s=0.0, switch_s=0.0),
        EngineSettings(round_s=100.0, restart_overhead_s=0.0),
    )
    # Job 0 overruns its estimate at 100 s; from then on it is believed to need as much
    # again as it has done, which outgrows job 1's 200 s within a few rounds: job 1 takes
    # the GPU and finishes first, and job 0 still gets all its true work done.
    assert res.finish_s[1] < res.finish_s[0]
    assert res.finish_s[0] == pytest.approx(5200.0)


def _deadline_and_small_jobs(deadline_s: float) -> list[JobState]:
    """Job 0: one GPU, estimated 10 h, due at `deadline_s`; jobs 1-5: estimated 1.5 h each."""
    hour = 3600.0
    jobs = [Job(0, 0.0, 1, 10 * hour, "t", dict(SPEED), deadline_s, 10 * hour)]
    jobs += [Job(i, 0.0, 1, 1.5 * hour, "t", dict(SPEED), None, 1.5 * hour) for i in range(1, 6)]
    return [JobState(job=j, remaining_s=j.work_s) for j in jobs]


def test_a_deadline_job_with_room_lets_a_bounded_amount_of_small_work_through() -> None:
    cap = {"v100": 3}
    roomy = _deadline_and_small_jobs(30 * 3600.0)
    # the small jobs' keys (1.5 h) are below 0.2 x its 10 h; a budget of 0.3 x 10 h
    # lets two of them (3 h in all) go first, then the deadline job takes the third GPU
    budgeted = ChronotopePolicy(round_s=360.0, restart_s=0.0, yield_budget=0.3)
    assert budgeted.allocate(0.0, roomy, cap) == {1: "v100", 2: "v100", 0: "v100"}
    # without the yield (earliest deadline first for every deadline job), it goes first
    edf = ChronotopePolicy(round_s=360.0, restart_s=0.0, yield_below=0.0)
    assert edf.allocate(0.0, roomy, cap) == {0: "v100", 1: "v100", 2: "v100"}
    assert 0 in edf.allocate(0.0, roomy, {"v100": 1})
    # the default budget (4 x its key) lets all five through on one GPU
    assert ChronotopePolicy(round_s=360.0, restart_s=0.0).allocate(0.0, roomy, {"v100": 1}) == {
        1: "v100"
    }


def test_a_deadline_job_without_room_on_its_optimistic_estimate_goes_first() -> None:
    # due in 9 h, estimated 10 h: no laxity even if the estimate were right
    tight = _deadline_and_small_jobs(9 * 3600.0)
    assert ChronotopePolicy(round_s=360.0, restart_s=0.0).allocate(0.0, tight, {"v100": 1}) == {
        0: "v100"
    }
    # learned errors: finished jobs ran 0.5x their estimates, so the optimistic total is
    # 5 h and a 9 h deadline leaves room: the small jobs go first again
    optimistic = ChronotopePolicy(round_s=360.0, restart_s=0.0, errors=[0.5] * 10)
    assert optimistic.allocate(0.0, tight, {"v100": 1}) == {1: "v100"}


def _rows() -> list[TraceRow]:
    return [TraceRow(submit_s=i * 60.0, duration_s=600.0 + i * 97, num_gpus=1) for i in range(200)]


def test_noise_is_lognormal_seeded_and_leaves_everything_else_alone() -> None:
    speeds = {"a": {"v100": 1.0, "k80": 0.4}, "b": {"v100": 1.0, "k80": 0.8}}
    exact = build_jobs(_rows(), speeds, 4, WorkloadSettings(), seed=3)
    noisy = build_jobs(_rows(), speeds, 4, WorkloadSettings(estimate_sigma=1.0), seed=3)
    again = build_jobs(_rows(), speeds, 4, WorkloadSettings(estimate_sigma=1.0), seed=3)
    assert all(j.estimate_s is None for j in exact)
    assert [j.estimate_s for j in noisy] == [j.estimate_s for j in again]
    for e, n in zip(exact, noisy, strict=True):
        assert (e.job_type, e.deadline_s, e.work_s, e.arrival_s) == (
            n.job_type,
            n.deadline_s,
            n.work_s,
            n.arrival_s,
        )
    logs = [math.log(j.estimated_work_s() / j.work_s) for j in noisy]
    assert abs(statistics.mean(logs)) < 0.25
    assert 0.8 < statistics.stdev(logs) < 1.2


@pytest.mark.parametrize("name", TRAINING_POLICY_NAMES)
def test_every_policy_finishes_every_job_with_noisy_estimates(name: str) -> None:
    speeds = {"a": {"v100": 1.0, "k80": 0.4}, "b": {"v100": 1.0, "k80": 0.8}}
    jobs = build_jobs(
        _rows()[:60], speeds, 4, WorkloadSettings(estimate_sigma=1.0, deadline_share=0.3), seed=1
    )
    res = simulate(jobs, {"v100": 4, "k80": 4}, make_training_policy(name, 360.0), EngineSettings())
    assert set(res.finish_s) == {j.job_id for j in jobs}
    for j in jobs:
        # nobody finishes faster than the true work allows
        assert res.finish_s[j.job_id] >= j.arrival_s + j.best_runtime_s() - 1e-6


def test_dates_timestamps_and_bad_arguments() -> None:
    assert parse_time("2017-11-06") == parse_time("2017-11-06 00:00:00")
    assert parse_time("2017-11-06T08:30") == parse_time("2017-11-06 08:30:00")
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        parse_time("06/11/2017")
    assert parse_estimate_error("lognormal:0.5") == 0.5
    assert parse_estimate_error("none") == 0.0
    for bad in ("lognormal", "lognormal:-1", "gauss:1", "lognormal:x"):
        with pytest.raises(ValueError, match="lognormal:SIGMA"):
            parse_estimate_error(bad)


def test_the_cli_answers_a_bad_argument_with_one_line(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "chronotope", "simulate", "training", "--out", str(tmp_path)]
    cluster = ["--cluster", str(ROOT / "manifests" / "clusters" / "gavel-96.yaml")]
    for extra, needle in (
        (["--start", "2017-13-40", "--end", "2017-11-07"], "not a date or timestamp"),
        (["--start", "2017-11-07", "--end", "2017-11-06"], "is not after"),
        (["--start", "2017-11-06", "--end", "2017-11-07", "--estimate-error", "x"], "lognormal"),
    ):
        out = subprocess.run([*base, *cluster, *extra], capture_output=True, text=True, check=False)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert needle in lines[0]


@pytest.mark.parametrize("name", [n for n in TRAINING_POLICY_NAMES if n != "chronotope"])
def test_baselines_do_not_read_estimates(name: str) -> None:
    speeds = {"a": {"v100": 1.0, "k80": 0.4}, "b": {"v100": 1.0, "k80": 0.8}}
    results = []
    for sigma in (0.0, 1.0):
        jobs = build_jobs(
            _rows()[:60], speeds, 4, WorkloadSettings(estimate_sigma=sigma, deadline_share=0.3), 1
        )
        res = simulate(
            jobs, {"v100": 4, "k80": 4}, make_training_policy(name, 360.0), EngineSettings()
        )
        results.append(res.finish_s)
    assert results[0] == results[1]
