"""The device plugin's settings: one typed object, built by the CLI and passed down."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "API_VERSION",
    "DEFAULT_PLUGIN_DIR",
    "DEFAULT_RESOURCE",
    "KUBELET_SOCKET",
    "PluginSettings",
]

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_RESOURCE = "chronotope.dev/gpu-share"
KUBELET_SOCKET = "kubelet.sock"


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """Where the plugin listens, what it advertises and how it keeps registered.

    `gpus` None means: read the GPU count from the Node object.
    """

    node_name: str
    resource_name: str = DEFAULT_RESOURCE
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    gpus: int | None = None
    shares_per_gpu: int = 10
    kubelet_socket_name: str = KUBELET_SOCKET
    # how often to check that the kubelet has not restarted (it deletes our socket)
    watch_interval_s: float = 5.0
    register_timeout_s: float = 10.0
    max_workers: int = 8

    def __post_init__(self) -> None:
        """Reject an empty node name, a resource name without a domain, and bad counts."""
        if not self.node_name:
            raise ValueError("node name is required (--node-name or NODE_NAME)")
        if "/" not in self.resource_name:
            raise ValueError(f"resource name must be <domain>/<name>, got {self.resource_name!r}")
        if self.gpus is not None and self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        if self.shares_per_gpu < 1:
            raise ValueError(f"shares per GPU must be >= 1, got {self.shares_per_gpu}")

    @property
    def endpoint(self) -> str:
        """Our socket's file name, relative to the plugin dir (what Register sends)."""
        return re.sub(r"[^A-Za-z0-9]+", "-", self.resource_name) + ".sock"

    @property
    def socket_path(self) -> Path:
        """Our socket's full path in the plugin dir."""
        return self.plugin_dir / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        """The kubelet's registration socket in the plugin dir."""
        return self.plugin_dir / self.kubelet_socket_name
