"""Per-queue figures of a simulated run with Queues: JCT, GPU-hours, borrowing, fairness.

Why: the goal of queues is measured per team (no queue below 0.9 of its
nominal share while it has demand) and across teams (Jain's index of GPU
share over weight); these numbers come from the wrapper's decision trace
(`queues.QuotaPolicy.trace`), where each decision's allocation holds until
the next decision (the engine decides again at every arrival, finish and
round), and the last one until the last job finishes. Pure.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from chronotope.sim.training.engine import SimResult
from chronotope.sim.training.queues import QueueSetup, Snapshot
from chronotope.workloads.training_policy import Job

__all__ = ["QUEUE_COLUMNS", "jain", "queue_rows", "write_queue_rows"]

QUEUE_COLUMNS = (
    "policy",
    "seed",
    "queue",
    "jobs",
    "avg_jct_h",
    "gpu_hours",
    "borrowed_gpu_hours",
    "used_share",
    "nominal_share",
    "weight",
    "demand_h",
    "share_attainment",
    "jain",
    "gpu_util_pct",
    "gpu_util_no_queues_pct",
    "busy_while_waiting_pct",
    "busy_while_waiting_no_queues_pct",
)


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one has all."""
    square = sum(x * x for x in values)
    return sum(values) ** 2 / (len(values) * square) if square > 0 else 1.0


def queue_rows(
    jobs: Sequence[Job],
    job_queue: Mapping[int, str],
    result: SimResult,
    *,
    trace: Sequence[Snapshot],
    setup: QueueSetup,
    capacity: Mapping[str, int],
) -> list[dict[str, object]]:
    """One row per queue (run-level columns `jain`, `seed`, utilisation left to the caller).

    - `used_share`: the queue's GPU-time over everyone's; `nominal_share`: its nominal GPUs
      over all queues' nominal GPUs.
    - `share_attainment`: GPU-time held while it had demand over the GPU-time it was owed
      then, the integral of min(nominal GPUs, GPUs its active jobs want); the goal is >= 0.9.
    - `jain` (same on every row): Jain's index over queues of (GPU-time held while it had
      demand / cluster GPU-time over that time) / weight.
    """
    names = sorted(setup.specs)
    end = max(result.finish_s.values())
    total_gpus = sum(capacity.values())
    used_s = dict.fromkeys(names, 0.0)
    borrowed_s = dict.fromkeys(names, 0.0)
    demand_s = dict.fromkeys(names, 0.0)
    owed_s = dict.fromkeys(names, 0.0)
    used_in_demand_s = dict.fromkeys(names, 0.0)
    nominal = {n: {q.gpu_type: q.gpus for q in setup.specs[n].quotas} for n in names}
    for i, snap in enumerate(trace):
        nxt = trace[i + 1].at_s if i + 1 < len(trace) else end
        dt = max(0.0, nxt - snap.at_s)
        for n in names:
            held = {g: k for (q, g), k in snap.used.items() if q == n}
            used = sum(held.values())
            used_s[n] += used * dt
            borrowed_s[n] += sum(max(0, k - nominal[n].get(g, 0)) for g, k in held.items()) * dt
            want = snap.demand.get(n, 0)
            if want > 0:
                demand_s[n] += dt
                owed_s[n] += min(sum(nominal[n].values()), want) * dt
                used_in_demand_s[n] += used * dt
    all_used = sum(used_s.values())
    all_nominal = sum(sum(v.values()) for v in nominal.values())
    share = {
        n: used_in_demand_s[n] / (total_gpus * demand_s[n]) / setup.specs[n].weight
        for n in names
        if demand_s[n] > 0
    }
    index = jain(list(share.values()))
    rows: list[dict[str, object]] = []
    for n in names:
        mine = [j for j in jobs if job_queue[j.job_id] == n]
        jct = [(result.finish_s[j.job_id] - j.arrival_s) / 3600 for j in mine]
        rows.append(
            {
                "policy": result.policy,
                "queue": n,
                "jobs": len(mine),
                "avg_jct_h": round(sum(jct) / len(jct), 4) if jct else 0.0,
                "gpu_hours": round(used_s[n] / 3600, 2),
                "borrowed_gpu_hours": round(borrowed_s[n] / 3600, 2),
                "used_share": round(used_s[n] / all_used, 4) if all_used else 0.0,
                "nominal_share": round(sum(nominal[n].values()) / all_nominal, 4)
                if all_nominal
                else 0.0,
                "weight": setup.specs[n].weight,
                "demand_h": round(demand_s[n] / 3600, 3),
                "share_attainment": round(used_in_demand_s[n] / owed_s[n], 4)
                if owed_s[n] > 0
                else 1.0,
                "jain": round(index, 4),
            }
        )
    return rows


def write_queue_rows(rows: Sequence[Mapping[str, object]], path: Path) -> None:
    """Write the per-queue rows to `path` as CSV with `QUEUE_COLUMNS`."""
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=QUEUE_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
