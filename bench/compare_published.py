"""Compare a `chronotope simulate openb` summary.csv with the FGD paper's figures.

Usage: .venv/bin/python bench/compare_published.py DIR/summary.csv [DIR/bounds.csv] [--markdown]
Prints, per trace, the mean over seeds of the allocation at 130 % for each
policy next to the published value (../shared/data/openb/fgd_published_results.csv),
chronotope minus FGD (mean and the range over seeds of the per-seed
difference), and the offline upper bounds when given. `--markdown` prints
one table with a row per trace instead (the table in docs/solver.md).
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

PUBLISHED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openb"
NAMES = {"Random": "random", "DotProd": "dotprod", "GpuClustering": "gpuclustering",
         "GpuPacking": "gpupacking", "BestFit": "bestfit", "FGD": "fgd"}  # fmt: skip


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    markdown = "--markdown" in sys.argv
    ours: dict[tuple[str, str], list[float]] = defaultdict(list)
    per_seed: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    with open(args[0]) as fh:
        for row in csv.DictReader(fh):
            ours[row["trace"], row["policy"]].append(float(row["gpu_alloc_pct_at_130"]))
            per_seed[row["trace"], row["policy"]][row["seed"]] = float(row["gpu_alloc_pct_at_130"])
    pub: dict[tuple[str, str], float] = {}
    with (PUBLISHED / "fgd_published_results.csv").open() as fh:
        for row in csv.DictReader(fh):
            pub[row["workload"], NAMES[row["policy"].split("-", 1)[1]]] = float(
                row["gpu_alloc_pct_at_130"]
            )
    bounds: dict[str, list[float]] = defaultdict(list)
    offline: dict[str, list[float]] = defaultdict(list)
    if len(args) > 1:
        with open(args[1]) as fh:
            for row in csv.DictReader(fh):
                bounds[row["trace"]].append(float(row["upper_bound_pct_at_130"]))
                if row.get("offline_lp_per_gpu_pct"):
                    offline[row["trace"]].append(float(row["offline_lp_per_gpu_pct"]))
    mean = {k: sum(v) / len(v) for k, v in ours.items()}
    if markdown:
        _markdown(mean, pub, per_seed, bounds, offline)
        return
    for trace in sorted({t for t, _ in mean}):
        print(f"== {trace}")
        for pol in [*NAMES.values(), "chronotope"]:
            if (trace, pol) not in mean:
                continue
            got = mean[trace, pol]
            ref = pub.get((trace, pol))
            diff = f"{got - ref:+.2f}" if ref is not None else "  n/a"
            ref_s = f"{ref:.2f}" if ref is not None else "  n/a"
            print(f"  {pol:14s} ours {got:6.2f}  published {ref_s}  diff {diff}")
        if (trace, "chronotope") in mean and (trace, "fgd") in mean:
            lo, hi = _diff_range(per_seed, trace)
            print(
                f"  chronotope - fgd: {mean[trace, 'chronotope'] - mean[trace, 'fgd']:+.2f} pp"
                f" (per seed {lo:+.2f} .. {hi:+.2f})"
            )
        if bounds.get(trace):
            print(f"  upper bound (smallest LP, protocol-aware): {_avg(bounds[trace]):.2f}")
        if offline.get(trace):
            print(f"  offline upper bound (per-GPU LP):          {_avg(offline[trace]):.2f}")


def _avg(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _diff_range(
    per_seed: dict[tuple[str, str], dict[str, float]], trace: str
) -> tuple[float, float]:
    a, b = per_seed[trace, "chronotope"], per_seed[trace, "fgd"]
    diffs = [a[s] - b[s] for s in a if s in b] or [0.0]
    return min(diffs), max(diffs)


def _markdown(
    mean: dict[tuple[str, str], float],
    pub: dict[tuple[str, str], float],
    per_seed: dict[tuple[str, str], dict[str, float]],
    bounds: dict[str, list[float]],
    offline: dict[str, list[float]],
) -> None:
    pols = list(NAMES.values())
    head = ["trace", *(f"{p} ours (pub)" for p in pols), "chronotope", "chrono - fgd (seed range)"]
    head += ["upper bound (protocol LP)", "offline per-GPU LP"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for trace in sorted({t for t, _ in mean}):
        cells = [trace]
        for pol in pols:
            got = mean.get((trace, pol))
            ref = pub.get((trace, pol))
            ref_s = f"{ref:.2f}" if ref is not None else "n/a"
            cells.append(f"{got:.2f} ({ref_s})" if got is not None else "-")
        chrono = mean.get((trace, "chronotope"))
        cells.append(f"{chrono:.2f}" if chrono is not None else "-")
        if chrono is not None and (trace, "fgd") in mean:
            lo, hi = _diff_range(per_seed, trace)
            cells.append(f"{chrono - mean[trace, 'fgd']:+.2f} ({lo:+.2f}..{hi:+.2f})")
        else:
            cells.append("-")
        cells.append(f"{_avg(bounds[trace]):.2f}" if bounds.get(trace) else "-")
        cells.append(f"{_avg(offline[trace]):.2f}" if offline.get(trace) else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
