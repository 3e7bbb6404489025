"""Which training goals the queueing bound allows (issue: honest estimates; docs/training-sim.md).

Usage: python bench/training_bound.py [OUT_DIR] [--seeds 0,1] [--windows N] [--skip K]
                                     [--slot-s 300]

For each Philly window of bench/training_estimates.py and each seed, on gavel-96:
the mean isolated best run time (`report.mean_best_runtime_h`), the LP bound that
also counts the cluster's capacity (`sim.training.bounds.queueing_bound_h`), and
FIFO's and Gavel's average JCT (run here). A goal of "ours <= fifo / 2" is
possible only if the bound is at most fifo / 2 (likewise gavel / 1.3): the last
two columns say which. Writes OUT_DIR/bounds.csv (default out/training-bound).
The LP of an overloaded window takes minutes (GLOP, one core).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from chronotope.paths import REPO_ROOT, data_file
from chronotope.sim.runner import write_rows
from chronotope.sim.training.bounds import BoundSettings, queueing_bound_h
from chronotope.sim.training.engine import EngineSettings, simulate
from chronotope.sim.training.policies import make_training_policy
from chronotope.sim.training.report import mean_best_runtime_h, summary_row
from chronotope.sim.training.workload import (
    TABLE_WINDOWS,
    WorkloadSettings,
    build_jobs,
    load_training_cluster,
    read_philly_window,
)

WINDOWS = TABLE_WINDOWS


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", type=Path, default=REPO_ROOT / "out" / "training-bound")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--windows", type=int, default=len(WINDOWS), help="first N windows")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first K of those")
    ap.add_argument("--slot-s", type=float, default=300.0, help="the LP's fine slot length")
    args = ap.parse_args()
    cap, speeds = load_training_cluster(
        REPO_ROOT / "manifests" / "clusters" / "gavel-96.yaml",
        data_file("gavel", "isolated_throughputs.json"),
    )
    engine = EngineSettings()
    settings = BoundSettings(slot_s=args.slot_s)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    print("| window | seed | jobs | lb | LP bound | fifo | fifo/2 | gavel | gavel/1.3 "
          "| 2x fifo possible | 1.3x gavel possible | LP s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for start, end in WINDOWS[args.skip : args.windows]:
        trace = read_philly_window(data_file("philly", "philly.csv"), start, end)
        for seed in (int(s) for s in args.seeds.split(",")):
            jobs = build_jobs(trace, speeds, max(cap.values()), WorkloadSettings(), seed)
            avg = {
                name: float(
                    summary_row(
                        jobs,
                        simulate(jobs, cap, make_training_policy(name, engine.round_s), engine),
                        cap,
                        seed,
                    )["avg_jct_h"]  # type: ignore[arg-type]
                )
                for name in ("fifo", "gavel")
            }
            t0 = time.monotonic()
            bound = queueing_bound_h(jobs, cap, settings)
            row: dict[str, object] = {
                "window": f"{start[5:10]} {start[11:16]}-{end[11:16]}",
                "seed": seed,
                "jobs": len(jobs),
                "lb_h": round(mean_best_runtime_h(jobs), 3),
                "lp_bound_h": round(bound, 3),
                "fifo_h": round(avg["fifo"], 3),
                "gavel_h": round(avg["gavel"], 3),
                "fifo_2x_possible": bound <= avg["fifo"] / 2,
                "gavel_1_3x_possible": bound <= avg["gavel"] / 1.3,
                "lp_s": round(time.monotonic() - t0, 1),
            }
            rows.append(row)
            print(
                f"| {row['window']} | {seed} | {len(jobs)} | {row['lb_h']} | {row['lp_bound_h']} "
                f"| {row['fifo_h']} | {avg['fifo'] / 2:.3f} | {row['gavel_h']} "
                f"| {avg['gavel'] / 1.3:.3f} | {'yes' if row['fifo_2x_possible'] else 'NO'} "
                f"| {'yes' if row['gavel_1_3x_possible'] else 'NO'} | {row['lp_s']} |",
                flush=True,
            )
    write_rows(args.out / "bounds.csv", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
