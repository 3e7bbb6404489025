"""Pure GPU accounting for the extender: who holds which GPU, and what is left.

The ledger is rebuilt from the cluster (bound pods' assignment annotations are
the truth) and updated as pods are assumed, bound and deleted. It never talks
to the API server; the service feeds it from a watch-fed cache and serialises
access per node, so two pods filtered at the same time can never both get the
same GPU (the HAMi #2232 failure): the GPU choice is made, and held, at
`assume` time under the node's lock, and a second `assume` sees the first.

Units: compute share in milli-GPU (1000 = a whole GPU), memory in MiB.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = [
    "MILLI",
    "GpuRequest",
    "GpuSlot",
    "Holding",
    "Ledger",
    "NoFit",
    "NodeEntry",
]

MILLI = 1000


@dataclass(frozen=True)
class GpuRequest:
    """What a pod asks of GPUs. `share_milli` < 1000 (with count 1) is a GPU share."""

    count: int
    share_milli: int = MILLI
    memory_mib: int = 0
    """Device memory per GPU for a share (0: no memory bound)."""
    models: tuple[str, ...] = ()
    """Allowed GPU models; empty means any."""

    @property
    def is_share(self) -> bool:
        return self.count == 1 and self.share_milli < MILLI

    def describe(self) -> str:
        if self.is_share:
            mem = f", {self.memory_mib} MiB" if self.memory_mib else ""
            # no "%": kube-scheduler passes extender reasons through Go fmt
            return f"{self.share_milli / 10:g} percent of one GPU{mem}"
        return f"{self.count} whole GPU{'s' if self.count != 1 else ''}"


@dataclass
class GpuSlot:
    index: int
    memory_mib: int
    used_milli: int = 0
    used_memory_mib: int = 0

    @property
    def free_milli(self) -> int:
        return MILLI - self.used_milli

    @property
    def free_memory_mib(self) -> int:
        return self.memory_mib - self.used_memory_mib


@dataclass
class NodeEntry:
    name: str
    model: str
    gpus: list[GpuSlot]
    unschedulable: bool = False
    device_plugin: bool = False
    """The node runs Chronotope's device plugin (binds then take its allocation lock)."""
    _free: tuple[int, ...] | None = field(default=None, repr=False, compare=False)

    def free_whole(self) -> tuple[int, ...]:
        """Indices of untouched GPUs; cached (every filter asks every node) until `changed`."""
        if self._free is None:
            self._free = tuple(
                g.index for g in self.gpus if g.used_milli == 0 and g.used_memory_mib == 0
            )
        return self._free

    def changed(self) -> None:
        self._free = None


@dataclass(frozen=True)
class Holding:
    """GPUs held by one pod: assumed (between filter/bind) or bound."""

    node: str
    gpu_indices: tuple[int, ...]
    milli: int
    memory_mib: int
    bound: bool
    expires_at: float = 0.0


@dataclass(frozen=True)
class NoFit:
    """Why a node cannot take a request, in words kube-scheduler shows users."""

    message: str
    unresolvable: bool = False
    """True when no amount of waiting helps (wrong GPU model, too few GPUs in total)."""


@dataclass
class Ledger:
    nodes: dict[str, NodeEntry] = field(default_factory=dict)
    holdings: dict[str, Holding] = field(default_factory=dict)
    assume_ttl_s: float = 60.0
    _pending: set[str] = field(default_factory=set)
    """Keys of unbound holdings: `expire` (on every filter) scans only these."""

    # ------------------------------------------------------------------ nodes
    def upsert_node(
        self,
        name: str,
        model: str,
        gpu_count: int,
        memory_mib: int,
        *,
        unschedulable: bool = False,
        device_plugin: bool = False,
    ) -> None:
        entry = self.nodes.get(name)
        if entry is not None and entry.model == model and len(entry.gpus) == gpu_count:
            entry.unschedulable = unschedulable
            entry.device_plugin = device_plugin
            for gpu in entry.gpus:
                gpu.memory_mib = memory_mib
            return
        self.nodes[name] = NodeEntry(
            name,
            model,
            [GpuSlot(i, memory_mib) for i in range(gpu_count)],
            unschedulable,
            device_plugin,
        )
        for key, holding in list(self.holdings.items()):  # re-apply holdings on a rebuilt node
            if holding.node == name:
                del self.holdings[key]
                self._apply(key, holding)

    def remove_node(self, name: str) -> None:
        self.nodes.pop(name, None)

    # ------------------------------------------------------------------ fit
    def fit(self, node_name: str, req: GpuRequest) -> tuple[int, ...] | NoFit:
        """The GPUs this node would give the request now, or why it cannot."""
        node = self.nodes.get(node_name)
        if node is None:
            return NoFit(f"node {node_name} is not known to the chronotope extender", True)
        if req.models and node.model not in req.models:
            return NoFit(
                f"GPU model {node.model or 'none'} is not one of {', '.join(req.models)}", True
            )
        if len(node.gpus) < req.count:
            return NoFit(
                f"node has {len(node.gpus)} GPU(s) in total, pod needs {req.describe()}", True
            )
        if req.is_share:
            if req.memory_mib and node.gpus and node.gpus[0].memory_mib < req.memory_mib:
                return NoFit(
                    f"GPU memory {node.gpus[0].memory_mib} MiB < requested {req.memory_mib} MiB",
                    True,
                )
            fitting = [
                g
                for g in node.gpus
                if g.free_milli >= req.share_milli and g.free_memory_mib >= req.memory_mib
            ]
            if not fitting:
                return NoFit(f"no GPU has {req.describe()} free")
            # best fit: the fullest GPU that still fits keeps whole GPUs whole
            best = min(fitting, key=lambda g: (g.free_milli, g.free_memory_mib, g.index))
            return (best.index,)
        free = node.free_whole()
        if len(free) < req.count:
            return NoFit(f"{len(free)} of {len(node.gpus)} GPUs free, pod needs {req.count}")
        return tuple(free[: req.count])

    # ------------------------------------------------------------------ pods
    def fit_exact(
        self, node_name: str, req: GpuRequest, gpus: tuple[int, ...]
    ) -> tuple[int, ...] | NoFit:
        """These exact GPUs for the request (a batch plan's choice), or why not."""
        first = self.fit(node_name, req)
        if isinstance(first, NoFit):
            return first
        node = self.nodes[node_name]
        if len(gpus) != req.count or not all(0 <= i < len(node.gpus) for i in gpus):
            return NoFit(f"planned GPUs {list(gpus)} do not match the request on {node_name}", True)
        for i in gpus:
            gpu = node.gpus[i]
            if req.is_share:
                if gpu.free_milli < req.share_milli or gpu.free_memory_mib < req.memory_mib:
                    return NoFit(f"planned GPU {i} has not {req.describe()} free")
            elif gpu.used_milli or gpu.used_memory_mib:
                return NoFit(f"planned GPU {i} is in use")
        return gpus

    def assume(
        self,
        pod_key: str,
        node_name: str,
        req: GpuRequest,
        now: float | None = None,
        gpus: tuple[int, ...] | None = None,
    ) -> tuple[int, ...] | NoFit:
        """Choose (or take the planned `gpus`) and hold GPUs for a pod about to be bound.

        A pod that already holds GPUs is refused: if it is bound, a new bind is a
        mistake; if an earlier try is still in flight (kube-scheduler gave up waiting
        and retried), releasing that try's GPUs now would let them be given away while
        the earlier binding may still succeed. The retry waits for the earlier try to
        finish (or its assumption to expire).
        """
        existing = self.holdings.get(pod_key)
        if existing is not None:
            if existing.bound:
                return NoFit(f"pod is already bound to {existing.node}", unresolvable=True)
            return NoFit(f"an earlier bind of this pod to {existing.node} is still in flight")
        choice = self.fit(node_name, req) if gpus is None else self.fit_exact(node_name, req, gpus)
        if isinstance(choice, NoFit):
            return choice
        now = time.monotonic() if now is None else now
        self._apply(
            pod_key,
            Holding(
                node_name,
                choice,
                req.share_milli,
                req.memory_mib if req.is_share else 0,
                bound=False,
                expires_at=now + self.assume_ttl_s,
            ),
        )
        return choice

    def confirm(self, pod_key: str) -> None:
        """The binding succeeded: the holding no longer expires."""
        holding = self.holdings.get(pod_key)
        if holding is not None and not holding.bound:
            self.holdings[pod_key] = Holding(
                holding.node, holding.gpu_indices, holding.milli, holding.memory_mib, bound=True
            )
            self._pending.discard(pod_key)

    def record_bound(
        self,
        pod_key: str,
        node_name: str,
        gpu_indices: tuple[int, ...],
        milli: int,
        memory_mib: int,
    ) -> None:
        """A pod the cluster shows bound with an assignment (cache rebuild, watch events)."""
        existing = self.holdings.get(pod_key)
        if existing is not None:
            if existing.bound and existing.node == node_name:
                return
            self.forget(pod_key)
        self._apply(pod_key, Holding(node_name, gpu_indices, milli, memory_mib, bound=True))

    def forget(self, pod_key: str, *, only: tuple[str, tuple[int, ...]] | None = None) -> None:
        """Release a pod's GPUs; with `only` (node, gpus), only if it still holds exactly those."""
        holding = self.holdings.get(pod_key)
        if holding is None:
            return
        if only is not None and (holding.node, holding.gpu_indices) != only:
            return  # a newer try of the same pod holds other GPUs: keep them
        del self.holdings[pod_key]
        self._pending.discard(pod_key)
        node = self.nodes.get(holding.node)
        if node is None:
            return
        for gpu in node.gpus:
            if gpu.index in holding.gpu_indices:
                gpu.used_milli = max(0, gpu.used_milli - holding.milli)
                gpu.used_memory_mib = max(0, gpu.used_memory_mib - holding.memory_mib)
        node.changed()

    def expire(self, now: float | None = None) -> list[str]:
        """Drop assumptions whose bind never came; returns the pod keys forgotten."""
        now = time.monotonic() if now is None else now
        stale = [k for k in self._pending if self.holdings[k].expires_at <= now]
        for key in stale:
            self.forget(key)
        return stale

    def _apply(self, pod_key: str, holding: Holding) -> None:
        self.holdings[pod_key] = holding
        if holding.bound:
            self._pending.discard(pod_key)
        else:
            self._pending.add(pod_key)
        node = self.nodes.get(holding.node)
        if node is None:
            return  # the node's own event will re-apply holdings when it arrives
        for gpu in node.gpus:
            if gpu.index in holding.gpu_indices:
                gpu.used_milli += holding.milli
                gpu.used_memory_mib += holding.memory_mib
        node.changed()

    # ------------------------------------------------------------------ views
    def used_gpus(self, node_name: str) -> int:
        node = self.nodes.get(node_name)
        return 0 if node is None else sum(1 for g in node.gpus if g.used_milli > 0)
