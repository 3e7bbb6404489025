"""Batched protocol: windows of arrivals placed jointly with CP-SAT (a separate row).

A clearly labelled extra row beside the online comparison: a protocol that
sees a *window* of arrivals at once. The arrivals (the same seeded sequence
as the online runs) are cut into windows of `window` pods. Each window is
first placed by the online policy in arrival order (`chronotope` unless told
otherwise). If that places every pod
of the window, it is kept: until the cluster fills up the batched row is the
online policy itself. If some pod of the window that fitted somewhere at the window's
start fails, the window is rolled back and solved with CP-SAT over the state
at the window's start (if only pods that fitted nowhere fail, the online
placement already places everything that can be, and is kept):

- `on[j|node]` per pod and candidate node (the node the online policy chose,
  then the nodes with the least fragmentation growth, up to `candidates`),
  `gpu[j|node|g]` for a share on each GPU with room, whole-GPU pods counted
  against the node's fully free GPUs less those a share of the window opens;
  per-node CPU and memory;
- objective, lexicographic by weights: GPU share placed, then pods placed,
  then agreement with the online policy's node and share GPU (so the solver only departs
  from it where that places more);
- the online placement is the hint, and is kept if the solver's is not at
  least as good, so a window never places less GPU share than online would.

A pod the window does not place fails for good, as online. Unlike online, the
solver may leave out a pod that fits (an 810m share) for one that is worth
more (a whole GPU arriving later in the same window); that is the batched
protocol's extra freedom, and why this row is not comparable to the online
upper bound (`sim.bound.protocol_upper_bound`), only to the offline ones.
Series are recorded per arrival after the window is enacted, in arrival order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chronotope.sim.engine import Replay, RunResult
from chronotope.solver.fragpack import Chronotope
from chronotope.solver.model import MILLI, ClusterSnapshot, PodRequest
from chronotope.solver.policies import Choice, Context, Policy, frag_after
from chronotope.solver.state import ClusterState, PodSpec

__all__ = ["WindowStats", "simulate_batched", "solve_window"]


@dataclass
class WindowStats:
    """What the CP-SAT windows did, for the run's log line."""

    windows: int = 0
    solved: int = 0
    improved: int = 0
    gained_milli: int = 0


def _candidates(ctx: Context, pod: PodSpec, first: int | None, limit: int) -> list[int]:
    """Nodes offered to one pod: the online choice, then least fragmentation growth."""
    cand = ctx.state.feasible(pod)
    if len(cand) == 0:
        return []
    assert ctx.frag is not None
    assert ctx.rank is not None
    k_idx, _, after = frag_after(ctx, pod, cand)
    nodes = cand[k_idx]
    growth = after - ctx.frag.node_frag[nodes]
    out: list[int] = [] if first is None else [first]
    for k in np.lexsort((ctx.rank[nodes], growth)):
        node = int(nodes[k])
        if node not in out:
            out.append(node)
        if len(out) >= limit:
            break
    return out


@dataclass
class _Window:
    """The CP-SAT model of one window: variables and what they take."""

    m: Any
    on: dict[tuple[int, int], Any] = field(default_factory=dict)
    gpu: dict[tuple[int, int, int], Any] = field(default_factory=dict)
    gpus_of: dict[tuple[int, int], list[tuple[int, Any]]] = field(default_factory=dict)
    """(pod, node) -> its share's GPU variables there, for reading the solution."""
    cpu_use: dict[int, list[tuple[int, Any]]] = field(default_factory=dict)
    mem_use: dict[int, list[tuple[int, Any]]] = field(default_factory=dict)
    whole_use: dict[int, list[tuple[int, Any]]] = field(default_factory=dict)
    share_use: dict[tuple[int, int], list[tuple[int, Any]]] = field(default_factory=dict)
    objective: list[tuple[int, Any]] = field(default_factory=list)

    def add_pod(
        self,
        st: ClusterState,
        j: int,
        pod: PodSpec,
        *,
        nodes: list[int],
        online: Choice | None,
        w: int,
    ) -> None:
        """Pod `j` on one of `nodes` (or unplaced); `w` weighs placing it over agreement."""
        m = self.m
        first = None if online is None else online[0]
        ys = []
        for node in nodes:
            y = m.new_bool_var(f"on[{j}|{st.names[node]}]")
            self.on[j, node] = y
            ys.append(y)
            self.cpu_use.setdefault(node, []).append((pod.cpu, y))
            self.mem_use.setdefault(node, []).append((pod.mem, y))
            if pod.is_share:
                zs = []
                for fit in np.flatnonzero(st.gpu_left[node] >= pod.milli):
                    z = m.new_bool_var(f"gpu[{j}|{st.names[node]}|{fit}]")
                    self.gpu[j, node, int(fit)] = z
                    self.gpus_of.setdefault((j, node), []).append((int(fit), z))
                    self.share_use.setdefault((node, int(fit)), []).append((pod.milli, z))
                    zs.append(z)
                m.add(sum(zs) == y)
            elif pod.milli > 0:
                self.whole_use.setdefault(node, []).append((pod.num_gpus, y))
            if first == node:
                # Agreement with the online choice: its node, and for a share its GPU.
                same = self.gpu[j, node, online[1][0]] if pod.is_share and online else y
                self.objective.append((1, same))
        if not ys:
            return
        p = m.new_bool_var(f"placed[{j}]")
        m.add(sum(ys) == p)
        self.objective.append((pod.total_milli * w + 1, p))

    def add_capacity(self, st: ClusterState) -> None:
        """Node CPU and memory, GPU shares, whole GPUs with the ones shares open."""
        m = self.m
        for node, uses in self.cpu_use.items():
            m.add(sum(c * y for c, y in uses) <= int(st.cpu_left[node]))
            m.add(sum(c * y for c, y in self.mem_use[node]) <= int(st.mem_left[node]))
        opened: dict[int, list[Any]] = {}
        for (node, gi), uses in self.share_use.items():
            left = int(st.gpu_left[node, gi])
            if left == MILLI and node in self.whole_use:
                o = m.new_bool_var(f"opened[{st.names[node]}|{gi}]")
                m.add(sum(s * z for s, z in uses) <= MILLI * o)
                opened.setdefault(node, []).append(o)
            else:
                m.add(sum(s * z for s, z in uses) <= left)
        for node, uses in self.whole_use.items():
            free = int(st.full_free[node])
            m.add(sum(k * y for k, y in uses) + sum(opened.get(node, [])) <= free)

    def add_hint(self, hint: Sequence[Choice | None]) -> None:
        """The online placement as the solver's starting point."""
        for (j, node), y in self.on.items():
            choice = hint[j]
            self.m.add_hint(y, int(choice is not None and choice[0] == node))
        for (j, node, g), z in self.gpu.items():
            choice = hint[j]
            self.m.add_hint(z, int(choice is not None and choice[0] == node and g in choice[1]))

    def read(self, st: ClusterState, pods: Sequence[PodSpec], value: Any) -> list[Choice | None]:
        """The solution's choices; whole-GPU pods take fully free GPUs no share opened."""
        out: list[Choice | None] = [None] * len(pods)
        for (j, node), y in self.on.items():
            if value(y):
                gpus = tuple(g for g, z in self.gpus_of.get((j, node), ()) if value(z))
                out[j] = (node, gpus)
        taken: dict[int, set[int]] = {}
        for choice in out:
            if choice is not None and choice[1]:
                taken.setdefault(choice[0], set()).update(choice[1])
        for j, pod in enumerate(pods):
            choice = out[j]
            if choice is None or pod.is_share or pod.milli == 0:
                continue
            node = choice[0]
            busy = taken.setdefault(node, set())
            free = [
                int(g) for g in np.flatnonzero(st.gpu_left[node] == MILLI) if int(g) not in busy
            ]
            picked = tuple(free[: pod.num_gpus])
            out[j] = (node, picked)
            busy.update(picked)
        return out


def solve_window(
    ctx: Context,
    pods: Sequence[PodSpec],
    hint: Sequence[Choice | None],
    *,
    candidates: int = 24,
    time_limit_s: float = 1.0,
    seed: int = 0,
) -> tuple[list[Choice | None], str]:
    """Place a window of pods jointly on `ctx.state` (unchanged); returns choices and status."""
    from ortools.sat.python import cp_model

    st: ClusterState = ctx.state
    win = _Window(cp_model.CpModel())
    secondary = 2 * len(pods) + 1
    for j, pod in enumerate(pods):
        online = hint[j]
        first = None if online is None else online[0]
        nodes = _candidates(ctx, pod, first, candidates)
        win.add_pod(st, j, pod, nodes=nodes, online=online, w=secondary)
    win.add_capacity(st)
    win.m.maximize(sum(c * v for c, v in win.objective))
    win.add_hint(hint)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    status = solver.solve(win.m)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return list(hint), name
    return win.read(st, pods, solver.value), name


def simulate_batched(
    cluster: ClusterSnapshot,
    pods: Sequence[PodRequest],
    seed: int,
    *,
    window: int = 64,
    policy: Policy | None = None,
    candidates: int = 24,
    time_limit_s: float = 1.0,
    tune_ratio: float = 1.3,
    on_pod: Callable[[int], None] | None = None,
    stats: WindowStats | None = None,
) -> RunResult:
    """The batched protocol of the module docstring; same arrivals as `simulate`."""
    online = policy or Chronotope()
    run = Replay.start(cluster, pods, seed, tune_ratio=tune_ratio)
    state, frag, ctx = run.state, run.frag, run.ctx
    stats = stats if stats is not None else WindowStats()
    for lo in range(0, len(run.order), window):
        chunk = [run.specs[i] for i in run.order[lo : lo + window]]
        stats.windows += 1
        # Nothing departs, so a pod that fits nowhere at the window's start fits nowhere
        # later; if only such pods fail, the online placement already places all it can.
        could = [len(state.feasible(spec)) > 0 for spec in chunk]
        choices: list[Choice | None] = []
        for spec in chunk:
            cand = state.feasible(spec)
            if len(cand) == 0:
                choices.append(None)
                continue
            node, gpus = online.choose(ctx, spec, cand)
            state.assign(node, spec, gpus)
            frag.refresh(node)
            choices.append((node, gpus))
        if any(c is None and ok for c, ok in zip(choices, could, strict=True)):
            for spec, choice in reversed(list(zip(chunk, choices, strict=True))):
                if choice is not None:
                    state.release(choice[0], spec, choice[1])
                    frag.refresh(choice[0])
            before = sum(s.total_milli for s, c in zip(chunk, choices, strict=True) if c)
            joint, _ = solve_window(
                ctx, chunk, choices, candidates=candidates, time_limit_s=time_limit_s, seed=seed
            )
            after = sum(s.total_milli for s, c in zip(chunk, joint, strict=True) if c)
            stats.solved += 1
            if after >= before:  # a solver stopped by its limit may not even reach the hint
                choices = joint
                stats.improved += int(after > before)
                stats.gained_milli += after - before
            for spec, choice in zip(chunk, choices, strict=True):
                if choice is not None:
                    state.assign(choice[0], spec, choice[1])
                    frag.refresh(choice[0])
        for k, (spec, choice) in enumerate(zip(chunk, choices, strict=True)):
            run.record(lo + k, spec, placed=choice is not None)
            if on_pod is not None:
                on_pod(lo + k)
    return run.result("batched")
