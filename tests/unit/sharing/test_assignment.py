"""The binder/device-plugin annotation contract and the node allocation lock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chronotope.api.v1alpha1.common import SharePriority, WorkloadProfile
from chronotope.sharing.assignment import (
    ALLOCATED_AT,
    ALLOCATION,
    ASSIGNED_COMPUTE_PERCENT,
    ASSIGNED_GPU_UUIDS,
    ASSIGNED_GPUS,
    ASSIGNED_MEMORY_MIB,
    ASSIGNED_NODE,
    ASSIGNED_PRIORITY,
    ASSIGNED_PROFILE,
    HANDSHAKE,
    AllocationState,
    GpuAssignment,
    allocation_state,
    consumed_annotations,
    format_lock,
    gpu_uuid,
    lock_is_stale,
    new_handshake,
    parse_lock,
    share_class,
)

SHARED = GpuAssignment(
    node="a100-000",
    gpu_indices=(0, 3),
    gpu_uuids=("GPU-a100-000-0", "GPU-a100-000-3"),
    memory_mib=8192,
    compute_percent=25,
    handshake="abc123",
)
WHOLE = GpuAssignment(
    node="t4-000",
    gpu_indices=(0,),
    gpu_uuids=("GPU-t4-000-0",),
    memory_mib=None,
    compute_percent=None,
    handshake="h-1",
)


def test_annotations_wire_format() -> None:
    assert SHARED.to_annotations() == {
        "chronotope.dev/assigned-node": "a100-000",
        "chronotope.dev/assigned-gpus": "0,3",
        "chronotope.dev/assigned-gpu-uuids": "GPU-a100-000-0,GPU-a100-000-3",
        "chronotope.dev/assigned-memory-mib": "8192",
        "chronotope.dev/assigned-compute-percent": "25",
        "chronotope.dev/handshake": "abc123",
        "chronotope.dev/allocation": "pending",
    }


@pytest.mark.parametrize("a", [SHARED, WHOLE], ids=["shared", "whole"])
def test_round_trip(a: GpuAssignment) -> None:
    annotations = a.to_annotations()
    assert GpuAssignment.from_annotations(annotations) == a
    assert allocation_state(annotations) is AllocationState.PENDING


def test_whole_gpu_has_no_share_keys() -> None:
    annotations = WHOLE.to_annotations()
    assert ASSIGNED_MEMORY_MIB not in annotations
    assert ASSIGNED_COMPUTE_PERCENT not in annotations
    assert not WHOLE.shared
    assert SHARED.shared


def test_other_annotations_are_ignored() -> None:
    annotations = {**SHARED.to_annotations(), "kubectl.kubernetes.io/x": "y"}
    assert GpuAssignment.from_annotations(annotations) == SHARED


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ASSIGNED_NODE, None),
        (ASSIGNED_NODE, " "),
        (ASSIGNED_GPUS, None),
        (ASSIGNED_GPUS, "0,x"),
        (ASSIGNED_GPUS, "0,,3"),
        (ASSIGNED_GPUS, "0,0"),
        (ASSIGNED_GPUS, "-1,3"),
        (ASSIGNED_GPU_UUIDS, "GPU-a100-000-0"),
        (ASSIGNED_GPU_UUIDS, None),
        (ASSIGNED_MEMORY_MIB, "8G"),
        (ASSIGNED_MEMORY_MIB, "0"),
        (ASSIGNED_MEMORY_MIB, ""),
        (ASSIGNED_COMPUTE_PERCENT, "101"),
        (ASSIGNED_COMPUTE_PERCENT, "0"),
        (ASSIGNED_COMPUTE_PERCENT, "half"),
        (HANDSHAKE, None),
        (HANDSHAKE, "a,b"),
        (HANDSHAKE, "x" * 64),
    ],
)
def test_bad_annotation_is_named(key: str, value: str | None) -> None:
    annotations = SHARED.to_annotations()
    if value is None:
        del annotations[key]
    else:
        annotations[key] = value
    with pytest.raises(ValueError, match=key):
        GpuAssignment.from_annotations(annotations)


def test_allocation_state() -> None:
    assert allocation_state({}) is None
    assert allocation_state({ALLOCATION: "bogus"}) is None
    consumed = consumed_annotations(0.0)
    assert consumed == {ALLOCATION: "consumed", ALLOCATED_AT: "1970-01-01T00:00:00Z"}
    assert allocation_state(consumed) is AllocationState.CONSUMED


def test_lock_format_and_parse() -> None:
    value = format_lock("abc123", 1700000000.7)
    assert value == "abc123,1700000000"
    assert parse_lock(value) == ("abc123", 1700000000.0)


@pytest.mark.parametrize("value", [None, "", "abc", "abc,", "abc,notanumber", ",123", "a b,1"])
def test_unreadable_lock(value: str | None) -> None:
    assert parse_lock(value) is None
    assert lock_is_stale(value, now=0.0, ttl=60)


@pytest.mark.parametrize(
    ("taken", "now", "stale"),
    [(1000, 1000, False), (1000, 1060, False), (1000, 1060.5, True), (2000, 1000, False)],
)
def test_lock_staleness(taken: float, now: float, stale: bool) -> None:
    assert lock_is_stale(format_lock("h", taken), now=now, ttl=60) is stale


def test_format_lock_rejects_bad_handshake() -> None:
    with pytest.raises(ValueError, match="allocation-lock"):
        format_lock("a,b", 0)


def test_gpu_uuid_and_handshake() -> None:
    assert gpu_uuid("t4-000", 0) == "GPU-t4-000-0"
    with pytest.raises(ValueError, match="GPU index must be >= 0"):
        gpu_uuid("t4-000", -1)
    h = new_handshake()
    assert len(h) == 16
    assert h != new_handshake()
    assert parse_lock(format_lock(h, 5)) == (h, 5.0)


def test_a_shares_priority_and_profile_round_trip() -> None:
    assert share_class(SharePriority.BEST_EFFORT, WorkloadProfile.MEMORY_BOUND) == (
        "best-effort",
        "memory-bound",
    )
    a = replace(SHARED, priority="high", profile="compute-bound")
    annotations = a.to_annotations()
    assert (annotations[ASSIGNED_PRIORITY], annotations[ASSIGNED_PROFILE]) == (
        "high",
        "compute-bound",
    )
    assert GpuAssignment.from_annotations(annotations) == a
    assert ASSIGNED_PRIORITY not in SHARED.to_annotations()  # none stated: none written
    with pytest.raises(ValueError, match="assigned-priority: must be one of high, best-effort"):
        GpuAssignment.from_annotations({**annotations, ASSIGNED_PRIORITY: "urgent"})
    with pytest.raises(ValueError, match="assigned-profile"):
        replace(SHARED, profile="io-bound")
