"""The GPU sharing request as pod annotations, for plain pods that no Chronotope kind owns.

Why: a user running a bare Deployment or notebook pod should be able to ask
for a share of a GPU without writing a custom resource. These annotations
carry the same request as `GpuShare` in the CRDs, and `parse_gpu_share`
turns them into that model, so the scheduler and device-plugin hook handle
one type whatever the route. Errors name the offending annotation key.

Example::

    metadata:
      annotations:
        chronotope.dev/gpu-memory-mib: "8192"
        chronotope.dev/gpu-compute-percent: "30"
        chronotope.dev/gpu-priority: best-effort     # or: high
        chronotope.dev/gpu-profile: memory-bound     # or: compute-bound, unknown

Pure: mappings in, a model (or an error) out.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import ValidationError

from chronotope.api.v1alpha1._base import camel_alias
from chronotope.api.v1alpha1.common import GpuShare, SharePriority, WorkloadProfile

__all__ = [
    "GPU_COMPUTE_PERCENT",
    "GPU_MEMORY_MIB",
    "GPU_PRIORITY",
    "GPU_PROFILE",
    "SHARE_ANNOTATIONS",
    "AnnotationError",
    "parse_gpu_share",
    "to_annotations",
]

GPU_MEMORY_MIB = "chronotope.dev/gpu-memory-mib"
GPU_COMPUTE_PERCENT = "chronotope.dev/gpu-compute-percent"
GPU_PRIORITY = "chronotope.dev/gpu-priority"
GPU_PROFILE = "chronotope.dev/gpu-profile"

SHARE_ANNOTATIONS = (GPU_MEMORY_MIB, GPU_COMPUTE_PERCENT, GPU_PRIORITY, GPU_PROFILE)

# annotation key -> GpuShare field it sets
_FIELDS = {
    GPU_MEMORY_MIB: "memory_mib",
    GPU_COMPUTE_PERCENT: "compute_percent",
    GPU_PRIORITY: "priority",
    GPU_PROFILE: "profile",
}


class AnnotationError(ValueError):
    """An annotation that does not parse; `key` is the offending annotation."""

    def __init__(self, key: str, message: str) -> None:
        """Build the error; the message reads `annotation <key>: <message>`."""
        super().__init__(f"annotation {key}: {message}")
        self.key = key
        self.message = message


def _canonical(value: str) -> str:
    return value.replace("-", "").replace("_", "").lower()


def _enum_value(key: str, raw: str, enum: type[StrEnum]) -> str:
    """Accept the API spelling (`BestEffort`) and the kebab spelling (`best-effort`)."""
    for member in enum:
        if _canonical(member.value) == _canonical(raw):
            return member.value
    allowed = ", ".join(_kebab(member.value) for member in enum)
    raise AnnotationError(key, f"{raw!r} is not one of {allowed}")


def _kebab(value: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(value))


def _integer(key: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise AnnotationError(key, f"{raw!r} is not an integer") from None


def parse_gpu_share(annotations: Mapping[str, str]) -> GpuShare | None:
    """The GPU share a pod's annotations ask for, or None when it asks for none.

    Pure. Raises `AnnotationError` naming the annotation when a value is
    malformed or out of range, or when a share is asked for without its
    memory (`chronotope.dev/gpu-memory-mib`, the one required key).
    """
    present = {key: annotations[key] for key in SHARE_ANNOTATIONS if key in annotations}
    if not present:
        return None
    if GPU_MEMORY_MIB not in present:
        raise AnnotationError(GPU_MEMORY_MIB, "required when any chronotope.dev/gpu-* is set")
    values: dict[str, object] = {}
    for key, raw in present.items():
        if key == GPU_PRIORITY:
            values[_FIELDS[key]] = _enum_value(key, raw, SharePriority)
        elif key == GPU_PROFILE:
            values[_FIELDS[key]] = _enum_value(key, raw, WorkloadProfile)
        else:
            values[_FIELDS[key]] = _integer(key, raw)
    try:
        return GpuShare.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        key = next((k for k, f in _FIELDS.items() if field in (f, camel_alias(f))), GPU_MEMORY_MIB)
        raise AnnotationError(key, first["msg"]) from None


def to_annotations(share: GpuShare) -> dict[str, str]:
    """The annotations that `parse_gpu_share` reads back as `share` (kebab-case values)."""
    return {
        GPU_MEMORY_MIB: str(share.memory_mib),
        GPU_COMPUTE_PERCENT: str(share.compute_percent),
        GPU_PRIORITY: _kebab(share.priority.value),
        GPU_PROFILE: _kebab(share.profile.value),
    }
