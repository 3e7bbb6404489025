"""The live cluster model: a watch-fed cache with assume, confirm, forget and expire.

kube-scheduler keeps one cache of nodes and pods and hands each scheduling
cycle a snapshot of it. This is Chronotope's: nodes (GPU model and count,
device memory, allocatable CPU and memory) and holdings (what each pod takes:
node, GPU indices, share per GPU, device memory, CPU, memory), kept in the
array form the online policies and the simulator read (`ClusterState`), with
the fragmentation tables (`FragTracker`) kept in step. A decision reads the
arrays under its caller's lock, so each decision sees one consistent state;
`snapshot` copies them for callers that keep a state beyond that.

A holding is *assumed* when a policy chooses a node (kube-scheduler's
Reserve), *binding* while the binder writes it, *bound* once confirmed or once
the cluster shows the pod bound, and forgotten when the pod leaves or the
bind fails. An assumption whose bind never comes expires. After a restart the
cache is rebuilt from bound pods (their assignment annotations are the
truth), so nothing is lost and nothing is given out twice.

Shares that state a priority also keep it, their profile and the compute
percent they were given on their GPUs (`ClusterState.shares`); the
co-location rules (`solver.colocation`) filter every share placement on them,
bound a BestEffort share's compute percent beside High ones (the holding takes
the bounded share), and say why a node is refused.

Pure: plain values in, plain values out; the caller serialises access.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.solver.colocation import (
    Colocation,
    Decision,
    choose,
    gpu_verdict,
    usable_gpus,
)
from chronotope.solver.frag import (
    FragModel,
    FragTracker,
    Shape,
    TypicalPod,
    shape_of,
    typical_from_counts,
)
from chronotope.solver.model import MILLI, UNBOUNDED, Placement, PodRequest, Reason
from chronotope.solver.policies import Context, Policy
from chronotope.solver.state import BoolArray, ClusterState, IntArray, PodSpec, ShareTag

__all__ = ["ClusterCache", "Holding", "NodeInfo"]

SEEN_LIMIT = 200_000
"""Pod keys remembered for the learned request mix before the set is cleared (bounds memory)."""


@dataclass(frozen=True)
class NodeInfo:
    """One node as the cache knows it: capacity and scheduling flags."""

    name: str
    gpu_model: str = ""
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    """Device memory of one GPU (0: unknown)."""
    cpu_milli: int = UNBOUNDED
    memory_mib: int = UNBOUNDED
    unschedulable: bool = False
    """New pods cannot land there (`workloads.cluster_feed.node_schedulable`)."""
    device_plugin: bool = False
    """The node runs Chronotope's device plugin (binds then take its allocation lock)."""
    topology: tuple[tuple[str, str], ...] = ()
    """Its topology labels (zone, rack, NVLink domain: `solver.slots.DOMAIN_LABELS`), as
    (label, value) pairs: what a gang that requires one domain reads."""

    def shape(self) -> tuple[str, int, int, int, int]:
        """The fields the node's array row is built from; a change rebuilds the arrays."""
        return (
            self.gpu_model,
            self.gpu_count,
            self.gpu_memory_mib,
            self.cpu_milli,
            self.memory_mib,
        )


@dataclass(frozen=True)
class Holding:
    """What one pod (or one reserved gang slot) takes on a node."""

    node: str
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0
    """Share taken on each GPU (1000 for whole GPUs)."""
    gpu_memory_mib: int = 0
    """Device memory taken on each GPU (shares only)."""
    cpu_milli: int = 0
    memory_mib: int = 0
    bound: bool = False
    expires_at: float = 0.0
    binding: bool = False
    """A bind for this assumption is under way: it neither expires nor is replaced."""
    priority: SharePriority | None = None
    """A share's priority class (None: a share that states none, or whole GPUs)."""
    profile: WorkloadProfile = WorkloadProfile.UNKNOWN
    """A share's declared profile."""

    def tag(self, key: str) -> ShareTag | None:
        """The holding as the co-location rules see it (shares that state a priority)."""
        if self.priority is None or not 0 < self.gpu_milli < MILLI:
            return None
        return ShareTag(key, self.priority, self.profile, self.gpu_milli * 100 // MILLI)


_CHOSE_OTHER = "the chronotope policy chose another node"


def _unknown(node: str) -> Reason:
    return Reason(
        code="NodeUnknown",
        message=f"node {node} is not known to the chronotope extender",
        unresolvable=True,
    )


class ClusterCache:
    """Nodes and holdings, in the arrays every decision reads; see the module docstring."""

    def __init__(
        self,
        assume_ttl_s: float = 30.0,
        *,
        typical: Sequence[TypicalPod] | None = None,
        tie_order: Sequence[str] | None = None,
        colocation: Colocation | None = None,
    ) -> None:
        """An empty cache; nodes and holdings arrive through its update methods.

        Args:
            assume_ttl_s: Seconds an assumption may wait for its bind before `expire`
                drops it.
            typical: A fixed expected request mix for the fragmentation tables; None
                or empty learns it from the pods `observe` counts.
            tie_order: Node names policies prefer on equal scores, in this order; the
                other nodes follow by name.
            colocation: The co-location rules for shares (default: budget 1.10x).
        """
        self.assume_ttl_s = assume_ttl_s
        self.colocation = colocation or Colocation()
        self.nodes: dict[str, NodeInfo] = {}
        self.holdings: dict[str, Holding] = {}
        self._pending: set[str] = set()
        self._state: ClusterState | None = None
        self._index: dict[str, int] = {}
        self._frag: FragTracker | None = None
        self._fixed_typical = list(typical) if typical else None
        self._shapes: Counter[Shape] = Counter()
        self._seen: set[str] = set()
        self._observed = 0
        self._mix: list[TypicalPod] = []
        self._mix_at = 0
        self._tie_order = {name: i for i, name in enumerate(tie_order or ())}
        self._rank: IntArray | None = None
        self._offer_key: tuple[ClusterState, list[str], BoolArray] | None = None
        self._rng = np.random.default_rng(0)

    # ------------------------------------------------------------------ nodes
    def upsert_node(self, info: NodeInfo) -> None:
        """Add or update a node; the arrays are rebuilt only when its `shape` changes."""
        old = self.nodes.get(info.name)
        self.nodes[info.name] = info
        if old is None or old.shape() != info.shape():
            self._state = None  # rebuilt, with every holding re-applied, on next read

    def remove_node(self, name: str) -> None:
        """Drop a node (arrays rebuilt on next read); its holdings count again if it returns."""
        if self.nodes.pop(name, None) is not None:
            self._state = None

    # ------------------------------------------------------------------ arrays
    def state(self) -> ClusterState:
        """The live arrays (valid while the caller holds its lock); rebuilt when nodes change."""
        if self._state is None:
            self._rebuild()
        assert self._state is not None
        return self._state

    def snapshot(self) -> ClusterState:
        """A frozen copy of the arrays, for a decision that outlives the caller's lock."""
        return self.state().copy()

    def index(self, name: str) -> int | None:
        """The node's index in the arrays, or None if the cache does not know it."""
        self.state()
        return self._index.get(name)

    def _rebuild(self) -> None:
        infos = [self.nodes[n] for n in sorted(self.nodes)]
        models = sorted({x.gpu_model for x in infos if x.gpu_count})
        index = {m: i for i, m in enumerate(models)}
        width = max((x.gpu_count for x in infos), default=0)
        count = np.array([x.gpu_count for x in infos], dtype=np.int64)
        gpu_left = np.zeros((len(infos), max(width, 1)), dtype=np.int64)
        gpu_left[np.arange(max(width, 1))[None, :] < count[:, None]] = MILLI
        mem_cap = np.array([x.gpu_memory_mib for x in infos], dtype=np.int64)
        gpu_mem_left = np.where(gpu_left > 0, mem_cap[:, None], 0)
        cpu = np.array([x.cpu_milli for x in infos], dtype=np.int64)
        mem = np.array([x.memory_mib for x in infos], dtype=np.int64)
        self._state = ClusterState(
            names=[x.name for x in infos],
            models=models,
            model_idx=np.array(
                [index[x.gpu_model] if x.gpu_count else -1 for x in infos], dtype=np.int64
            ),
            gpu_count=count,
            cpu_cap=cpu,
            mem_cap=mem,
            cpu_left=cpu.copy(),
            mem_left=mem.copy(),
            gpu_left=gpu_left,
            gpu_mem_left=gpu_mem_left,
        )
        self._index = {x.name: i for i, x in enumerate(infos)}
        if self._tie_order:  # named nodes first, in the given order; the rest by name
            big = len(self._tie_order)
            self._rank = np.array(
                [self._tie_order.get(x.name, big + i) for i, x in enumerate(infos)],
                dtype=np.int64,
            )
        self._frag = None
        for key, holding in self.holdings.items():
            self._take(key, holding, 1)

    def _take(self, key: str, h: Holding, sign: int) -> None:
        st = self._state
        if st is None:
            return  # applied when the arrays are next built
        i = self._index.get(h.node)
        if i is None:
            return  # the node's own event re-applies it when the node arrives
        gpus = tuple(g for g in h.gpu_indices if 0 <= g < st.gpu_count[i])
        st.take(
            i,
            h.cpu_milli,
            h.memory_mib,
            gpus,
            milli=h.gpu_milli,
            gpu_mem=h.gpu_memory_mib,
            sign=sign,
            tag=h.tag(key),
        )
        if self._frag is not None:
            self._frag.refresh(i)

    # ------------------------------------------------------------------ typical mix
    def observe(self, key: str, req: PodRequest) -> None:
        """Count a pod's request shape (once per pod) toward the expected mix."""
        if key in self._seen:
            return
        if len(self._seen) > SEEN_LIMIT:
            self._seen.clear()
        self._seen.add(key)
        self._shapes[shape_of(req)] += 1
        self._observed += 1

    def typical(self, fallback: PodRequest | None = None) -> list[TypicalPod]:
        """The expected request mix: fixed at start, or learned from the pods seen."""
        if self._fixed_typical is not None:
            return self._fixed_typical
        seen = self._observed
        # every new pod while the sample is small, then every 10 % more pods
        if seen != self._mix_at and seen - self._mix_at >= max(1, self._mix_at // 10):
            self._mix = typical_from_counts(self._shapes)
            self._mix_at = seen
        if not self._mix and fallback is not None:
            return typical_from_counts(Counter([shape_of(fallback)]))
        return self._mix

    def context(self, fallback: PodRequest | None = None) -> Context:
        """What a policy reads: the arrays, fragmentation tables, randomness, tie order."""
        st = self.state()
        mix = self.typical(fallback)
        if self._frag is None or self._frag.model.typical != mix:
            self._frag = FragTracker(FragModel(mix, st.models), st)
        return Context(state=st, frag=self._frag, rng=self._rng, rank=self._rank)

    # ------------------------------------------------------------------ fit
    def fit(self, node: str, req: PodRequest) -> tuple[int, ...] | Reason:
        """The GPUs this node would give the request now (tightest / first free), or why not."""
        st = self.state()
        i = self._index.get(node)
        if i is None:
            return _unknown(node)
        spec = st.spec(req)
        why = self._why_not(st, spec, req, i)
        if why is not None:
            return why
        if spec.milli == 0:
            return ()
        if spec.is_share:
            usable = usable_gpus(self.colocation, st, i, spec)
            if isinstance(usable, Reason):
                return usable
            left = st.gpu_left[i]
            return (min(usable, key=lambda g: (int(left[g]), g)),)
        return st.first_free_gpus(i, spec.num_gpus)

    def _why_not(self, st: ClusterState, spec: PodSpec, req: PodRequest, i: int) -> Reason | None:
        info = self.nodes[st.names[i]]
        if spec.num_gpus:
            if info.gpu_count == 0:
                return Reason(code="NoGpus", message="node has no GPUs", unresolvable=True)
            if not req.allows(info.gpu_model):
                return Reason(
                    code="InsufficientModel",
                    message=f"GPU model {info.gpu_model or 'none'} is not one of "
                    f"{', '.join(req.gpu_models)}",
                    unresolvable=True,
                )
            if info.gpu_count < spec.num_gpus:
                return Reason(
                    code="TooFewGpus",
                    message=f"node has {info.gpu_count} GPU(s) in total, "
                    f"pod needs {req.describe_gpus()}",
                    unresolvable=True,
                )
            if spec.gpu_mem and info.gpu_memory_mib < spec.gpu_mem:
                return Reason(
                    code="GpuMemory",
                    message=f"GPU memory {info.gpu_memory_mib} MiB < requested {spec.gpu_mem} MiB",
                    unresolvable=True,
                )
        if st.cpu_left[i] < spec.cpu:
            return Reason(
                code="InsufficientCpu", message=f"less than the pod's {spec.cpu}m CPU is free"
            )
        if st.mem_left[i] < spec.mem:
            return Reason(
                code="InsufficientMemory",
                message=f"less than the pod's {spec.mem} MiB memory is free",
            )
        if spec.is_share:
            usable = usable_gpus(self.colocation, st, i, spec)
            if isinstance(usable, Reason):
                return usable
            if not usable:
                return Reason(
                    code="InsufficientGpu", message=f"no GPU has {req.describe_gpus()} free"
                )
        elif spec.num_gpus and st.full_free[i] < spec.num_gpus:
            return Reason(
                code="InsufficientGpu",
                message=f"{int(st.full_free[i])} of {info.gpu_count} GPUs free, "
                f"pod needs {spec.num_gpus}",
            )
        return None

    def fit_exact(
        self, node: str, req: PodRequest, gpus: tuple[int, ...]
    ) -> tuple[int, ...] | Reason:
        """These exact GPUs for the request (a batch plan's choice), or why not."""
        first = self.fit(node, req)
        if isinstance(first, Reason):
            return first
        st = self.state()
        i = self._index[node]
        count = int(st.gpu_count[i])
        if len(gpus) != req.num_gpus or not all(0 <= g < count for g in gpus):
            return Reason(
                code="PlanMismatch",
                message=f"planned GPUs {list(gpus)} do not match the request on {node}",
                unresolvable=True,
            )
        spec = st.spec(req)
        for g in gpus:
            if spec.is_share:
                if not st.gpu_fits(i, g, spec):
                    return Reason(
                        code="InsufficientGpu",
                        message=f"planned GPU {g} has not {req.describe_gpus()} free",
                    )
                verdict = gpu_verdict(self.colocation, st, i, g, spec)
                if isinstance(verdict, Reason):
                    return verdict
            elif st.gpu_left[i, g] < MILLI:
                return Reason(code="InsufficientGpu", message=f"planned GPU {g} is in use")
        return gpus

    def free_whole(self, node: str) -> int:
        """How many GPUs of the node are untouched."""
        i = self.index(node)
        return 0 if i is None else int(self.state().full_free[i])

    # ------------------------------------------------------------------ decide
    def place(
        self,
        key: str,
        req: PodRequest,
        node_names: Sequence[str],
        policy: Policy,
        now: float,
    ) -> Placement | dict[str, Reason]:
        """Let `policy` choose among `node_names` and assume its choice; else why each fails.

        The candidates are the nodes of `node_names` where the pod fits now, as
        the simulator's `feasible`; the policy picks exactly as in the
        simulator, under the co-location rules (`solver.colocation.choose`, which
        also takes the tightest GPU with room where the policy's share GPU lacks
        device memory: openb has none, so the policies do not look). The
        placement's `gpu_milli` is what the pod holds: a BestEffort share's
        compute bounded by the rules.
        """
        decision = self._decide(self.context(req), req, self._offered(node_names), policy)
        if decision is None:
            return self.reasons(req, node_names)
        st = self.state()
        choice = self.assume(key, st.names[decision.node], req, now, decision.gpus)
        if isinstance(choice, Reason):  # an earlier bind of the same pod is under way
            return {n: choice for n in node_names}
        return Placement(
            pod=key,
            node=st.names[decision.node],
            gpu_indices=choice,
            gpu_milli=self.holdings[key].gpu_milli,
        )

    def trial(
        self, reqs: Sequence[PodRequest], node_names: Sequence[str], policy: Policy
    ) -> tuple[list[Decision | None], ClusterState]:
        """Where `policy` would put `reqs`, one after another, among `node_names` now.

        `place`'s decision for each in turn, on a copy of the arrays (nothing is held
        and the live arrays do not change): per request its decision, None where no
        node takes it; and the copy with all placed ones taken.
        """
        st = self.snapshot()
        if not reqs:
            return [], st
        live = self.context(reqs[0])
        frag = FragTracker(live.frag.model, st) if live.frag is not None else None
        ctx = Context(state=st, frag=frag, rng=np.random.default_rng(0), rank=live.rank)
        offered = self._offered(node_names)
        out: list[Decision | None] = []
        for req in reqs:
            decision = self._decide(ctx, req, offered, policy)
            out.append(decision)
            if decision is not None:
                st.assign(decision.node, decision.pod, decision.gpus)
                if frag is not None:
                    frag.refresh(decision.node)
        return out, st

    def _decide(
        self, ctx: Context, req: PodRequest, offered: BoolArray, policy: Policy
    ) -> Decision | None:
        """The policy's choice for `req` on `ctx`'s arrays, or None where no node takes it.

        Among the `offered` nodes it fits now, under the co-location rules.
        """
        st = ctx.state
        spec = st.spec(req)
        cand = np.flatnonzero(st.feasible_mask(spec) & offered)
        if len(cand) == 0:
            return None
        return choose(policy, ctx, spec, cand, self.colocation)

    def _offered(self, node_names: Sequence[str]) -> BoolArray:
        """Per node: is it among `node_names` (the last list is kept: it rarely changes)."""
        last = self._offer_key
        if last is not None and last[0] is self._state and last[1] == node_names:
            return last[2]
        st = self.state()
        mask = np.zeros(st.n, dtype=np.bool_)
        for name in node_names:
            i = self._index.get(name)
            if i is not None:
                mask[i] = True
        self._offer_key = (st, list(node_names), mask)
        return mask

    def reasons(self, req: PodRequest, node_names: Sequence[str]) -> dict[str, Reason]:
        """Why each of `node_names` cannot take the request now."""
        st = self.state()
        spec = st.spec(req)
        out: dict[str, Reason] = {}
        memo: dict[tuple[int, ...], Reason] = {}
        for name in node_names:
            i = self._index.get(name)
            if i is None:
                out[name] = _unknown(name)
                continue
            # nodes in the same state get the same words: compute them once
            sig = (
                int(st.model_idx[i]),
                int(st.gpu_count[i]),
                int(st.full_free[i]),
                int(st.cpu_left[i] >= spec.cpu),
                int(st.mem_left[i] >= spec.mem),
                int(st.max_left[i]),
            )
            hit = memo.get(sig) if not spec.is_share else None
            why = hit or self._why_not(st, spec, req, i)
            if why is None:
                why = Reason(code="PolicyChoseOther", message=_CHOSE_OTHER)
            if not spec.is_share:
                memo[sig] = why
            out[name] = why
        return out

    # ------------------------------------------------------------------ holdings
    def assume(
        self,
        key: str,
        node: str,
        req: PodRequest,
        now: float,
        gpus: tuple[int, ...] | None = None,
    ) -> tuple[int, ...] | Reason:
        """Hold a pod's resources on `node` (the given GPUs, or the node's own pick).

        A pod already bound is refused. So is one whose earlier bind is still
        under way: that bind may yet succeed, so its GPUs stay held. An older
        assumption with no bind under way (a filter whose cycle ended) is replaced.
        """
        existing = self.holdings.get(key)
        if existing is not None:
            if existing.bound:
                return Reason(
                    code="AlreadyBound",
                    message=f"pod is already bound to {existing.node}",
                    unresolvable=True,
                )
            if existing.binding:
                return Reason(
                    code="BindInFlight",
                    message=f"an earlier bind of this pod to {existing.node} is still in flight",
                )
            self.forget(key)
        choice = self.fit(node, req) if gpus is None else self.fit_exact(node, req, gpus)
        if isinstance(choice, Reason):
            return choice
        milli = req.gpu_milli
        if req.is_share:  # the rules may bound a BestEffort share's compute
            st = self.state()
            spec = st.spec(req)
            percent = gpu_verdict(self.colocation, st, self._index[node], choice[0], spec)
            if isinstance(percent, Reason):  # fit and fit_exact checked: cannot happen
                return percent
            if percent < spec.percent:
                milli = percent * MILLI // 100
        self._apply(
            key,
            Holding(
                node,
                choice,
                milli,
                req.gpu_memory_mib if req.is_share else 0,
                req.cpu_milli,
                req.memory_mib,
                bound=False,
                expires_at=now + self.assume_ttl_s,
                priority=req.gpu_priority if req.is_share else None,
                profile=req.gpu_profile,
            ),
        )
        return choice

    def binding(self, key: str) -> Holding | None:
        """Mark an assumption as being bound (it no longer expires); returns it."""
        holding = self.holdings.get(key)
        if holding is None or holding.bound:
            return holding
        self.holdings[key] = replace(holding, binding=True)
        return self.holdings[key]

    def confirm(self, key: str) -> None:
        """The binding succeeded: the holding no longer expires."""
        holding = self.holdings.get(key)
        if holding is not None and not holding.bound:
            self.holdings[key] = replace(holding, bound=True, binding=False, expires_at=0.0)
            self._pending.discard(key)

    def record_bound(self, key: str, holding: Holding) -> None:
        """A pod the cluster shows bound (cache rebuild, watch events): the truth."""
        holding = replace(holding, bound=True, binding=False, expires_at=0.0)
        existing = self.holdings.get(key)
        if existing is not None:
            if replace(existing, bound=True, binding=False, expires_at=0.0) == holding:
                self.confirm(key)
                return
            self.forget(key)
        self._apply(key, holding)

    def forget(self, key: str, *, only: tuple[str, tuple[int, ...]] | None = None) -> None:
        """Release a pod's holding; with `only` (node, gpus), only if it holds exactly those."""
        holding = self.holdings.get(key)
        if holding is None:
            return
        if only is not None and (holding.node, holding.gpu_indices) != only:
            return  # a newer try of the same pod holds other GPUs: keep them
        del self.holdings[key]
        self._pending.discard(key)
        self._take(key, holding, -1)

    def expire(self, now: float) -> list[str]:
        """Drop assumptions whose bind never came; returns the keys forgotten."""
        stale = [
            k
            for k in self._pending
            if not self.holdings[k].binding and self.holdings[k].expires_at <= now
        ]
        for key in stale:
            self.forget(key)
        return stale

    def first_free(self, node: str, count: int) -> tuple[int, ...]:
        """Up to `count` untouched GPUs of the node, by index (for pods bound without indices)."""
        i = self.index(node)
        return () if i is None else self.state().first_free_gpus(i, count)

    def _apply(self, key: str, holding: Holding) -> None:
        self.holdings[key] = holding
        if holding.bound:
            self._pending.discard(key)
        else:
            self._pending.add(key)
        self._take(key, holding, 1)
