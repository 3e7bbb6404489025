"""The queueing LP bound: hand-checked cases, and never above what a policy really reaches."""

from __future__ import annotations

import pytest

from chronotope.sim.training.bounds import BoundSettings, queueing_bound_h
from chronotope.sim.training.engine import EngineSettings, simulate
from chronotope.sim.training.policies import TRAINING_POLICY_NAMES, make_training_policy
from chronotope.sim.training.report import mean_best_runtime_h, summary_row
from chronotope.sim.training.workload import TraceRow, WorkloadSettings, build_jobs
from chronotope.workloads.training_policy import Job

HOUR = 3600.0


def _one_hour(i: int, speed: dict[str, float] | None = None) -> Job:
    return Job(i, 0.0, 1, HOUR, "t", speed or {"v100": 1.0})


def test_four_one_hour_jobs_on_one_gpu_queue_behind_each_other() -> None:
    # best possible: 1, 2, 3, 4 h (mean 2.5 h); alone each takes 1 h
    jobs = [_one_hour(i) for i in range(4)]
    bound = queueing_bound_h(jobs, {"v100": 1})
    assert mean_best_runtime_h(jobs) == 1.0
    # a slot's work counts at its start: at most one slot (5 min) below the optimum
    assert 2.5 - 300 / HOUR <= bound <= 2.5


def test_a_slower_type_counts_at_its_speed() -> None:
    # one V100 and one K80 at half speed. Best with free moves between types: A on the
    # V100 for 1 h; B on the K80 meanwhile (half its work), then on the V100 for 0.5 h:
    # a mean of 1.25 h. Two V100s give 1 h. The LP is between (it spreads B's work).
    speed = {"v100": 1.0, "k80": 0.5}
    jobs = [_one_hour(0, speed), _one_hour(1, speed)]
    bound = queueing_bound_h(jobs, {"v100": 1, "k80": 1})
    assert 1.05 < bound <= 1.25
    assert queueing_bound_h(jobs, {"v100": 2}) == pytest.approx(1.0)


def test_a_finer_grid_gives_a_bound_at_least_as_tight() -> None:
    jobs = [_one_hour(i) for i in range(3)]
    coarse = queueing_bound_h(jobs, {"v100": 1}, BoundSettings(slot_s=1200))
    fine = queueing_bound_h(jobs, {"v100": 1}, BoundSettings(slot_s=300))
    assert coarse <= fine <= 2.0


def test_no_policy_beats_the_bound_and_it_is_above_the_isolated_one() -> None:
    rows = [
        TraceRow(submit_s=i * 60.0, duration_s=600 + (i * 7919 % 5400), num_gpus=1 << (i % 3))
        for i in range(40)
    ]
    speeds = {
        "a": {"k80": 0.2, "p100": 0.6, "v100": 1.0},
        "b": {"k80": 0.7, "p100": 0.9, "v100": 1.0},
    }
    jobs = build_jobs(rows, speeds, 4, WorkloadSettings(), 3)
    cap = {"k80": 4, "p100": 2, "v100": 2}
    bound = queueing_bound_h(jobs, cap, BoundSettings(slot_s=120))
    assert bound > mean_best_runtime_h(jobs) * 1.2  # 40 jobs on 8 GPUs queue
    engine = EngineSettings()
    for name in TRAINING_POLICY_NAMES:
        result = simulate(jobs, cap, make_training_policy(name, engine.round_s), engine)
        assert float(summary_row(jobs, result, cap, 3)["avg_jct_h"]) >= bound, name  # type: ignore[arg-type]


def test_a_grid_that_cannot_cover_time_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        BoundSettings(slot_s=0)
