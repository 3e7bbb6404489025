"""An in-memory `AllocationStore`: nodes' lock annotations and pods' annotations in dicts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from chronotope.sharing.assignment import (
    ALLOCATION_LOCK,
    HANDSHAKE,
    GpuAssignment,
    PodRecord,
    format_lock,
    gpu_uuid,
    parse_lock,
)
from chronotope.sharing.labels import SCHEDULER_NAME

__all__ = ["FakeStore", "assignment"]


def assignment(
    node: str,
    indices: tuple[int, ...],
    handshake: str,
    memory_mib: int | None = 8192,
    compute_percent: int | None = 30,
) -> GpuAssignment:
    return GpuAssignment(
        node=node,
        gpu_indices=indices,
        gpu_uuids=tuple(gpu_uuid(node, i) for i in indices),
        memory_mib=memory_mib,
        compute_percent=compute_percent,
        handshake=handshake,
    )


@dataclass
class FakeStore:
    """Plays the API server: `node_annotations[node]`, `pods[(ns, name)] = (node, annotations)`."""

    node_annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[tuple[str, str], tuple[str, dict[str, str]]] = field(default_factory=dict)
    schedulers: dict[tuple[str, str], str] = field(default_factory=dict)

    # --- what the binder does -----------------------------------------------------
    def bind(
        self,
        name: str,
        a: GpuAssignment,
        *,
        namespace: str = "default",
        scheduler: str = SCHEDULER_NAME,
    ) -> None:
        self.pods[(namespace, name)] = (a.node, a.to_annotations())
        self.schedulers[(namespace, name)] = scheduler

    def lock(self, node: str, handshake: str, now: float = 1000.0) -> None:
        self.node_annotations.setdefault(node, {})[ALLOCATION_LOCK] = format_lock(handshake, now)

    def pod_annotations(self, name: str, namespace: str = "default") -> dict[str, str]:
        return self.pods[(namespace, name)][1]

    # --- the AllocationStore seam -------------------------------------------------
    def read_node_lock(self, node: str) -> str | None:
        return self.node_annotations.get(node, {}).get(ALLOCATION_LOCK)

    def find_pods_by_handshake(self, node: str, handshake: str) -> list[PodRecord]:
        return [
            PodRecord(ns, name, dict(annotations), self.schedulers.get((ns, name), ""))
            for (ns, name), (pod_node, annotations) in self.pods.items()
            if pod_node == node and annotations.get(HANDSHAKE) == handshake
        ]

    def mark_consumed(self, pod: PodRecord, annotations: Mapping[str, str]) -> None:
        self.pods[(pod.namespace, pod.name)][1].update(annotations)

    def release_node_lock(self, node: str, handshake: str) -> bool:
        held = parse_lock(self.read_node_lock(node))
        if held is None or held[0] != handshake:
            return False
        del self.node_annotations[node][ALLOCATION_LOCK]
        return True
