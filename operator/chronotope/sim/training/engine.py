"""Event-driven engine for the training simulator.

Time jumps to the next arrival, completion or (for preemptive policies) round
boundary; at each of these the policy returns the whole allocation (job -> GPU
type, gang of `num_gpus` GPUs of one type). A job that starts, resumes or
changes GPU type pays `restart_overhead_s` of checkpoint-restart before making
progress again; a job that keeps its type across rounds keeps its lease and
pays nothing. The engine checks every allocation against capacity and raises on
over-allocation (a policy bug, a real fault). Pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from chronotope.workloads.training_policy import LEASE_S, Job, JobState, TrainingPolicy

__all__ = ["EngineSettings", "SimResult", "simulate"]

EPS = 1e-6


class EngineSettings(BaseModel):
    """How the engine runs: the lease round of preemptive policies and the restart cost."""

    model_config = ConfigDict(frozen=True)

    round_s: float = Field(default=LEASE_S, gt=0, description="lease length of preemptive policies")
    restart_overhead_s: float = Field(default=30.0, ge=0)


@dataclass(frozen=True)
class SimResult:
    """One policy's run: each job's finish time, busy GPU-seconds, peak use per type, decisions."""

    policy: str
    finish_s: dict[int, float]
    busy_gpu_s: float
    peak_usage: dict[str, int]
    decisions: int
    waiting_s: float = 0.0
    """Time during which some arrived job was not running (waiting or preempted)."""
    busy_waiting_gpu_s: float = 0.0
    """GPU-seconds busy during that time: capacity quotas or policies leave idle show here."""


def _enact(
    alloc: Mapping[int, str],
    states: Mapping[int, JobState],
    active: Sequence[JobState],
    capacity: Mapping[str, int],
    peak: dict[str, int],
    *,
    policy: TrainingPolicy,
    settings: EngineSettings,
) -> None:
    """Apply one allocation: check capacity, track the peak, charge restarts on a move."""
    usage = dict.fromkeys(capacity, 0)
    for job_id, gpu_type in alloc.items():
        usage[gpu_type] += states[job_id].job.num_gpus
    for g, used in usage.items():
        if used > capacity[g]:
            raise RuntimeError(f"{policy.name} over-allocated {g}: {used} > {capacity[g]}")
        peak[g] = max(peak[g], used)
    for js in active:
        new = alloc.get(js.job.job_id)
        if new is not None and new != js.gpu_type:
            js.overhead_left_s = settings.restart_overhead_s
        js.gpu_type = new


def _horizon(
    now: float,
    next_arrival: float | None,
    running: Sequence[JobState],
    active: Sequence[JobState],
    *,
    policy: TrainingPolicy,
    settings: EngineSettings,
) -> float:
    """Time to the next event: an arrival, a finish, or (preemptive policies) a round end."""
    horizon = math.inf
    if next_arrival is not None:
        horizon = next_arrival - now
    for js in running:
        speed = js.job.speed[js.gpu_type]  # type: ignore[index]
        horizon = min(horizon, js.overhead_left_s + js.remaining_s / speed)
    if policy.preemptive and active:
        horizon = min(
            horizon, (math.floor(now / settings.round_s + EPS) + 1) * settings.round_s - now
        )
    if not math.isfinite(horizon):
        raise RuntimeError(f"{policy.name} left {len(active)} jobs waiting on an idle cluster")
    return max(horizon, 0.0)


def _advance(running: Sequence[JobState], dt: float, busy: float) -> float:
    """Run the running jobs for `dt` seconds (restart overhead first); returns GPU-seconds busy."""
    for js in running:
        gpu = js.gpu_type
        assert gpu is not None
        busy += js.job.num_gpus * dt
        js.attained_gpu_s += js.job.num_gpus * dt
        js.received_s[gpu] = js.received_s.get(gpu, 0.0) + dt
        work_dt = max(0.0, dt - js.overhead_left_s)
        js.overhead_left_s = max(0.0, js.overhead_left_s - dt)
        js.remaining_s -= work_dt * js.job.speed[gpu]
    return busy


def simulate(
    jobs: Sequence[Job],
    capacity: Mapping[str, int],
    policy: TrainingPolicy,
    settings: EngineSettings,
    on_progress: object = None,
) -> SimResult:
    """Run `jobs` to completion under `policy`. `on_progress(n)` is called per finish."""
    for j in jobs:
        if j.num_gpus > max(capacity.values()):
            raise ValueError(f"job {j.job_id} needs {j.num_gpus} GPUs of one type; none has")
    pending = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
    states: dict[int, JobState] = {}
    active: list[JobState] = []
    finish: dict[int, float] = {}
    peak = dict.fromkeys(capacity, 0)
    busy, now, nxt, decisions = 0.0, 0.0, 0, 0
    waiting_s, busy_waiting = 0.0, 0.0
    if pending:
        now = pending[0].arrival_s
    while len(finish) < len(jobs):
        while nxt < len(pending) and pending[nxt].arrival_s <= now + EPS:
            js = JobState(job=pending[nxt], remaining_s=pending[nxt].work_s)
            states[js.job.job_id] = js
            active.append(js)
            nxt += 1
        alloc = policy.allocate(now, active, capacity)
        decisions += 1
        _enact(alloc, states, active, capacity, peak, policy=policy, settings=settings)
        running = [js for js in active if js.gpu_type is not None]
        arrival = pending[nxt].arrival_s if nxt < len(pending) else None
        dt = _horizon(now, arrival, running, active, policy=policy, settings=settings)
        if len(running) < len(active):
            waiting_s += dt
            busy_waiting += dt * sum(js.job.num_gpus for js in running)
        busy = _advance(running, dt, busy)
        now += dt
        done = [js for js in active if js.remaining_s <= EPS * max(1.0, js.job.work_s)]
        for js in done:
            js.finish_s = now
            js.gpu_type = None
            finish[js.job.job_id] = now
            if callable(on_progress):
                on_progress(1)
        if done:
            active = [js for js in active if js.finish_s is None]
    return SimResult(policy.name, finish, busy, peak, decisions, waiting_s, busy_waiting)
