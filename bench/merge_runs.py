"""Merge `chronotope simulate openb` output dirs (summary, bounds, curves) and re-plot.

Usage: .venv/bin/python bench/merge_runs.py OUT DIR [DIR ...]
Lets a long run be split (e.g. the baselines once, `chronotope` after each
change) and still give one summary.csv, bounds.csv and allocation.png.
A later DIR wins for a (trace, policy, seed) present in several.
"""

from __future__ import annotations

import sys
from pathlib import Path

from chronotope.sim.runner import merge_dirs


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    merge_dirs(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]])


if __name__ == "__main__":
    main()
