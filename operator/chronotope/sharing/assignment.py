"""The GPU assignment contract between the binder and the device plugin.

The binder decides which GPUs (and which share of them) a pod gets and writes
that decision onto the pod as annotations; the device plugin on the node reads
them back in `Allocate` and turns them into the container's environment. This
module is the one definition of those annotations, so the two sides cannot
drift apart.

For a share that states a priority the assignment also carries its priority
class and profile (`assigned-priority`, `assigned-profile`, kebab-case as in
the request annotations): the device plugin hands them to the container so a
kernel-level runtime (Orion's) can act on them.

It also defines the node-level *allocation lock*. The kubelet's `Allocate`
call names device IDs but not the pod, so a plugin that guesses the pod by
request size (the gpushare-device-plugin approach) gives two same-size pods
that land together each other's GPUs. Instead the binder, before binding a GPU
pod to a node, writes `<handshake>,<unix-time>` to the node's
`chronotope.dev/allocation-lock` annotation (optimistic concurrency on the
node's resourceVersion); the device plugin allocates exactly the pod carrying
that handshake and then releases the lock. At most one pod per node awaits
`Allocate` at a time; a lock older than its TTL may be stolen.

Everything here is pure: plain values in, plain values out.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile

__all__ = [
    "ALLOCATED_AT",
    "ALLOCATION",
    "ALLOCATION_LOCK",
    "ASSIGNED_COMPUTE_PERCENT",
    "ASSIGNED_GPUS",
    "ASSIGNED_GPU_UUIDS",
    "ASSIGNED_MEMORY_MIB",
    "ASSIGNED_NODE",
    "ASSIGNED_PRIORITY",
    "ASSIGNED_PROFILE",
    "DEVICE_PLUGIN",
    "HANDSHAKE",
    "LOCK_TTL_SECONDS",
    "PRIORITIES",
    "PROFILES",
    "AllocationState",
    "BindRequest",
    "GpuAssignment",
    "PodRecord",
    "allocation_state",
    "consumed_annotations",
    "format_lock",
    "format_timestamp",
    "gpu_uuid",
    "is_scheduler_key",
    "lock_is_stale",
    "new_handshake",
    "parse_lock",
    "share_class",
]

_PREFIX = "chronotope.dev/"
ASSIGNED_NODE = _PREFIX + "assigned-node"
ASSIGNED_GPUS = _PREFIX + "assigned-gpus"
ASSIGNED_GPU_UUIDS = _PREFIX + "assigned-gpu-uuids"
ASSIGNED_MEMORY_MIB = _PREFIX + "assigned-memory-mib"
ASSIGNED_COMPUTE_PERCENT = _PREFIX + "assigned-compute-percent"
ASSIGNED_PRIORITY = _PREFIX + "assigned-priority"
ASSIGNED_PROFILE = _PREFIX + "assigned-profile"
HANDSHAKE = _PREFIX + "handshake"
ALLOCATION = _PREFIX + "allocation"


def is_scheduler_key(key: str) -> bool:
    """Whether only the scheduler may write this pod annotation (`assigned-*`, the handshake).

    The assignment policy (charts/chronotope/templates/assignment-policy.yaml) enforces it
    at admission; code that copies user annotations onto pods drops these keys.
    """
    return key.startswith(_PREFIX + "assigned-") or key == HANDSHAKE


ALLOCATED_AT = _PREFIX + "allocated-at"
ALLOCATION_LOCK = _PREFIX + "allocation-lock"  # on the Node, not the pod
DEVICE_PLUGIN = _PREFIX + "device-plugin"
"""On the Node: the device plugin runs there (value: its API version), so binds take the lock."""

LOCK_TTL_SECONDS = 60.0
"""How long a node lock protects its pod; after that the binder may steal it."""

# Handshakes travel inside the comma-separated lock value and in env vars.
_HANDSHAKE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")

PERCENT = 100
"""A whole GPU's compute, in the percent an assignment states."""

PRIORITIES: Mapping[str, SharePriority] = {
    "high": SharePriority.HIGH,
    "best-effort": SharePriority.BEST_EFFORT,
}
"""The values of `assigned-priority` (the request's `gpu-priority`, kebab-case)."""
PROFILES: Mapping[str, WorkloadProfile] = {
    "compute-bound": WorkloadProfile.COMPUTE_BOUND,
    "memory-bound": WorkloadProfile.MEMORY_BOUND,
    "unknown": WorkloadProfile.UNKNOWN,
}
"""The values of `assigned-profile` (the request's `gpu-profile`, kebab-case)."""


def share_class(priority: SharePriority, profile: WorkloadProfile) -> tuple[str, str]:
    """A share's priority and profile as `assigned-priority` / `assigned-profile` write them."""
    return (
        next(k for k, v in PRIORITIES.items() if v is priority),
        next(k for k, v in PROFILES.items() if v is profile),
    )


class AllocationState(StrEnum):
    """Where a pod's assignment is in the handshake protocol (`chronotope.dev/allocation`)."""

    PENDING = "pending"  # written by the binder with the assignment
    CONSUMED = "consumed"  # written by the device plugin once Allocate has answered


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod as the handshake protocol sees it: its name, annotations and scheduler."""

    namespace: str
    name: str
    annotations: Mapping[str, str]
    scheduler_name: str = ""
    """The pod's `spec.schedulerName` ("" when unknown)."""

    @property
    def key(self) -> str:
        """The pod as `namespace/name`."""
        return f"{self.namespace}/{self.name}"


def gpu_uuid(node: str, index: int) -> str:
    """The UUID of GPU `index` on a simulated node: `GPU-<node>-<index>`.

    Real nodes report NVML UUIDs (`GPU-<36 hex and dashes>`); kwok nodes have
    none, so binder and device plugin agree on this convention instead.
    """
    if index < 0:
        raise ValueError(f"GPU index must be >= 0, got {index}")
    return f"GPU-{node}-{index}"


def new_handshake() -> str:
    """A fresh random handshake id (16 hex characters)."""
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """The GPUs a pod was bound to, and its share of each.

    `memory_mib` and `compute_percent` are per-GPU limits for a shared GPU;
    None means the pod owns the whole GPU(s). `priority` and `profile` (one of
    `PRIORITIES` / `PROFILES`) are set for shares that state a priority.
    """

    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    memory_mib: int | None
    compute_percent: int | None
    handshake: str
    priority: str | None = None
    profile: str | None = None

    def __post_init__(self) -> None:
        """Reject a malformed assignment; the error names the annotation at fault."""
        if not self.node:
            raise ValueError(f"{ASSIGNED_NODE}: node name is empty")
        if not self.gpu_indices:
            raise ValueError(f"{ASSIGNED_GPUS}: at least one GPU is required")
        if any(i < 0 for i in self.gpu_indices):
            raise ValueError(f"{ASSIGNED_GPUS}: GPU indices must be >= 0: {self.gpu_indices}")
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise ValueError(f"{ASSIGNED_GPUS}: GPU indices repeat: {self.gpu_indices}")
        if len(self.gpu_uuids) != len(self.gpu_indices) or not all(self.gpu_uuids):
            raise ValueError(
                f"{ASSIGNED_GPU_UUIDS}: expected {len(self.gpu_indices)} non-empty UUIDs "
                f"(one per GPU index), got {self.gpu_uuids}"
            )
        if self.memory_mib is not None and self.memory_mib <= 0:
            raise ValueError(f"{ASSIGNED_MEMORY_MIB}: must be > 0, got {self.memory_mib}")
        if self.compute_percent is not None and not 1 <= self.compute_percent <= PERCENT:
            raise ValueError(
                f"{ASSIGNED_COMPUTE_PERCENT}: must be within 1..100, got {self.compute_percent}"
            )
        if not _HANDSHAKE_RE.match(self.handshake):
            raise ValueError(
                f"{HANDSHAKE}: must be 1-63 letters, digits, '-' or '_', got {self.handshake!r}"
            )
        if self.priority is not None and self.priority not in PRIORITIES:
            raise ValueError(
                f"{ASSIGNED_PRIORITY}: must be one of {', '.join(PRIORITIES)}, "
                f"got {self.priority!r}"
            )
        if self.profile is not None and self.profile not in PROFILES:
            raise ValueError(
                f"{ASSIGNED_PROFILE}: must be one of {', '.join(PROFILES)}, got {self.profile!r}"
            )

    @property
    def shared(self) -> bool:
        """True when the pod gets a share of its GPU(s) rather than the whole."""
        return self.memory_mib is not None or self.compute_percent is not None

    def to_annotations(self) -> dict[str, str]:
        """The pod annotations the binder writes, including `allocation: pending`."""
        out = {
            ASSIGNED_NODE: self.node,
            ASSIGNED_GPUS: ",".join(str(i) for i in self.gpu_indices),
            ASSIGNED_GPU_UUIDS: ",".join(self.gpu_uuids),
            HANDSHAKE: self.handshake,
            ALLOCATION: AllocationState.PENDING.value,
        }
        if self.memory_mib is not None:
            out[ASSIGNED_MEMORY_MIB] = str(self.memory_mib)
        if self.compute_percent is not None:
            out[ASSIGNED_COMPUTE_PERCENT] = str(self.compute_percent)
        if self.priority is not None:
            out[ASSIGNED_PRIORITY] = self.priority
        if self.profile is not None:
            out[ASSIGNED_PROFILE] = self.profile
        return out

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> GpuAssignment:
        """Parse a pod's annotations; a ValueError names the missing or malformed key."""
        parts = _list(annotations, ASSIGNED_GPUS)
        indices = tuple(_int(annotations, ASSIGNED_GPUS, part) for part in parts)
        return cls(
            node=_required(annotations, ASSIGNED_NODE),
            gpu_indices=indices,
            gpu_uuids=_list(annotations, ASSIGNED_GPU_UUIDS),
            memory_mib=_optional_int(annotations, ASSIGNED_MEMORY_MIB),
            compute_percent=_optional_int(annotations, ASSIGNED_COMPUTE_PERCENT),
            handshake=_required(annotations, HANDSHAKE),
            priority=_optional(annotations, ASSIGNED_PRIORITY),
            profile=_optional(annotations, ASSIGNED_PROFILE),
        )


def _required(annotations: Mapping[str, str], key: str) -> str:
    value = annotations.get(key)
    if value is None or not value.strip():
        raise ValueError(f"{key}: annotation is missing or empty")
    return value.strip()


def _list(annotations: Mapping[str, str], key: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in _required(annotations, key).split(","))
    if not all(parts):
        raise ValueError(f"{key}: empty item in {annotations[key]!r}")
    return parts


def _int(annotations: Mapping[str, str], key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{key}: {text!r} is not an integer (in {annotations[key]!r})") from None


def _optional(annotations: Mapping[str, str], key: str) -> str | None:
    return None if key not in annotations else _required(annotations, key)


def _optional_int(annotations: Mapping[str, str], key: str) -> int | None:
    if key not in annotations:
        return None
    return _int(annotations, key, _required(annotations, key))


def allocation_state(annotations: Mapping[str, str]) -> AllocationState | None:
    """The pod's `chronotope.dev/allocation` state; None when absent or unknown."""
    try:
        return AllocationState(annotations.get(ALLOCATION, ""))
    except ValueError:
        return None


def format_timestamp(now: float) -> str:
    """RFC 3339 UTC timestamp (second precision) for `chronotope.dev/allocated-at`."""
    return datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def consumed_annotations(now: float) -> dict[str, str]:
    """The annotations the device plugin writes once Allocate has answered."""
    return {ALLOCATION: AllocationState.CONSUMED.value, ALLOCATED_AT: format_timestamp(now)}


def format_lock(handshake: str, now: float) -> str:
    """The node lock value `<handshake>,<unix-time>` taken at time `now`."""
    if not _HANDSHAKE_RE.match(handshake):
        raise ValueError(f"{ALLOCATION_LOCK}: invalid handshake {handshake!r}")
    return f"{handshake},{int(now)}"


def parse_lock(value: str | None) -> tuple[str, float] | None:
    """`(handshake, taken_at)` from a lock value; None when absent or unreadable."""
    if not value:
        return None
    handshake, sep, stamp = value.strip().partition(",")
    if not sep or not _HANDSHAKE_RE.match(handshake):
        return None
    try:
        taken_at = float(stamp)
    except ValueError:
        return None
    return handshake, taken_at


def lock_is_stale(value: str | None, now: float, ttl: float = LOCK_TTL_SECONDS) -> bool:
    """True when the lock no longer protects anyone and may be taken over.

    That is: absent, unreadable, or taken more than `ttl` seconds before `now`.
    A timestamp in the future (clock skew between binder replicas) counts as fresh.
    """
    parsed = parse_lock(value)
    if parsed is None:
        return True
    return now - parsed[1] > ttl


@dataclass(frozen=True, slots=True)
class BindRequest:
    """What the extender asks the binder to do: bind this pod, with this assignment."""

    namespace: str
    name: str
    uid: str
    node: str
    assignment: GpuAssignment | None
