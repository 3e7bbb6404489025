"""Allocate: find the pod by its handshake, answer with its environment, mark it consumed.

The kubelet's Allocate names device IDs, never the pod. We do not guess the
pod from the request size (two same-size pods landing together would get each
other's GPUs); the binder holds the node's allocation lock for exactly one
pending pod, and we allocate that pod:

    node lock -> handshake -> the pod on this node with that handshake and
    `allocation=pending` -> check the request against its assignment ->
    environment -> mark the pod consumed -> release the lock.

The assignment is honoured only on a pod of the chronotope scheduler: only
its binder writes assignments (through the Binding; an admission policy
refuses them from anyone else, docs/security.md). The kubelet's device IDs are
checked against it too: `GetPreferredAllocation` offers one slot on each
assigned GPU, and the kubelet takes an offer whose devices are free, so a
request on other GPUs after such an offer is not for this pod and is refused.
When the kubelet had no free slot on an assigned GPU (the scheduler packs
shares by memory and compute, not by the K slots per GPU the kubelet counts),
or no offer was made, the assignment decides and the mismatch is logged.

A request that does not fit is refused with a reason (a value, not an
exception); the gRPC layer turns it into an error the kubelet logs and the
pod's admission fails with. API-server access goes through `AllocationStore`,
a narrow seam implemented by `chronotope.kube.allocation` and by in-memory
fakes in tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from chronotope.deviceplugin.devices import DeviceInventory, gpu_of
from chronotope.sharing.assignment import (
    ALLOCATION,
    AllocationState,
    GpuAssignment,
    PodRecord,
    allocation_state,
    consumed_annotations,
    parse_lock,
)
from chronotope.sharing.labels import SCHEDULER_NAME

__all__ = [
    "ENV_GPU_PRIORITY",
    "ENV_GPU_PROFILE",
    "ENV_HANDSHAKE",
    "ENV_MPS_MEMORY_LIMIT",
    "ENV_MPS_THREAD_PERCENTAGE",
    "ENV_VISIBLE_DEVICES",
    "AllocationStore",
    "Allocator",
    "Granted",
    "Refused",
    "container_env",
]

log = logging.getLogger(__name__)

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_HANDSHAKE = "CHRONOTOPE_HANDSHAKE"
ENV_GPU_PRIORITY = "CHRONOTOPE_GPU_PRIORITY"
"""A share's priority class (high | best-effort), for a kernel-level runtime such as Orion's."""
ENV_GPU_PROFILE = "CHRONOTOPE_GPU_PROFILE"
"""A share's profile (compute-bound | memory-bound | unknown) as the scheduler placed it."""


class AllocationStore(Protocol):
    """The API-server operations Allocate needs (see `chronotope.kube.allocation`)."""

    def read_node_lock(self, node: str) -> str | None:
        """The node's `chronotope.dev/allocation-lock` annotation, if any."""
        ...

    def find_pods_by_handshake(self, node: str, handshake: str) -> list[PodRecord]:
        """Pods bound to `node` whose `chronotope.dev/handshake` is `handshake`."""
        ...

    def mark_consumed(self, pod: PodRecord, annotations: Mapping[str, str]) -> None:
        """Merge `annotations` into the pod's (allocation=consumed, allocated-at)."""
        ...

    def release_node_lock(self, node: str, handshake: str) -> bool:
        """Remove the node lock if it still holds `handshake`; True when removed."""
        ...


@dataclass(frozen=True, slots=True)
class Granted:
    """Allocate succeeded: the pod it was for, its assignment and the container env."""

    pod: PodRecord
    assignment: GpuAssignment
    envs: dict[str, str]
    lock_released: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """Allocate was refused; `reason` says why (logged and sent to the kubelet)."""

    reason: str
    pod: PodRecord | None = None


def container_env(assignment: GpuAssignment) -> dict[str, str]:
    """The environment contract: what a container with this assignment sees.

    MPS limits are per *visible* device, so the memory limit is indexed
    0..n-1 in `NVIDIA_VISIBLE_DEVICES` order, not by host GPU index. The
    compute percent is the one assigned (a BestEffort share beside a High one
    gets what the co-location rules allow); a share that states a priority
    also sees it and its profile (MPS itself knows no priorities).
    """
    envs = {
        ENV_VISIBLE_DEVICES: ",".join(assignment.gpu_uuids),
        ENV_HANDSHAKE: assignment.handshake,
    }
    if assignment.compute_percent is not None:
        envs[ENV_MPS_THREAD_PERCENTAGE] = str(assignment.compute_percent)
    if assignment.memory_mib is not None:
        envs[ENV_MPS_MEMORY_LIMIT] = ",".join(
            f"{i}={assignment.memory_mib}M" for i in range(len(assignment.gpu_uuids))
        )
    if assignment.priority is not None:
        envs[ENV_GPU_PRIORITY] = assignment.priority
    if assignment.profile is not None:
        envs[ENV_GPU_PROFILE] = assignment.profile
    return envs


@dataclass
class Allocator:
    """Answers Allocate (and the GetPreferredAllocation hint) for one node.

    Calls are serialised: the lock protocol admits one pending pod per node,
    and serialising here makes "answer, mark consumed, release" one step as
    seen by a concurrent second call.
    """

    store: AllocationStore
    node: str
    inventory: DeviceInventory
    clock: Callable[[], float] = time.time
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _offered: tuple[str, bool] | None = field(default=None, repr=False)
    """The last GetPreferredAllocation: its pod's handshake, and whether every GPU of the
    pod's assignment had a free slot among the kubelet's available devices."""

    def pending(self) -> tuple[PodRecord, GpuAssignment] | Refused:
        """The pod holding this node's allocation lock, with its parsed assignment."""
        lock = self.store.read_node_lock(self.node)
        parsed = parse_lock(lock)
        if parsed is None:
            why = "no allocation lock" if not lock else f"unreadable allocation lock {lock!r}"
            return Refused(f"node {self.node} has {why}: no pod is waiting for devices")
        handshake = parsed[0]
        pods = self.store.find_pods_by_handshake(self.node, handshake)
        if not pods:
            return Refused(f"no pod on node {self.node} carries the lock's handshake {handshake}")
        pending = [p for p in pods if allocation_state(p.annotations) is AllocationState.PENDING]
        if not pending:
            return Refused(
                f"pod {pods[0].key} with handshake {handshake} is not pending "
                f"({ALLOCATION}={pods[0].annotations.get(ALLOCATION)!r})",
                pods[0],
            )
        if len(pending) > 1:
            names = ", ".join(p.key for p in pending)
            return Refused(f"handshake {handshake} is ambiguous: pods {names}")
        pod = pending[0]
        if pod.scheduler_name != SCHEDULER_NAME:
            return Refused(
                f"pod {pod.key} has schedulerName {pod.scheduler_name!r}, not "
                f"{SCHEDULER_NAME!r}: only the chronotope scheduler's assignments are honoured",
                pod,
            )
        try:
            assignment = GpuAssignment.from_annotations(pod.annotations)
        except ValueError as exc:
            return Refused(f"pod {pod.key} has a malformed assignment: {exc}", pod)
        if assignment.handshake != handshake:  # defensive: the store filtered on it
            return Refused(
                f"pod {pod.key} handshake {assignment.handshake} does not match "
                f"the node lock's {handshake}",
                pod,
            )
        if assignment.node != self.node:
            return Refused(f"pod {pod.key} is assigned to node {assignment.node}, not {self.node}")
        unknown = [u for u in assignment.gpu_uuids if u not in self.inventory.gpu_uuids]
        if unknown:
            return Refused(f"pod {pod.key} is assigned GPUs this node lacks: {unknown}", pod)
        return pod, assignment

    def prefer(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation: `size` IDs out of `available`, one slot on each assigned GPU.

        Remembers whether the pending pod's assigned GPUs all had a free slot:
        the kubelet then takes this offer, and `allocate` refuses devices elsewhere.
        Without a readable pending pod, the hint spreads over distinct GPUs.
        """
        found = self.pending()
        if isinstance(found, Refused):
            return self.inventory.preferred(available, must_include, size)
        assignment = found[1]
        free = {gpu_of(d) for d in available}
        with self._mutex:
            self._offered = (assignment.handshake, free.issuperset(assignment.gpu_uuids))
        return self.inventory.preferred(available, must_include, size, assignment.gpu_uuids)

    def allocate(self, container_requests: Sequence[Sequence[str]]) -> Granted | Refused:
        """Decide one AllocateRequest; on success the pod is consumed and the lock released."""
        with self._mutex:
            result = self._allocate(container_requests)
        if isinstance(result, Refused):
            log.warning("Allocate refused on node %s: %s", self.node, result.reason)
        else:
            log.info(
                "Allocate granted on node %s: pod %s gets %s",
                self.node,
                result.pod.key,
                result.envs,
            )
        return result

    def _allocate(self, container_requests: Sequence[Sequence[str]]) -> Granted | Refused:
        if len(container_requests) != 1:
            return Refused(
                f"expected one container per Allocate, got {len(container_requests)}: "
                "an assignment is per pod, so one container per pod may request GPUs"
            )
        devices = list(container_requests[0])
        unknown = [d for d in devices if not self.inventory.knows(d)]
        if unknown:
            return Refused(f"unknown device IDs {unknown} on node {self.node}")
        found = self.pending()
        if isinstance(found, Refused):
            return found
        pod, assignment = found
        if len(devices) != len(assignment.gpu_indices):
            return Refused(
                f"pod {pod.key} is assigned {len(assignment.gpu_indices)} GPU(s) "
                f"{list(assignment.gpu_indices)} but the kubelet requested {len(devices)} "
                f"device(s) {devices}: the request does not belong to this pod",
                pod,
            )
        requested_gpus = sorted({gpu_of(d) for d in devices})
        if requested_gpus != sorted(assignment.gpu_uuids):
            if self._offered == (assignment.handshake, True):
                return Refused(
                    f"the kubelet allocated devices {devices} on {requested_gpus}, but pod "
                    f"{pod.key} is assigned {list(assignment.gpu_uuids)}, which were offered "
                    "with free slots: the request is not for this pod",
                    pod,
                )
            # no free slot on an assigned GPU in the kubelet's count, or no offer made:
            # the kubelet's IDs are then only a count, and the assignment decides the GPUs
            log.info(
                "pod %s: kubelet picked devices on %s, assignment says %s; using the assignment",
                pod.key,
                requested_gpus,
                list(assignment.gpu_uuids),
            )
        self._offered = None
        envs = container_env(assignment)
        self.store.mark_consumed(pod, consumed_annotations(self.clock()))
        released = self.store.release_node_lock(self.node, assignment.handshake)
        if not released:
            log.warning(
                "node %s lock no longer held handshake %s when releasing it",
                self.node,
                assignment.handshake,
            )
        return Granted(pod=pod, assignment=assignment, envs=envs, lock_released=released)
