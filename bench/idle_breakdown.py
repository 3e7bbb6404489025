"""Where the idle GPU share sits at the end of an openb run (130 % arrived demand).

Usage: python bench/idle_breakdown.py TRACE POLICY SEED [SEED ...]

Replays the run like `sim.engine.simulate` and classifies every GPU with idle
share at the end: 190m left (the hole an 810m share leaves on a whole GPU),
other holes < 230m (only the rare smallest shares fit), holes >= 230m on
nodes whose CPU or memory no longer admits any GPU pod of the trace that
would fit the hole, whole free GPUs, and the rest. Figures are GPUs (1,000m).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from chronotope.sim.engine import arrivals, reference_rank
from chronotope.sim.openb import load_nodes, load_pods
from chronotope.solver.frag import FragModel, FragTracker, typical_pods
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.policies import BASELINES, Context, Policy
from chronotope.solver.state import ClusterState

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openb"


def breakdown(trace: str, policy: Policy, seed: int) -> dict[str, float]:
    cluster = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    pods = load_pods(DATA / f"openb_pod_list_{trace}.csv")
    state = ClusterState.from_snapshot(cluster)
    frag = FragTracker(FragModel(typical_pods(pods), state.models), state)
    rng = np.random.default_rng([seed, 7])
    ctx = Context(state=state, frag=frag, rng=rng, rank=reference_rank(state.n, rng))
    specs = [state.spec(p) for p in pods]
    for i in arrivals(pods, state.total_gpu_milli, seed, 1.3):
        spec = specs[i]
        cand = state.feasible(spec)
        if len(cand):
            node, gpus = policy.choose(ctx, spec, cand)
            state.assign(node, spec, gpus)
            frag.refresh(node)
    gpu_pods = [s for s in specs if s.milli > 0 and s.num_gpus == 1]
    out = {"190m": 0.0, "<230m": 0.0, "cpu/mem stranded": 0.0, "whole free": 0.0, "rest": 0.0}
    for k in range(state.n):
        for g in range(int(state.gpu_count[k])):
            v = int(state.gpu_left[k, g])
            if v == 0:
                continue
            fits = any(
                s.milli <= v
                and s.allowed[state.model_idx[k]]
                and s.cpu <= state.cpu_left[k]
                and s.mem <= state.mem_left[k]
                for s in gpu_pods
            )
            if v == 1000:
                key = "whole free" if fits else "cpu/mem stranded"
            elif v == 190:
                key = "190m"
            elif v < 230:
                key = "<230m"
            else:
                key = "rest" if fits else "cpu/mem stranded"
            out[key] += v / 1000
    out["idle"] = sum(out.values())
    out["alloc %"] = 100 - out["idle"] / state.gpu_count.sum() * 100
    return out


def main() -> None:
    trace, name = sys.argv[1], sys.argv[2]
    for seed in (int(x) for x in sys.argv[3:]):
        policy = Chronotope() if name == "chronotope" else BASELINES[name]()
        row = breakdown(trace, policy, seed)
        print(trace, name, seed, " ".join(f"{k}={v:.1f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
