"""How the tie-breaking node order moves the baselines against the published figures.

The reference simulator keeps the first node of highest score in the order its
parallel filter appends feasible nodes; that order is not in its visible
source, so `sim.engine.reference_rank` models it. This bench replays the
baselines under other plausible models, each drawn once per run (`fixed`) or
anew for every pod (`+pod`), and prints the mean allocation at 130 % next to
the published one:

- `reference`: chunks of sqrt(n) nodes, 16 workers, nodes at the same position
  of the chunks of one wave interleaved at random (the engine's model);
- `jitter`: every chunk's worker runs at its own speed (0.7-1.3) plus noise per
  node, so positions interleave continuously;
- `staggered`: as jitter, and each chunk starts up to one chunk's processing
  time late, so chunks run more nearly one after another;
- `roundrobin`: the same waves, chunks interleaved in index order;
- `uniform`: a uniformly random order, i.e. kube-scheduler's reservoir sampling.

Usage: python bench/tie_order.py --traces default,gpushare40 \
           --policies gpupacking,fgd --models reference,jitter+pod --seeds 42-51
"""

from __future__ import annotations

import argparse
import csv
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from chronotope.sim.cli import parse_seeds
from chronotope.sim.engine import TieOrder, reference_rank, simulate
from chronotope.sim.openb import load_nodes, load_pods
from chronotope.sim.runner import make_policy
from chronotope.solver.state import IntArray

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openb"
WORKERS = 16


def _waves(n: int) -> tuple[int, IntArray, IntArray]:
    chunk = max(1, min(int(np.sqrt(n)), n // WORKERS + 1))
    i = np.arange(n, dtype=np.int64)
    return chunk, i // chunk, i % chunk


def jitter_rank(n: int, rng: np.random.Generator) -> IntArray:
    chunk, c, pos = _waves(n)
    speed = rng.uniform(0.7, 1.3, int(c.max()) + 1)
    t = (c // WORKERS) * chunk + pos * speed[c] + rng.uniform(0.0, 0.5, n)
    return np.argsort(np.argsort(t)).astype(np.int64)


def staggered_rank(n: int, rng: np.random.Generator) -> IntArray:
    """Like jitter, and each chunk starts up to one chunk's time late (contiguous chunks)."""
    chunk, c, pos = _waves(n)
    nch = int(c.max()) + 1
    speed = rng.uniform(0.7, 1.3, nch)
    start = (c // WORKERS) * chunk + rng.uniform(0.0, chunk, nch)[c]
    t = start + pos * speed[c] + rng.uniform(0.0, 0.5, n)
    return np.argsort(np.argsort(t)).astype(np.int64)


def roundrobin_rank(n: int, rng: np.random.Generator) -> IntArray:
    chunk, c, pos = _waves(n)
    return ((c // WORKERS) * chunk + pos) * n + c


def uniform_rank(n: int, rng: np.random.Generator) -> IntArray:
    return rng.permutation(n).astype(np.int64)


MODELS: dict[str, TieOrder] = {
    "reference": reference_rank,
    "jitter": jitter_rank,
    "staggered": staggered_rank,
    "roundrobin": roundrobin_rank,
    "uniform": uniform_rank,
}


def published() -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    with (DATA / "fgd_published_results.csv").open() as fh:
        for row in csv.DictReader(fh):
            name = row["policy"].split("-", 1)[1].lower()
            out[(row["workload"], name)] = float(row["gpu_alloc_pct_at_130"])
    return out


def run(task: tuple[str, str, str, int]) -> tuple[str, str, str, int, float]:
    trace, policy, model, seed = task
    base, _, per_pod = model.partition("+")
    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_pods(DATA / f"openb_pod_list_{trace}.csv")
    res = simulate(
        nodes,
        pods,
        make_policy(policy),
        seed,
        tie_order=MODELS[base],
        redraw_order=per_pod == "pod",
    )
    return trace, policy, model, seed, res.alloc_pct_at(130)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default="gpushare40")
    ap.add_argument("--policies", default="gpupacking,fgd")
    ap.add_argument("--models", default="reference,reference+pod,jitter+pod")
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    tasks = [
        (t, p, m, s)
        for t in args.traces.split(",")
        for p in args.policies.split(",")
        for m in args.models.split(",")
        for s in parse_seeds(args.seeds)
    ]
    got: dict[tuple[str, str, str], list[float]] = {}
    t0 = time.time()
    with ProcessPoolExecutor(args.jobs) as pool:
        for k, (trace, policy, model, _seed, alloc) in enumerate(pool.map(run, tasks), 1):
            got.setdefault((trace, policy, model), []).append(alloc)
            print(f"\r{k}/{len(tasks)} runs, {time.time() - t0:.0f} s", end="", flush=True)
    print()
    pub = published()
    print("trace       policy         model            mean130  published  diff")
    for (trace, policy, model), vals in got.items():
        p = pub.get((trace, policy))
        diff = f"{np.mean(vals) - p:+.2f}" if p is not None else "n/a"
        print(
            f"{trace:11s} {policy:14s} {model:16s} {np.mean(vals):7.2f}  "
            f"{p if p is not None else float('nan'):9.2f}  {diff}"
        )


if __name__ == "__main__":
    main()
