"""`chronotope device-plugin`: run the GPU-sharing device plugin on one node.

The only place the plugin reads the environment (NODE_NAME, set by the
DaemonSet from the downward API) or builds API clients; everything below gets
a `PluginSettings` and an `AllocationStore`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from chronotope.deviceplugin.settings import DEFAULT_PLUGIN_DIR, DEFAULT_RESOURCE, PluginSettings

__all__ = ["add_parser", "settings_from_args"]

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> None:
    """Register the `device-plugin` subcommand on the subcommand set `subparsers`."""
    parser = subparsers.add_parser(
        "device-plugin",
        help="run the kubelet device plugin that hands out assigned (shared) GPUs",
        description="Serve the kubelet device-plugin API (v1beta1) for one resource on "
        "this node. Allocate finds the pod by the binder's handshake, never by request size.",
    )
    parser.add_argument(
        "--node-name",
        default=None,
        help="this node's name (default: $NODE_NAME)",
    )
    parser.add_argument(
        "--kubeconfig", type=Path, default=None, help="kubeconfig file (default: in-cluster)"
    )
    parser.add_argument(
        "--plugin-dir",
        type=Path,
        default=DEFAULT_PLUGIN_DIR,
        help="kubelet device-plugin directory, holding kubelet.sock "
        f"(default: {DEFAULT_PLUGIN_DIR})",
    )
    parser.add_argument(
        "--resource-name",
        default=DEFAULT_RESOURCE,
        help=f"extended resource to advertise (default: {DEFAULT_RESOURCE})",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs on this node (default: the Node's nvidia.com/gpu.count label or capacity)",
    )
    parser.add_argument(
        "--shares-per-gpu",
        type=int,
        default=10,
        help="virtual devices advertised per GPU; 1 advertises whole GPUs (default: 10)",
    )
    parser.add_argument(
        "--watch-interval",
        type=float,
        default=5.0,
        help="seconds between checks that the kubelet has not restarted (default: 5)",
    )
    parser.set_defaults(func=_run)


def settings_from_args(args: argparse.Namespace, environ: dict[str, str]) -> PluginSettings:
    """Typed settings from the parsed flags, with NODE_NAME from `environ` as the fallback."""
    return PluginSettings(
        node_name=args.node_name or environ.get("NODE_NAME", ""),
        resource_name=args.resource_name,
        plugin_dir=args.plugin_dir,
        gpus=args.gpus,
        shares_per_gpu=args.shares_per_gpu,
        watch_interval_s=args.watch_interval,
    )


def _run(args: argparse.Namespace) -> int:
    from chronotope.deviceplugin.allocator import Allocator
    from chronotope.deviceplugin.devices import DeviceInventory
    from chronotope.deviceplugin.server import PluginServer
    from chronotope.kube.allocation import (
        KubeAllocationStore,
        mark_node_has_plugin,
        node_gpu_count,
    )
    from chronotope.kube.client import connect

    settings = settings_from_args(args, dict(os.environ))
    api = connect(args.kubeconfig, qps_connections=4)
    gpus = settings.gpus if settings.gpus is not None else node_gpu_count(api, settings.node_name)
    inventory = DeviceInventory.simulated(settings.node_name, gpus, settings.shares_per_gpu)
    allocator = Allocator(KubeAllocationStore(api), settings.node_name, inventory)
    server = PluginServer(settings, inventory, allocator)
    mark_node_has_plugin(api, settings.node_name)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "device plugin on node %s: %d GPU(s) x %d share(s) as %s",
        settings.node_name,
        gpus,
        settings.shares_per_gpu,
        settings.resource_name,
    )
    server.run(stop)
    return 0
