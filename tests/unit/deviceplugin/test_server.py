"""The plugin over real gRPC on unix sockets, with a fake kubelet and an in-memory API server."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from chronotope.deviceplugin._pb import api_pb2
from chronotope.deviceplugin.allocator import Allocator
from chronotope.deviceplugin.devices import DeviceInventory
from chronotope.deviceplugin.server import PluginServer
from chronotope.deviceplugin.settings import PluginSettings
from chronotope.sharing.assignment import AllocationState, allocation_state
from tests.fake_kubelet import FakeKubelet, fake_kubelet
from tests.unit.deviceplugin.fakes import FakeStore, assignment

NODE = "t4-000"
RESOURCE = "chronotope.dev/gpu-share"


@dataclass
class Running:
    kubelet: FakeKubelet
    server: PluginServer
    store: FakeStore
    settings: PluginSettings


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def running(plugin_dir: Path) -> Iterator[Running]:
    settings = PluginSettings(
        node_name=NODE,
        resource_name=RESOURCE,
        plugin_dir=plugin_dir,
        gpus=2,
        shares_per_gpu=2,
        watch_interval_s=0.1,
    )
    store = FakeStore()
    inventory = DeviceInventory.simulated(NODE, 2, 2)
    server = PluginServer(settings, inventory, Allocator(store, NODE, inventory))
    stop = threading.Event()
    with fake_kubelet(plugin_dir) as kubelet:
        thread = threading.Thread(target=server.run, args=(stop,), daemon=True)
        thread.start()
        try:
            yield Running(kubelet, server, store, settings)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()


def test_registers_and_lists_devices(running: Running) -> None:
    req = running.kubelet.next_registration()
    assert req.version == "v1beta1"
    assert req.resource_name == RESOURCE
    assert req.endpoint == running.settings.endpoint
    assert req.options.get_preferred_allocation_available
    with running.kubelet.plugin_stub(req.endpoint) as stub:
        options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        assert options.get_preferred_allocation_available
        assert not options.pre_start_required
        stream = stub.ListAndWatch(api_pb2.Empty(), timeout=30)
        updates = iter(stream)
        first = next(updates)
        assert [d.ID for d in first.devices] == [
            "GPU-t4-000-0::0",
            "GPU-t4-000-0::1",
            "GPU-t4-000-1::0",
            "GPU-t4-000-1::1",
        ]
        assert {d.health for d in first.devices} == {"Healthy"}
        # a health change is pushed on the open stream
        running.server.service.set_gpu_health("GPU-t4-000-1", healthy=False)
        second = next(updates)
        health = {d.ID: d.health for d in second.devices}
        assert health["GPU-t4-000-1::0"] == "Unhealthy"
        assert health["GPU-t4-000-0::0"] == "Healthy"
        stream.cancel()
        assert stub.PreStartContainer(api_pb2.PreStartContainerRequest(), timeout=10) is not None


def test_allocate_over_grpc(running: Running) -> None:
    endpoint = running.kubelet.next_registration().endpoint
    running.store.bind("p", assignment(NODE, (1,), "hs-1", memory_mib=2048, compute_percent=50))
    running.store.lock(NODE, "hs-1")
    with running.kubelet.plugin_stub(endpoint) as stub:
        preferred = stub.GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["GPU-t4-000-0::0", "GPU-t4-000-1::1"],
                        allocation_size=1,
                    )
                ]
            ),
            timeout=10,
        )
        assert list(preferred.container_responses[0].deviceIDs) == ["GPU-t4-000-1::1"]
        response = stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=["GPU-t4-000-1::1"])
                ]
            ),
            timeout=10,
        )
        assert dict(response.container_responses[0].envs) == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-t4-000-1",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
            "CHRONOTOPE_HANDSHAKE": "hs-1",
        }
        assert allocation_state(running.store.pod_annotations("p")) is AllocationState.CONSUMED

        # nothing holds the lock now: a second Allocate is refused with the reason
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=["GPU-t4-000-0::0"])
                    ]
                ),
                timeout=10,
            )
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "no allocation lock" in (err.value.details() or "")


def test_reregisters_after_kubelet_restart(running: Running) -> None:
    running.kubelet.next_registration()
    # a restarting kubelet wipes the plugin sockets in its directory
    running.settings.socket_path.unlink()
    again = running.kubelet.next_registration()
    assert again.resource_name == RESOURCE
    with running.kubelet.plugin_stub(again.endpoint) as stub:
        assert stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10) is not None
