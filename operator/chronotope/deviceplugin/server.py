"""The kubelet device-plugin gRPC service (v1beta1) and its registration loop.

`DevicePluginService` speaks the wire protocol and delegates every decision to
`DeviceInventory` and `Allocator`. `PluginServer` owns the lifecycle the
kubelet expects: serve on a unix socket in the device-plugin directory,
register at `kubelet.sock`, and start over when the kubelet restarts (it
deletes every plugin socket in the directory when it does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc

from chronotope.deviceplugin._pb import api_pb2, api_pb2_grpc
from chronotope.deviceplugin.allocator import Allocator, Refused
from chronotope.deviceplugin.devices import DeviceInventory, gpu_of
from chronotope.deviceplugin.settings import API_VERSION, PluginSettings

__all__ = ["HEALTHY", "UNHEALTHY", "DevicePluginService", "PluginServer", "register"]

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_STREAM_POLL_S = 0.5  # how often an idle ListAndWatch stream checks for shutdown


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin gRPC service for one resource on one node."""

    def __init__(self, inventory: DeviceInventory, allocator: Allocator) -> None:
        """Serve `inventory`, deciding allocations with `allocator`."""
        self._inventory = inventory
        self._allocator = allocator
        self._changed = threading.Condition()
        self._version = 0
        self._unhealthy: set[str] = set()
        self._stopping = False

    # --- state the streams watch -------------------------------------------------
    def set_gpu_health(self, uuid: str, healthy: bool) -> None:
        """Mark a GPU (all its device IDs) healthy or not; open streams resend the list."""
        with self._changed:
            before = set(self._unhealthy)
            if healthy:
                self._unhealthy.discard(uuid)
            else:
                self._unhealthy.add(uuid)
            if before != self._unhealthy:
                self._version += 1
                self._changed.notify_all()

    def stop(self) -> None:
        """End every open ListAndWatch stream."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def resume(self) -> None:
        """Accept streams again (after a restart; the old server has drained its streams)."""
        with self._changed:
            self._stopping = False

    def _device_list(self) -> api_pb2.ListAndWatchResponse:
        devices = [
            api_pb2.Device(
                ID=device_id,
                health=UNHEALTHY if gpu_of(device_id) in self._unhealthy else HEALTHY,
            )
            for device_id in self._inventory.device_ids()
        ]
        return api_pb2.ListAndWatchResponse(devices=devices)

    # --- the v1beta1 DevicePlugin service ----------------------------------------
    def GetDevicePluginOptions(  # noqa: N802 (the gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        """Tell the kubelet we offer GetPreferredAllocation and need no PreStartContainer."""
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def ListAndWatch(  # noqa: N802 (the gRPC method name)
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        """Stream the device list, sending it again whenever a GPU's health changes.

        The stream ends when the kubelet hangs up or the service stops.
        """
        sent = -1
        while context.is_active():
            with self._changed:
                if self._stopping:
                    return
                if sent == self._version:
                    self._changed.wait(_STREAM_POLL_S)
                    continue
                sent = self._version
                response = self._device_list()
            yield response

    def GetPreferredAllocation(  # noqa: N802 (the gRPC method name)
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        """Suggest device IDs for each container, favouring the pending pod's assigned GPUs.

        Reading the assignment is best effort: on an API error the hint is made without it.
        """
        responses = [
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=self._prefer(req))
            for req in request.container_requests
        ]
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def _prefer(self, req: api_pb2.ContainerPreferredAllocationRequest) -> list[str]:
        available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
        try:
            return self._allocator.prefer(available, must, req.allocation_size)
        except Exception:  # a hint: never fail admission because the API server hiccupped
            log.exception("GetPreferredAllocation could not read the pending assignment")
            return self._inventory.preferred(available, must, req.allocation_size)

    def Allocate(  # noqa: N802 (the gRPC method name)
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        """Hand the pending pod its GPU environment, or abort the call with the reason.

        API-server errors abort with UNAVAILABLE; a refused request with FAILED_PRECONDITION.
        """
        requests = [list(req.devices_ids) for req in request.container_requests]
        try:
            result = self._allocator.allocate(requests)
        except Exception as exc:
            log.exception("Allocate failed talking to the API server")
            context.abort(grpc.StatusCode.UNAVAILABLE, f"chronotope: API server error: {exc}")
        if isinstance(result, Refused):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"chronotope: {result.reason}")
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs=result.envs)]
        )

    def PreStartContainer(  # noqa: N802 (the gRPC method name)
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        """Nothing to do before a container starts (the options say PreStart is not required)."""
        return api_pb2.PreStartContainerResponse()


def register(settings: PluginSettings) -> None:
    """Register our endpoint and resource with the kubelet; raises grpc.RpcError on refusal."""
    with grpc.insecure_channel(f"unix://{settings.kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        stub.Register(
            api_pb2.RegisterRequest(
                version=API_VERSION,
                endpoint=settings.endpoint,
                resource_name=settings.resource_name,
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=settings.register_timeout_s,
            wait_for_ready=True,
        )


class PluginServer:
    """Serve, register, and re-register whenever the kubelet restarts."""

    def __init__(
        self, settings: PluginSettings, inventory: DeviceInventory, allocator: Allocator
    ) -> None:
        """Build the server for one resource; nothing listens until `start` or `run`."""
        self.settings = settings
        self.service = DevicePluginService(inventory, allocator)
        self._server: grpc.Server | None = None
        self.registered = threading.Event()

    def start(self) -> None:
        """Listen on our socket in the plugin dir (replacing a stale one)."""
        path = self.settings.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self.service.resume()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.settings.max_workers))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._server = server
        log.info("device plugin for %s listening on %s", self.settings.resource_name, path)

    def stop(self, grace: float = 1.0) -> None:
        """End the streams, stop the gRPC server within `grace` seconds and remove our socket."""
        self.registered.clear()
        self.service.stop()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        self.settings.socket_path.unlink(missing_ok=True)

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set, registering again after every kubelet restart."""
        interval = self.settings.watch_interval_s
        try:
            while not stop.is_set():
                if self._server is None or not self.settings.socket_path.exists():
                    if self._server is not None:
                        log.info("our socket is gone (kubelet restarted?): starting over")
                        self.stop()
                    self.start()
                if not self.registered.is_set():
                    try:
                        register(self.settings)
                    except grpc.RpcError as exc:
                        log.warning("registration with the kubelet failed, retrying: %s", exc)
                    else:
                        log.info(
                            "registered %s with the kubelet at %s",
                            self.settings.resource_name,
                            self.settings.kubelet_socket,
                        )
                        self.registered.set()
                stop.wait(interval)
        finally:
            self.stop()
