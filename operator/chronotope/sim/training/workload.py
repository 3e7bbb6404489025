"""Turn a Philly trace window into simulated jobs with Gavel job types.

Philly (`timestamp,duration,num_gpus,gpu_time,cluster`) gives arrivals, gang
sizes and durations but no GPU type. As in Gavel's simulator, each job is given
a job type drawn uniformly (seeded) from the 26 single-worker (model, batch
size) types in `simulation_throughputs.json`, and its Philly duration is read as
its run time on a V100 (Gavel's reference worker type). Its speed on another
type is the ratio of isolated throughputs, `thr[type][job] / thr[v100][job]`.

A documented share of jobs (default 30 %, seeded) gets a deadline
`arrival + slack * isolated run time on its fastest type`, slack uniform in
[`slack_lo`, `slack_hi`]. Gang sizes above the largest single-type pool are
clamped to it, and durations below one minute are raised to one minute.

Estimates: with `estimate_sigma` > 0 each job also carries its owner's estimate
of its run time, `duration * exp(N(0, sigma))`, drawn from a generator of its own
(seeded by the seed), so job types, deadlines and arrivals are the same at every
sigma. Sigma 0 means exact estimates (the policy sees the true duration).
"""

from __future__ import annotations

import ast
import csv
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from chronotope.sim.clusterspec import load_spec
from chronotope.workloads.training_policy import Job

__all__ = [
    "REFERENCE_TYPE",
    "TABLE_WINDOWS",
    "TraceRow",
    "WorkloadSettings",
    "build_jobs",
    "capacity_from_spec",
    "load_gavel_speeds",
    "load_training_cluster",
    "parse_estimate_error",
    "parse_time",
    "read_philly_window",
]

REFERENCE_TYPE = "v100"

TABLE_WINDOWS = (
    ("2017-10-20 08:00:00", "2017-10-20 10:00:00"),
    ("2017-10-05 08:00:00", "2017-10-05 11:00:00"),
    ("2017-10-17 06:00:00", "2017-10-17 09:00:00"),
    ("2017-10-23 05:00:00", "2017-10-23 08:00:00"),
    ("2017-10-13 05:00:00", "2017-10-13 07:00:00"),
    ("2017-11-13 03:00:00", "2017-11-13 05:00:00"),
    ("2017-12-08 03:00:00", "2017-12-08 05:00:00"),
    ("2017-11-28 17:00:00", "2017-11-28 20:00:00"),
)
"""The Philly windows of docs/training-sim.md's tables (busy and overloaded days)."""
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class TraceRow:
    """One Philly job: seconds since the window start, duration (s), GPUs."""

    submit_s: float
    duration_s: float
    num_gpus: int


class WorkloadSettings(BaseModel):
    """How trace rows become jobs. Passed explicitly."""

    model_config = ConfigDict(frozen=True)

    deadline_share: float = Field(default=0.3, ge=0, le=1)
    slack_lo: float = Field(default=1.5, ge=1)
    slack_hi: float = Field(default=4.0, ge=1)
    min_duration_s: float = Field(default=60.0, ge=1)
    estimate_sigma: float = Field(
        default=0.0, ge=0, le=5, description="lognormal error of the owners' duration estimates"
    )


def parse_time(text: str) -> datetime:
    """A Philly timestamp ('2017-10-09 06:00:00', 'T' separator accepted) or a date (midnight).

    ValueError (naming the expected forms) for anything else.
    """
    cleaned = text.strip().replace("T", " ")
    for fmt in (TIME_FORMAT, "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(cleaned, fmt)
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a date or timestamp (YYYY-MM-DD or YYYY-MM-DD HH:MM:SS)")


def parse_estimate_error(text: str) -> float:
    """`lognormal:SIGMA` (or `none`) -> sigma; ValueError naming the expected form."""
    if text.strip().lower() in ("none", "exact", "0"):
        return 0.0
    kind, sep, value = text.partition(":")
    try:
        sigma = float(value)
    except ValueError:
        sigma = math.nan
    if kind.strip().lower() != "lognormal" or not sep or not 0 <= sigma <= 5:  # noqa: PLR2004
        raise ValueError(f"{text!r}: expected lognormal:SIGMA with 0 <= SIGMA <= 5, or none")
    return sigma


def read_philly_window(path: Path, start: str, end: str) -> list[TraceRow]:
    """Jobs submitted in [start, end), sorted by submit time (ties: file order)."""
    lo, hi = parse_time(start), parse_time(end)
    rows: list[tuple[datetime, int, TraceRow]] = []
    with path.open(newline="") as fh:
        for i, rec in enumerate(csv.DictReader(fh)):
            ts = parse_time(rec["timestamp"])
            if lo <= ts < hi:
                row = TraceRow(
                    submit_s=(ts - lo).total_seconds(),
                    duration_s=float(rec["duration"]),
                    num_gpus=max(1, int(float(rec["num_gpus"]))),
                )
                rows.append((ts, i, row))
    rows.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in rows]


def load_gavel_speeds(path: Path, gpu_types: list[str]) -> dict[str, dict[str, float]]:
    """Throughput per job type and GPU type, alone on one worker, relative to a V100."""
    raw = json.loads(path.read_text())
    speeds: dict[str, dict[str, float]] = {}
    for key, entry in raw[REFERENCE_TYPE].items():
        name, scale = ast.literal_eval(key)
        if scale != 1:
            continue
        ref = float(entry["null"])
        speeds[name] = {g: float(raw[g][key]["null"]) / ref for g in gpu_types}
    return dict(sorted(speeds.items()))


def load_training_cluster(
    spec_path: Path, throughputs: Path
) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """A cluster spec's GPUs per Gavel type, and Gavel's speeds per job type on those types."""
    spec = load_spec(spec_path)
    capacity = capacity_from_spec(
        [(p.gpu.model, p.count * p.gpu.per_node) for p in spec.pools if p.gpu is not None]
    )
    return capacity, load_gavel_speeds(throughputs, list(capacity))


def build_jobs(
    rows: list[TraceRow],
    speeds: Mapping[str, Mapping[str, float]],
    max_gang: int,
    settings: WorkloadSettings,
    seed: int,
) -> list[Job]:
    """Seeded job types and deadlines for trace rows."""
    rng = random.Random(seed)
    noise = random.Random(f"estimate-{seed}")
    types = sorted(speeds)
    jobs = []
    for i, row in enumerate(rows):
        job_type = rng.choice(types)
        speed = dict(speeds[job_type])
        work = max(row.duration_s, settings.min_duration_s)
        has_deadline = rng.random() < settings.deadline_share
        slack = rng.uniform(settings.slack_lo, settings.slack_hi)
        deadline = None
        if has_deadline:
            deadline = row.submit_s + slack * work / max(speed.values())
        estimate = None
        if settings.estimate_sigma > 0:
            estimate = work * math.exp(noise.gauss(0.0, settings.estimate_sigma))
        jobs.append(
            Job(
                job_id=i,
                arrival_s=row.submit_s,
                num_gpus=min(row.num_gpus, max_gang),
                work_s=work,
                job_type=job_type,
                speed=speed,
                deadline_s=deadline,
                estimate_s=estimate,
            )
        )
    return jobs


def capacity_from_spec(pools: list[tuple[str, int]]) -> dict[str, int]:
    """(GPU model, GPUs) per pool -> GPUs per Gavel type (k80/p100/v100 by name)."""
    cap: dict[str, int] = {}
    for model, gpus in pools:
        low = model.lower()
        match = [g for g in ("k80", "p100", "v100") if g in low]
        if not match:
            raise ValueError(f"GPU model {model!r} has no Gavel throughputs (k80, p100, v100)")
        cap[match[0]] = cap.get(match[0], 0) + gpus
    return cap
