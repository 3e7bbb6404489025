"""Write a synthetic on/off arrival trace (one time per line) for `simulate inference`.

Poisson arrivals whose rate alternates between a low and a high level every
`--period` seconds: a trace burstier than the Azure conversation hour, to check
that the inference figures hold on more than one shape.

    .venv/bin/python bench/onoff_trace.py --out /tmp/onoff.txt
    .venv/bin/chronotope simulate inference \
        --pipeline manifests/samples/inferencepipeline-video.yaml \
        --trace /tmp/onoff.txt --target-qps 250 --seed 0 --out out/inference-onoff
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def onoff(low: float, high: float, period_s: float, periods: int, seed: int) -> list[float]:
    """Arrival times: `periods` stretches of `period_s`, at `low`, `high`, `low`, ... per second."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for k in range(periods):
        rate = low if k % 2 == 0 else high
        start = k * period_s
        n = rng.poisson(rate * period_s)
        out.extend(sorted(start + rng.uniform(0.0, period_s, n)))
    return out


def main() -> None:
    """Parse the options and write the trace."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--low", type=float, default=100.0)
    p.add_argument("--high", type=float, default=400.0)
    p.add_argument("--period", type=float, default=20.0, help="seconds at each level")
    p.add_argument("--periods", type=int, default=12)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    times = onoff(args.low, args.high, args.period, args.periods, args.seed)
    args.out.write_text("".join(f"{t:.6f}\n" for t in times))
    print(f"{len(times)} arrivals over {times[-1]:.1f} s written to {args.out}")


if __name__ == "__main__":
    main()
