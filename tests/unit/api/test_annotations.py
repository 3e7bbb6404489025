"""The GPU sharing request from pod annotations: parse, round trip, field-named errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronotope.api.annotations import (
    GPU_COMPUTE_PERCENT,
    GPU_MEMORY_MIB,
    GPU_PRIORITY,
    GPU_PROFILE,
    AnnotationError,
    parse_gpu_share,
    to_annotations,
)
from chronotope.api.v1alpha1 import GpuShare, SharePriority, WorkloadProfile


def test_no_sharing_annotations_means_no_share() -> None:
    assert parse_gpu_share({"app": "x", "chronotope.dev/other": "1"}) is None


def test_memory_alone_takes_defaults() -> None:
    share = parse_gpu_share({GPU_MEMORY_MIB: "8192"})
    assert share == GpuShare(memory_mib=8192)
    assert share.priority is SharePriority.BEST_EFFORT
    assert share.compute_percent == 100


@pytest.mark.parametrize("spelling", ["high", "High", "HIGH"])
def test_priority_spellings(spelling: str) -> None:
    share = parse_gpu_share({GPU_MEMORY_MIB: "1", GPU_PRIORITY: spelling})
    assert share is not None
    assert share.priority is SharePriority.HIGH


@pytest.mark.parametrize("spelling", ["memory-bound", "MemoryBound", "memory_bound"])
def test_profile_spellings(spelling: str) -> None:
    share = parse_gpu_share({GPU_MEMORY_MIB: "1", GPU_PROFILE: spelling})
    assert share is not None
    assert share.profile is WorkloadProfile.MEMORY_BOUND


@pytest.mark.parametrize(
    ("annotations", "key", "text"),
    [
        ({GPU_COMPUTE_PERCENT: "30"}, GPU_MEMORY_MIB, "required"),
        ({GPU_MEMORY_MIB: "lots"}, GPU_MEMORY_MIB, "not an integer"),
        ({GPU_MEMORY_MIB: "0"}, GPU_MEMORY_MIB, "greater than or equal to 1"),
        ({GPU_MEMORY_MIB: "1", GPU_COMPUTE_PERCENT: "101"}, GPU_COMPUTE_PERCENT, "100"),
        ({GPU_MEMORY_MIB: "1", GPU_COMPUTE_PERCENT: "0"}, GPU_COMPUTE_PERCENT, "1"),
        ({GPU_MEMORY_MIB: "1", GPU_PRIORITY: "urgent"}, GPU_PRIORITY, "high, best-effort"),
        ({GPU_MEMORY_MIB: "1", GPU_PROFILE: "io"}, GPU_PROFILE, "compute-bound"),
    ],
)
def test_errors_name_the_annotation(annotations: dict[str, str], key: str, text: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        parse_gpu_share(annotations)
    assert caught.value.key == key
    assert key in str(caught.value)
    assert text in str(caught.value)


@given(
    memory=st.integers(1, 1_048_576),
    compute=st.integers(1, 100),
    priority=st.sampled_from(SharePriority),
    profile=st.sampled_from(WorkloadProfile),
)
def test_annotations_round_trip(
    memory: int, compute: int, priority: SharePriority, profile: WorkloadProfile
) -> None:
    share = GpuShare(memory_mib=memory, compute_percent=compute, priority=priority, profile=profile)
    annotations = to_annotations(share)
    assert annotations[GPU_PRIORITY] in ("high", "best-effort")
    assert parse_gpu_share(annotations) == share
