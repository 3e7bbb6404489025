"""Allocate against an in-memory API server: the handshake decides, never the request size."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chronotope.deviceplugin.allocator import Allocator, Granted, Refused, container_env
from chronotope.deviceplugin.devices import DeviceInventory
from chronotope.sharing.assignment import (
    ALLOCATED_AT,
    ALLOCATION,
    ASSIGNED_GPUS,
    AllocationState,
    allocation_state,
)
from tests.unit.deviceplugin.fakes import FakeStore, assignment

NODE = "a100-000"


def make(store: FakeStore, gpus: int = 8, shares: int = 4) -> Allocator:
    inventory = DeviceInventory.simulated(NODE, gpus, shares)
    return Allocator(store, NODE, inventory, clock=lambda: 1_700_000_000.0)


def granted(result: Granted | Refused) -> Granted:
    assert isinstance(result, Granted), result
    return result


def refused(result: Granted | Refused) -> Refused:
    assert isinstance(result, Refused), result
    return result


def test_allocate_returns_the_assigned_env_and_consumes() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0, 3), "hs-p", memory_mib=8192, compute_percent=25))
    store.lock(NODE, "hs-p")
    # the kubelet picked slots on other GPUs: the assignment still decides
    result = granted(make(store).allocate([["GPU-a100-000-1::0", "GPU-a100-000-5::2"]]))
    assert result.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a100-000-0,GPU-a100-000-3",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M,1=8192M",
        "CHRONOTOPE_HANDSHAKE": "hs-p",
    }
    annotations = store.pod_annotations("p")
    assert annotations[ALLOCATION] == "consumed"
    assert annotations[ALLOCATED_AT] == "2023-11-14T22:13:20Z"
    assert result.lock_released
    assert store.read_node_lock(NODE) is None


def test_whole_gpu_env_has_no_mps_limits() -> None:
    a = assignment(NODE, (2,), "hs", memory_mib=None, compute_percent=None)
    assert container_env(a) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a100-000-2",
        "CHRONOTOPE_HANDSHAKE": "hs",
    }


def test_two_same_size_pods_only_the_lock_holder_is_allocated() -> None:
    """The gpushare race: same request size, same node; the lock says which pod is meant."""
    store = FakeStore()
    store.bind("first", assignment(NODE, (0,), "hs-first", memory_mib=4096, compute_percent=20))
    store.bind("second", assignment(NODE, (1,), "hs-second", memory_mib=4096, compute_percent=20))
    store.lock(NODE, "hs-second")
    allocator = make(store)

    result = granted(allocator.allocate([["GPU-a100-000-0::0"]]))
    assert result.pod.name == "second"
    assert result.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a100-000-1"
    assert allocation_state(store.pod_annotations("first")) is AllocationState.PENDING

    # the lock is released: nothing else may be allocated until the binder locks again
    assert "no allocation lock" in refused(allocator.allocate([["GPU-a100-000-0::1"]])).reason
    assert allocation_state(store.pod_annotations("first")) is AllocationState.PENDING

    store.lock(NODE, "hs-first")
    result = granted(allocator.allocate([["GPU-a100-000-0::1"]]))
    assert result.pod.name == "first"
    assert result.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a100-000-0"


def test_handshake_mismatch_is_refused() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0,), "hs-pod"))
    store.lock(NODE, "hs-other")
    reason = refused(make(store).allocate([["GPU-a100-000-0::0"]])).reason
    assert "hs-other" in reason
    assert allocation_state(store.pod_annotations("p")) is AllocationState.PENDING
    assert store.read_node_lock(NODE) is not None  # someone else's lock stays


def test_count_mismatch_is_refused_and_nothing_changes() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0, 1), "hs"))
    store.lock(NODE, "hs")
    reason = refused(make(store).allocate([["GPU-a100-000-0::0"]])).reason
    assert "assigned 2 GPU(s)" in reason
    assert "requested 1" in reason
    assert allocation_state(store.pod_annotations("p")) is AllocationState.PENDING
    assert store.read_node_lock(NODE) is not None


def test_consumed_pod_is_not_allocated_twice() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0,), "hs"))
    store.lock(NODE, "hs")
    allocator = make(store)
    granted(allocator.allocate([["GPU-a100-000-0::0"]]))
    store.lock(NODE, "hs")  # a stale re-lock with the same handshake
    assert "not pending" in refused(allocator.allocate([["GPU-a100-000-0::0"]])).reason


def test_malformed_assignment_names_the_key() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0,), "hs"))
    store.pod_annotations("p")[ASSIGNED_GPUS] = "zero"
    store.lock(NODE, "hs")
    reason = refused(make(store).allocate([["GPU-a100-000-0::0"]])).reason
    assert ASSIGNED_GPUS in reason


@pytest.mark.parametrize(
    ("lock", "expected"),
    [(None, "no allocation lock"), ("garbage", "unreadable allocation lock")],
)
def test_missing_or_bad_lock(lock: str | None, expected: str) -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0,), "hs"))
    if lock is not None:
        store.node_annotations[NODE] = {"chronotope.dev/allocation-lock": lock}
    assert expected in refused(make(store).allocate([["GPU-a100-000-0::0"]])).reason


def test_ambiguous_handshake_is_refused() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0,), "hs"), namespace="a")
    store.bind("p", assignment(NODE, (1,), "hs"), namespace="b")
    store.lock(NODE, "hs")
    assert "ambiguous" in refused(make(store).allocate([["GPU-a100-000-0::0"]])).reason


def test_assignment_for_gpus_the_node_lacks() -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (9,), "hs"))
    store.lock(NODE, "hs")
    assert "lacks" in refused(make(store).allocate([["GPU-a100-000-0::0"]])).reason


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        ([["GPU-a100-000-0::0"], ["GPU-a100-000-1::0"]], "one container per Allocate"),
        ([], "one container per Allocate"),
        ([["GPU-elsewhere-0::0"]], "unknown device IDs"),
    ],
)
def test_bad_requests(requests: list[list[str]], expected: str) -> None:
    store = FakeStore()
    store.bind("p", assignment(NODE, (0,), "hs"))
    store.lock(NODE, "hs")
    assert expected in refused(make(store).allocate(requests)).reason
    assert allocation_state(store.pod_annotations("p")) is AllocationState.PENDING


ALL = DeviceInventory.simulated(NODE, 8, 4).device_ids()


def test_the_preference_follows_the_lock_holder() -> None:
    store = FakeStore()
    allocator = make(store)
    assert allocator.prefer(ALL, [], 2) == ["GPU-a100-000-0::0", "GPU-a100-000-1::0"]  # spread
    store.bind("p", assignment(NODE, (4, 6), "hs"))
    store.lock(NODE, "hs")
    assert allocator.prefer(ALL, [], 2) == ["GPU-a100-000-4::0", "GPU-a100-000-6::0"]


def test_a_pod_of_another_scheduler_is_refused() -> None:
    """The authoritative record: only the chronotope scheduler's binder writes assignments."""
    store = FakeStore()
    store.bind("squatter", assignment(NODE, (0,), "hs"), scheduler="default-scheduler")
    store.lock(NODE, "hs")
    allocator = make(store)
    why = refused(allocator.allocate([["GPU-a100-000-0::0"]])).reason
    assert "schedulerName 'default-scheduler', not 'chronotope'" in why
    assert allocation_state(store.pod_annotations("squatter")) is AllocationState.PENDING
    assert allocator.prefer(ALL, [], 1) == ["GPU-a100-000-0::0"]  # no pod's preference


def _free_except(*gpus: int) -> list[str]:
    return [d for d in ALL if not any(d.startswith(f"GPU-{NODE}-{g}::") for g in gpus)]


@pytest.mark.parametrize(
    ("available", "offered", "picked", "outcome"),
    [
        pytest.param(ALL, True, "GPU-a100-000-2::0", "granted", id="took-the-offer"),
        pytest.param(ALL, True, "GPU-a100-000-5::1", "refused", id="offered-but-elsewhere"),
        pytest.param(_free_except(2), True, "GPU-a100-000-5::1", "granted", id="gpu-full"),
        pytest.param(ALL, False, "GPU-a100-000-5::1", "granted", id="no-offer-made"),
    ],
)
def test_the_kubelets_devices_against_the_assignment(
    available: list[str], offered: bool, picked: str, outcome: str
) -> None:
    """Devices elsewhere are refused only when the kubelet was offered free slots on the
    assigned GPU (it takes such an offer); a GPU full in the kubelet's count (shares are
    packed by memory and compute, not by slots) or no offer leaves the assignment to decide."""
    store = FakeStore()
    store.bind("p", assignment(NODE, (2,), "hs"))
    store.lock(NODE, "hs")
    allocator = make(store)
    if offered:
        preference = allocator.prefer(available, [], 1)
        assert (preference == ["GPU-a100-000-2::0"]) is (available is ALL)
    result = allocator.allocate([[picked]])
    if outcome == "refused":
        why = refused(result).reason
        assert f"devices ['{picked}']" in why
        assert "is assigned ['GPU-a100-000-2'], which were offered with free slots" in why
        assert allocation_state(store.pod_annotations("p")) is AllocationState.PENDING
        result = allocator.allocate([["GPU-a100-000-2::0"]])  # the offer itself still works
    assert granted(result).envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a100-000-2"


def test_a_shares_priority_and_profile_reach_the_container() -> None:
    store = FakeStore()
    a = assignment(NODE, (1,), "hs-be", memory_mib=4096, compute_percent=20)
    store.bind("be", replace(a, priority="best-effort", profile="memory-bound"))
    store.lock(NODE, "hs-be")
    result = granted(make(store).allocate([["GPU-a100-000-1::0"]]))
    assert result.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a100-000-1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        "CHRONOTOPE_HANDSHAKE": "hs-be",
        "CHRONOTOPE_GPU_PRIORITY": "best-effort",
        "CHRONOTOPE_GPU_PROFILE": "memory-bound",
    }
