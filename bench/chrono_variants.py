"""Measure variants of the `chronotope` policy against FGD on openb (exploration tool).

Usage: python bench/chrono_variants.py --traces default,cpu100 --seeds 42-44 \
           --variants fgd,zero,previous [--out out/var/results.csv]
       python bench/chrono_variants.py --traces "gen:cpu=0.2;gen:share=0.5" ...

A trace `gen:MIX` is the `default` trace resampled to that mix of pod kinds
(`chronotope.sim.variants.resample`, generator seed 7, 8,152 pods): workloads
of our own, off the published variants. Traces are separated by ';'.

Each variant is a `Chronotope` configuration (see VARIANTS). Runs are
sequential in one process (the machine is shared). Results are appended to
the CSV as (trace, variant, seed, alloc130); the printed table gives each
variant's per-seed difference to `fgd` when `fgd` is among the variants or
already in the CSV for that trace and seed.
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import defaultdict
from pathlib import Path

from chronotope.sim.cli import parse_seeds
from chronotope.sim.engine import simulate
from chronotope.sim.openb import load_nodes, load_pods
from chronotope.sim.variants import parse_mix, resample
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.model import PodRequest
from chronotope.solver.policies import Fgd, Policy

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openb"

VARIANTS: dict[str, dict[str, str]] = {
    "short": {"cpu_rule": "short", "share_gpu": "fgd"},  # the policy before usable
    "zero": {"cpu_rule": "zero", "share_gpu": "fgd"},  # the policy before short
    "usable": {"cpu_rule": "usable", "share_gpu": "fgd"},  # the kept policy
    "safe": {"cpu_rule": "safe", "share_gpu": "fgd"},  # usable's trigger, zero's target
    "budget": {"cpu_rule": "budget", "share_gpu": "fgd"},  # usable, while dead CPU outlasts demand
    "previous": {"cpu_rule": "idle", "share_gpu": "tight"},  # the policy before zero
    "cpu_fgd": {"cpu_rule": "fgd", "share_gpu": "tight"},
    "share_fgd": {"cpu_rule": "idle", "share_gpu": "fgd"},
    "f_zero": {"cpu_rule": "zero", "share_gpu": "fgd"},
    "f_dead": {"cpu_rule": "dead", "share_gpu": "fgd"},
    "zero_tight": {"cpu_rule": "zero", "share_gpu": "tight"},
}


def make(name: str) -> Policy:
    if name == "fgd":
        return Fgd()
    if name == "chronotope":
        return Chronotope()
    cfg = VARIANTS[name]
    return Chronotope(cpu_rule=cfg["cpu_rule"], share_gpu=cfg["share_gpu"])


def _pods(trace: str) -> list[PodRequest]:
    if not trace.startswith("gen:"):
        return load_pods(DATA / f"openb_pod_list_{trace}.csv")
    base = load_pods(DATA / "openb_pod_list_default.csv")
    return resample(base, parse_mix(trace[4:]), seed=7, count=len(base))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="default")
    ap.add_argument("--seeds", default="42-43")
    ap.add_argument("--variants", default="fgd,short")
    ap.add_argument("--out", default="out/var/results.csv")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    res: dict[tuple[str, str, int], float] = {}
    if out.exists():
        with out.open() as fh:
            for row in csv.DictReader(fh):
                res[(row["trace"], row["variant"], int(row["seed"]))] = float(row["alloc130"])
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(["trace", "variant", "seed", "alloc130"])
        for trace in args.traces.split(";"):
            pods = _pods(trace)
            for seed in parse_seeds(args.seeds):
                for v in args.variants.split(","):
                    if v == "fgd" and (trace, v, seed) in res:
                        continue
                    t0 = time.time()
                    r = simulate(nodes, pods, make(v), seed)
                    a = round(r.alloc_pct_at(130), 2)
                    res[(trace, v, seed)] = a
                    w.writerow([trace, v, seed, a])
                    fh.flush()
                    print(f"{trace} {v} {seed} {a} ({time.time() - t0:.0f}s)", flush=True)
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    for trace in args.traces.split(";"):
        for v in args.variants.split(","):
            for seed in parse_seeds(args.seeds):
                f = res.get((trace, "fgd", seed))
                x = res.get((trace, v, seed))
                if f is not None and x is not None:
                    by[(trace, v)].append(x - f)
    for (trace, v), d in by.items():
        print(
            f"{trace:11s} {v:12s} n={len(d)} mean {sum(d) / len(d):+.3f} "
            f"min {min(d):+.2f} max {max(d):+.2f} wins {sum(x > 0 for x in d)} "
            f"losses {sum(x < 0 for x in d)}"
        )


if __name__ == "__main__":
    main()
