"""Build API clients from a kubeconfig file."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config

__all__ = ["api_client", "core_v1"]


def api_client(kubeconfig: Path, *, qps_connections: int = 32) -> client.ApiClient:
    """An ApiClient for the kubeconfig's current context, with a pool sized for bulk work."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = qps_connections
    return client.ApiClient(configuration=cfg)


def core_v1(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)
