"""A stand-in kubelet for device-plugin tests: the Registration service on a unix socket.

No kubelet runs on the test machines, so the tests play its part over real
gRPC: accept the plugin's Register call, then dial the plugin's endpoint in
the same directory the way the kubelet's device manager does.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from chronotope.deviceplugin._pb import api_pb2, api_pb2_grpc

__all__ = ["FakeKubelet", "fake_kubelet"]


@dataclass
class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """Records every RegisterRequest; `plugin_stub` dials a registered plugin."""

    plugin_dir: Path
    registrations: queue.Queue[api_pb2.RegisterRequest] = field(default_factory=queue.Queue)

    def Register(  # noqa: N802 (the gRPC method name)
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported {request.version}")
        self.registrations.put(request)
        return api_pb2.Empty()

    def next_registration(self, timeout: float = 60) -> api_pb2.RegisterRequest:
        return self.registrations.get(timeout=timeout)

    @contextmanager
    def plugin_stub(self, endpoint: str) -> Iterator[api_pb2_grpc.DevicePluginStub]:
        with grpc.insecure_channel(f"unix://{self.plugin_dir / endpoint}") as channel:
            yield api_pb2_grpc.DevicePluginStub(channel)


@contextmanager
def fake_kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    """Serve Registration at `<plugin_dir>/kubelet.sock` for the duration of the block."""
    kubelet = FakeKubelet(plugin_dir)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    server.start()
    try:
        yield kubelet
    finally:
        server.stop(0).wait()
