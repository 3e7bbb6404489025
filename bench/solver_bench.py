"""Figures for the placement core (no gating): online and batch latency, scaling.

Usage: .venv/bin/python bench/solver_bench.py [--nodes CSV] [--pods CSV] [--quick] [--batch-only]

Prints, on the openb cluster (../shared/data/openb):
- online decision latency per pod (p50/p99) for FGD and chronotope, replaying
  the default trace, on 1,213 nodes and on 1/4 and 1/2 of them;
- batch plan latency (p50/p95 over a few draws) for 50, 200 and 1,000 pending
  pods drawn from the trace as single-pod gangs, on the full cluster, and for
  200 pending on 1/4 and 1/2 of it (how it grows with cluster size); each on
  the empty cluster and on the cluster 95 % allocated by FGD.
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
from chronotope.solver.model import ClusterSnapshot, PodRequest, Workload
from chronotope.solver.policies import Context
from chronotope.solver.state import ClusterState
from chronotope.solver.validate import validate

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openb"


def online(
    cluster: ClusterSnapshot, pods: list[PodRequest], policy: str, limit: int
) -> tuple[float, float, float, float]:
    """Wall-clock and CPU (this thread) p50/p99 per decision, in ms.

    The CPU figures do not count time the process waited for a core, so they
    are what a decision costs on a quiet machine.
    """
    state = ClusterState.from_snapshot(cluster)
    frag = FragTracker(FragModel(typical_pods(pods), state.models), state)
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(0))
    impl = make_policy(policy)
    wall, cpu = [], []
    order = np.random.default_rng(1).permutation(len(pods))[:limit]
    for i in order:
        spec = state.spec(pods[i])
        t0, c0 = time.perf_counter(), time.thread_time()
        cand = state.feasible(spec)
        if len(cand):
            node, gpus = impl.choose(ctx, spec, cand)
            cpu.append(time.thread_time() - c0)
            wall.append(time.perf_counter() - t0)
            state.assign(node, spec, gpus)
            frag.refresh(node)
    w, c = np.array(wall) * 1000, np.array(cpu) * 1000
    return (
        float(np.percentile(w, 50)),
        float(np.percentile(w, 99)),
        float(np.percentile(c, 50)),
        float(np.percentile(c, 99)),
    )


def part(cluster: ClusterSnapshot, frac: float) -> ClusterSnapshot:
    """The first `frac` of the cluster's nodes (for how latency grows with size)."""
    return ClusterSnapshot(nodes=cluster.nodes[: int(len(cluster.nodes) * frac)])


def filled(cluster: ClusterSnapshot, pods: list[PodRequest], pct: float) -> ClusterSnapshot:
    """The cluster after FGD placed shuffled trace pods until `pct` % of GPU share is used."""
    from chronotope.solver.model import Gpu, Node

    state = ClusterState.from_snapshot(cluster)
    frag = FragTracker(FragModel(typical_pods(pods), state.models), state)
    ctx = Context(state=state, frag=frag, rng=np.random.default_rng(0))
    impl = make_policy("fgd")
    rng = np.random.default_rng(3)
    while state.total_left.sum() > (1 - pct / 100) * state.total_gpu_milli:
        spec = state.spec(pods[int(rng.integers(len(pods)))])
        cand = state.feasible(spec)
        if len(cand):
            node, gpus = impl.choose(ctx, spec, cand)
            state.assign(node, spec, gpus)
            frag.refresh(node)
    nodes = []
    for i, n in enumerate(cluster.nodes):
        node_gpus = tuple(
            Gpu(index=g.index, model=g.model, free_milli=int(state.gpu_left[i, j]))
            for j, g in enumerate(n.gpus)
        )
        nodes.append(
            Node(
                name=n.name,
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib,
                cpu_free=int(state.cpu_left[i]),
                memory_free=int(state.mem_left[i]),
                gpus=node_gpus,
            )
        )
    return ClusterSnapshot(nodes=tuple(nodes))


def batch(
    cluster: ClusterSnapshot, pods: list[PodRequest], count: int, draws: int
) -> tuple[float, float, str]:
    """p50/p95 of `plan` wall time over `draws` draws, and what the plans did."""
    rng = np.random.default_rng(2)
    times = []
    notes = []
    for _ in range(draws):
        pick = rng.choice(len(pods), size=count, replace=False)
        wl = [Workload(name=f"w{i}", pod=pods[i]) for i in pick]
        t0 = time.perf_counter()
        p = plan(cluster, wl, BatchSettings(time_limit_s=10.0, horizon_slots=2, candidate_nodes=6))
        times.append(time.perf_counter() - t0)
        ok = validate(cluster, p.placements, workloads=wl) == []
        bad = "" if ok else " INVALID"
        notes.append(f"{p.status[:4]} {len(p.chosen)}+{len(p.deferred)}/{count}{bad}")
    s = np.array(times)
    return float(np.percentile(s, 50)), float(np.percentile(s, 95)), ", ".join(notes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    ap.add_argument("--quick", action="store_true", help="batch sizes 50 and 200 only")
    ap.add_argument("--batch-only", action="store_true", help="skip the online latencies")
    args = ap.parse_args()
    cluster = load_nodes(args.nodes)
    pods = load_pods(args.pods)
    print("online decision latency per pod (ms), first 6,000 pods of a shuffled trace")
    for frac in () if args.batch_only else (0.25, 0.5, 1.0):
        sub = part(cluster, frac)
        limit = int(6000 * frac)
        for policy in ("bestfit", "fgd", "chronotope"):
            p50, p99, c50, c99 = online(sub, pods, policy, limit)
            print(
                f"  nodes={len(sub.nodes):5d} {policy:10s} wall p50={p50:.2f} p99={p99:.2f}"
                f"  cpu p50={c50:.2f} p99={c99:.2f}"
            )
    for frac in (0.25, 0.5, 1.0):
        sub = part(cluster, frac)
        full = frac == 1.0
        counts = (200,) if not full else (50, 200) if args.quick else (50, 200, 1000)
        for label, snap in (
            ("empty", sub),
            ("95 % allocated by FGD (contended)", filled(sub, pods, 95.0)),
        ):
            print(
                f"batch plan latency (s), single-pod gangs from the trace, "
                f"{len(sub.nodes)} nodes, {label}"
            )
            for count in counts:
                p50, p95, notes = batch(snap, pods, count, draws=5 if count < 1000 else 2)
                print(
                    f"  pending={count:5d} p50={p50:.2f} p95={p95:.2f}  (now+later/pending: ",
                    end="",
                )
                print(f"{notes})")


if __name__ == "__main__":
    main()
