"""Figures for the placement core (no gating): online and batch latency, scaling.

Usage: .venv/bin/python bench/solver_bench.py [--nodes CSV] [--pods CSV] [--quick]

Prints, on the openb cluster (../shared/data/openb):
- online decision latency per pod (p50/p99) for FGD and chronotope, replaying
  the default trace, on 1,213 nodes and on 1/4 and 1/2 of them;
- batch plan latency (p50/p95 over a few draws) for 50, 200 and 1,000 pending
  pods drawn from the trace as single-pod gangs, on the full cluster.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from chronotope.sim.openb import load_nodes, load_pods
from chronotope.sim.runner import make_policy
from chronotope.solver.batch import BatchSettings, plan
from chronotope.solver.frag import FragModel, FragTracker, typical_pods
from chronotope.solver.model import ClusterSnapshot, Workload
from chronotope.solver.policies import Context
from chronotope.solver.state import ClusterState

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openb"


def online(cluster: ClusterSnapshot, pods: list, policy: str, limit: int) -> tuple[float, float]:
    state = ClusterState.from_snapshot(cluster)
    frag = FragTracker(FragModel(typical_pods(pods), state.models), state)
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(0))
    impl = make_policy(policy)
    times = []
    order = np.random.default_rng(1).permutation(len(pods))[:limit]
    for i in order:
        spec = state.spec(pods[i])
        t0 = time.perf_counter()
        cand = state.feasible(spec)
        if len(cand):
            node, gpus = impl.choose(ctx, spec, cand)
            times.append(time.perf_counter() - t0)
            state.assign(node, spec, gpus)
            frag.refresh(node)
    ms = np.array(times) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def batch(cluster: ClusterSnapshot, pods: list, count: int, draws: int) -> tuple[float, float]:
    rng = np.random.default_rng(2)
    times = []
    for _ in range(draws):
        pick = rng.choice(len(pods), size=count, replace=False)
        wl = [Workload(name=f"w{i}", pod=pods[i]) for i in pick]
        t0 = time.perf_counter()
        plan(cluster, wl, BatchSettings(time_limit_s=10.0, horizon_slots=2, candidate_nodes=6))
        times.append(time.perf_counter() - t0)
    s = np.array(times)
    return float(np.percentile(s, 50)), float(np.percentile(s, 95))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cluster = load_nodes(args.nodes)
    pods = load_pods(args.pods)
    print("online decision latency per pod (ms), first 6,000 pods of a shuffled trace")
    for frac in (0.25, 0.5, 1.0):
        sub = ClusterSnapshot(nodes=cluster.nodes[: int(len(cluster.nodes) * frac)])
        limit = int(6000 * frac)
        for policy in ("bestfit", "fgd", "chronotope"):
            p50, p99 = online(sub, pods, policy, limit)
            print(f"  nodes={len(sub.nodes):5d} {policy:10s} p50={p50:.2f} p99={p99:.2f}")
    print("batch plan latency (s), single-pod gangs from the trace, full cluster")
    for count in (50, 200) if args.quick else (50, 200, 1000):
        p50, p95 = batch(cluster, pods, count, draws=3 if count < 1000 else 2)
        print(f"  pending={count:5d} p50={p50:.2f} p95={p95:.2f}")


if __name__ == "__main__":
    main()
