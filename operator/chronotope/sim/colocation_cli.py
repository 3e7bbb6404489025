"""`chronotope simulate colocation`: HP inference x BE training pairs on one GPU, per policy."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any

from chronotope.paths import data_file

__all__ = ["SUMMARY", "add_parser"]

SUMMARY = (
    "policy",
    "pairs",
    "hp_p99_slowdown_max",
    "hp_p99_slowdown_mean",
    "be_throughput_norm",
    "gpus_used",
)


def add_parser(traces: Any) -> None:
    """Register `simulate colocation` on the trace subcommands."""
    p = traces.add_parser(
        "colocation", help="high-priority inference beside best-effort training (Orion kernels)"
    )
    p.add_argument(
        "--kernels",
        type=Path,
        default=data_file("orion", "model_kernels"),
        help="directory of Orion kernel profiles (default: data/orion/model_kernels/)",
    )
    p.add_argument("--policies", default="exclusive,packing,orion,chronotope,chronotope-gated")
    p.add_argument("--seed", type=int, default=0, help="seeds the HP arrivals")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--requests", type=int, default=100, help="HP requests per pair")
    p.add_argument("--hp-load", type=float, default=0.1, help="HP busy share alone (Orion: ~0.1)")
    p.add_argument("--budget", type=float, default=1.10, help="HP slowdown budget (x)")
    p.add_argument("--hp-copies", type=int, default=2, help="cluster scenario: pods per HP model")
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    from chronotope.sim.colocation import (
        COLOCATION_POLICIES,
        PairSetup,
        load_profiles,
        place_cluster,
        simulate_pair,
    )

    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in COLOCATION_POLICIES]
    if unknown or args.budget < 1:
        print(
            f"error: policies from {COLOCATION_POLICIES}; --budget must be >= 1 "
            f"(got {args.budget:g}: no co-location can be faster than a dedicated GPU)",
            file=sys.stderr,
        )
        return 2
    hps, bes, skipped = load_profiles(args.kernels)
    for why in skipped:
        print(f"skipped {why}")
    if not hps or not bes:
        print(f"error: {args.kernels} has no *_fwd and *_fb* profiles", file=sys.stderr)
        return 2
    setup = PairSetup(
        hp_load=args.hp_load, requests=args.requests, seed=args.seed, budget=args.budget
    )
    args.out.mkdir(parents=True, exist_ok=True)
    cluster_hps = [h for h in hps for _ in range(args.hp_copies)]
    rows, runs = [], {}
    for policy in policies:
        pair_runs = [simulate_pair(policy, h, b, setup) for h in hps for b in bes]
        runs[policy] = pair_runs
        placed = place_cluster(policy, cluster_hps, bes, setup)
        slow = [r.hp_p99_slowdown for r in pair_runs]
        rows.append(
            {
                "policy": policy,
                "pairs": len(pair_runs),
                "hp_p99_slowdown_max": round(max(slow), 3),
                "hp_p99_slowdown_mean": round(sum(slow) / len(slow), 3),
                "be_throughput_norm": round(
                    sum(r.be_throughput_norm for r in pair_runs) / len(pair_runs), 3
                ),
                "gpus_used": placed.gpus,
            }
        )
        print(", ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    with (args.out / "summary.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY)
        writer.writeheader()
        writer.writerows(rows)
    with (args.out / "pairs.csv").open("w", newline="") as fh:
        pair_writer = csv.writer(fh)
        pair_writer.writerow(
            ("policy", "hp", "be", "hp_p99_slowdown", "be_progress", "gpus", "mps")
        )
        for policy, pair_runs in runs.items():
            for r in pair_runs:
                pair_writer.writerow(
                    (policy, r.hp, r.be, r.hp_p99_slowdown, r.be_progress, r.gpus, r.mps_percent)
                )
    _plot(args.out / "slowdown.png", runs, [h.name for h in hps], [b.name for b in bes])
    print(f"cluster scenario: {len(cluster_hps)} HP + {len(bes)} BE pods; written to {args.out}")
    return 0


def _plot(path: Path, runs: dict[str, list[Any]], hps: list[str], bes: list[str]) -> None:
    """Per policy: HP P99 slowdown (top) and BE throughput per GPU (bottom), per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows: tuple[tuple[str, str, float, float, str], ...] = (
        ("HP P99 slowdown", "hp_p99_slowdown", 1.0, 2.0, "Reds"),
        ("BE work per GPU", "be_throughput_norm", 0.0, 1.0, "Blues"),
    )
    fig, axes = plt.subplots(2, len(runs), figsize=(3.6 * len(runs), 6.4), squeeze=False)
    for row, (label, value, lo, hi, cmap) in enumerate(rows):  # value: a PairRun field
        for col, (policy, pair_runs) in enumerate(runs.items()):
            ax = axes[row][col]
            cells = [float(getattr(r, value)) for r in pair_runs]
            grid = np.array(cells).reshape(len(hps), len(bes))
            im = ax.imshow(grid, vmin=lo, vmax=hi, cmap=cmap)
            ax.set_title(f"{policy}: {label}", fontsize=8)
            names = [h.replace("_fwd", "") for h in hps]
            ax.set_yticks(range(len(hps)), names if col == 0 else [""] * len(hps), fontsize=7)
            ax.set_xticks(
                range(len(bes)), [b.replace("_fb1", "") for b in bes], fontsize=6, rotation=60
            )
            for (i, j), v in np.ndenumerate(grid):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=5)
        fig.colorbar(im, ax=axes[row].tolist(), shrink=0.8)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
