"""Figures of one simulated run: the summary row and the JCT CDF plot."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from chronotope.sim.training.engine import SimResult
from chronotope.workloads.training_policy import Job

__all__ = [
    "SUMMARY_COLUMNS",
    "jcts_h",
    "mean_best_runtime_h",
    "plot_jct_cdf",
    "summary_row",
    "write_bounds",
    "write_summary",
]

SUMMARY_COLUMNS = (
    "policy",
    "seed",
    "jobs",
    "avg_jct_h",
    "p50_jct_h",
    "p99_jct_h",
    "makespan_h",
    "deadline_met_pct",
    "gpu_util_pct",
    "busy_while_waiting_pct",
)


def jcts_h(jobs: Sequence[Job], result: SimResult) -> list[float]:
    """Each job's completion time (finish minus arrival), in hours, in the order of `jobs`."""
    return [(result.finish_s[j.job_id] - j.arrival_s) / 3600 for j in jobs]


def mean_best_runtime_h(jobs: Sequence[Job]) -> float:
    """Mean isolated run time on each job's fastest type: no policy's average JCT is below it.

    Each job's JCT is at least its run time alone on its best GPU type, so the mean of
    those is a lower bound on any policy's `avg_jct_h` (queueing and restarts only add).
    """
    return sum(j.best_runtime_s() for j in jobs) / len(jobs) / 3600 if jobs else 0.0


def write_bounds(jobs: Sequence[Job], seed: int, path: Path) -> float:
    """DIR/bounds.csv: `seed,jobs,mean_best_runtime_h` (kept out of summary.csv)."""
    bound = mean_best_runtime_h(jobs)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(("seed", "jobs", "mean_best_runtime_h"))
        writer.writerow((seed, len(jobs), round(bound, 4)))
    return bound


def summary_row(
    jobs: Sequence[Job], result: SimResult, capacity: Mapping[str, int], seed: int
) -> dict[str, object]:
    """Makespan and utilisation run from the first arrival to the last completion.

    `busy_while_waiting_pct`: the share of GPUs busy over the time some arrived job
    was not running (100 when none ever waited): GPUs a policy or a quota leaves
    idle while work waits lower it; the makespan and slower GPU types do not.
    """
    jct = np.array(jcts_h(jobs, result))
    first = min(j.arrival_s for j in jobs)
    span_s = max(result.finish_s.values()) - first
    with_deadline = [j for j in jobs if j.deadline_s is not None]
    met = sum(result.finish_s[j.job_id] <= (j.deadline_s or 0.0) + 1e-6 for j in with_deadline)
    total = sum(capacity.values())
    util = result.busy_gpu_s / (total * span_s) * 100 if span_s > 0 else 0.0
    waiting = result.waiting_s
    busy_waiting = result.busy_waiting_gpu_s / (total * waiting) * 100 if waiting > 0 else 100.0
    return {
        "policy": result.policy,
        "seed": seed,
        "jobs": len(jobs),
        "avg_jct_h": round(float(jct.mean()), 4),
        "p50_jct_h": round(float(np.percentile(jct, 50)), 4),
        "p99_jct_h": round(float(np.percentile(jct, 99)), 4),
        "makespan_h": round(span_s / 3600, 4),
        "deadline_met_pct": round(100.0 * met / len(with_deadline), 2) if with_deadline else 100.0,
        "gpu_util_pct": round(util, 2),
        "busy_while_waiting_pct": round(busy_waiting, 2),
    }


def write_summary(rows: Sequence[Mapping[str, object]], path: Path) -> None:
    """Write the summary rows to `path` as CSV with `SUMMARY_COLUMNS`."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def plot_jct_cdf(curves: Mapping[str, Sequence[float]], path: Path, title: str) -> None:
    """Plot the CDF of each policy's job completion times (log time axis) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in curves.items():
        xs = np.sort(np.asarray(values))
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
