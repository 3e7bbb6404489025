"""Advertised device IDs and the preferred-allocation hint."""

from __future__ import annotations

import pytest

from chronotope.deviceplugin.devices import DeviceInventory, gpu_of


def test_shared_inventory_advertises_virtual_devices() -> None:
    inv = DeviceInventory.simulated("n1", gpus=2, shares_per_gpu=3)
    assert inv.device_ids() == [
        "GPU-n1-0::0",
        "GPU-n1-0::1",
        "GPU-n1-0::2",
        "GPU-n1-1::0",
        "GPU-n1-1::1",
        "GPU-n1-1::2",
    ]
    assert gpu_of("GPU-n1-1::2") == "GPU-n1-1"
    assert inv.knows("GPU-n1-1::2")
    assert not inv.knows("GPU-n1-2::0")


def test_whole_gpu_inventory_uses_uuids() -> None:
    inv = DeviceInventory.simulated("n1", gpus=2)
    assert inv.device_ids() == ["GPU-n1-0", "GPU-n1-1"]
    assert gpu_of("GPU-n1-1") == "GPU-n1-1"


@pytest.mark.parametrize(
    ("uuids", "shares", "match"),
    [
        pytest.param(("a", "a"), 2, "GPU UUIDs repeat", id="repeated"),
        pytest.param(("a",), 0, "shares per GPU must be >= 1", id="no-shares"),
        pytest.param(("a::b",), 2, "contains '::'", id="separator"),
        pytest.param(("G" * 61,), 10, "longer than 63 characters", id="too-long"),
    ],
)
def test_bad_inventory(uuids: tuple[str, ...], shares: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DeviceInventory(uuids, shares)


def test_preferred_follows_the_assignment() -> None:
    inv = DeviceInventory.simulated("n", gpus=4, shares_per_gpu=2)
    available = inv.device_ids()
    got = inv.preferred(available, [], 2, assigned_uuids=["GPU-n-3", "GPU-n-1"])
    assert sorted(gpu_of(d) for d in got) == ["GPU-n-1", "GPU-n-3"]


def test_preferred_spreads_over_gpus_and_keeps_must_include() -> None:
    inv = DeviceInventory.simulated("n", gpus=3, shares_per_gpu=2)
    available = inv.device_ids()
    got = inv.preferred(available, ["GPU-n-2::1"], 3)
    assert got[0] == "GPU-n-2::1"
    assert len(got) == 3
    assert len({gpu_of(d) for d in got}) == 3


def test_preferred_fills_when_gpus_run_out() -> None:
    inv = DeviceInventory.simulated("n", gpus=1, shares_per_gpu=4)
    got = inv.preferred(inv.device_ids(), [], 3)
    assert len(got) == 3
    assert len(set(got)) == 3
