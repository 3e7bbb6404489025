"""Compare a `chronotope simulate openb` summary.csv with the FGD paper's figures.

Usage: .venv/bin/python bench/compare_published.py DIR/summary.csv [DIR/bounds.csv]
Prints, per trace, the mean over seeds of the allocation at 130 % for each
policy next to the published value (../shared/data/openb/fgd_published_results.csv),
chronotope minus FGD, and the relaxation upper bound when given.
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
    ours: dict[tuple[str, str], list[float]] = defaultdict(list)
    with open(sys.argv[1]) as fh:
        for row in csv.DictReader(fh):
            ours[row["trace"], row["policy"]].append(float(row["gpu_alloc_pct_at_130"]))
    pub: dict[tuple[str, str], float] = {}
    with (PUBLISHED / "fgd_published_results.csv").open() as fh:
        for row in csv.DictReader(fh):
            pub[row["workload"], NAMES[row["policy"].split("-", 1)[1]]] = float(
                row["gpu_alloc_pct_at_130"]
            )
    bounds: dict[str, list[float]] = defaultdict(list)
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as fh:
            for row in csv.DictReader(fh):
                bounds[row["trace"]].append(float(row["upper_bound_pct_at_130"]))
    mean = {k: sum(v) / len(v) for k, v in ours.items()}
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
            print(f"  chronotope - fgd: {mean[trace, 'chronotope'] - mean[trace, 'fgd']:+.2f} pp")
        if bounds.get(trace):
            print(f"  upper bound (relaxation): {sum(bounds[trace]) / len(bounds[trace]):.2f}")


if __name__ == "__main__":
    main()
