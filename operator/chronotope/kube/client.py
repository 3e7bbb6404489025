"""Build API clients from a kubeconfig file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from kubernetes import client, config

__all__ = ["api_client", "connect", "core_v1", "count_requests", "raw_json"]


def api_client(kubeconfig: Path, *, qps_connections: int = 32) -> client.ApiClient:
    """An ApiClient for the kubeconfig's current context, with a pool sized for bulk work."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = qps_connections
    return client.ApiClient(configuration=cfg)


def connect(kubeconfig: Path | None, *, qps_connections: int = 32) -> client.ApiClient:
    """An ApiClient from `kubeconfig`, or from the pod's service account when None."""
    if kubeconfig is not None:
        return api_client(kubeconfig, qps_connections=qps_connections)
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = qps_connections
    return client.ApiClient(configuration=cfg)


def count_requests(api: client.ApiClient, counted: Callable[[str, str], None]) -> None:
    """Call `counted(verb, resource)` for every request `api` makes.

    The verb is GET, WATCH (a watch opened), POST, PATCH, PUT or DELETE; the resource is
    the plural its URL names (`pods`, `trainingjobs`, `events`, ...; see `resource_of`).
    """
    rest = api.rest_client
    send = rest.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        query = kwargs.get("query_params") or (args[0] if args else None) or []
        watch = any(k == "watch" and str(v).lower() == "true" for k, v in query)
        counted("WATCH" if watch else str(method).upper(), resource_of(url))
        return send(method, url, *args, **kwargs)

    rest.request = request


def resource_of(url: str) -> str:
    """The resource (plural) a Kubernetes API URL names; `other` for anything else.

    `/api/v1/namespaces/ns/pods/p/status` -> `pods`, `/apis/g/v/queues` -> `queues`,
    `/api/v1/namespaces/ns` -> `namespaces`.
    """
    path = urlsplit(url).path.strip("/").split("/")
    if path[:1] == ["api"]:
        rest = path[2:]
    elif path[:1] == ["apis"]:
        rest = path[3:]
    else:
        return "other"
    match rest:
        case ["namespaces", _, resource, *_]:
            return resource
        case [resource, *_] if resource:
            return resource
    return "other"


def core_v1(api: client.ApiClient) -> client.CoreV1Api:
    """The CoreV1 API on `api`."""
    return client.CoreV1Api(api)


def raw_json(response: Any) -> Any:
    """The JSON body of a `_preload_content=False` call, returning its connection to the pool.

    Raw responses skip the client's slow model (de)serialization, but urllib3 keeps
    their connection checked out until released; an unreleased one costs a fresh TLS
    handshake on the next call.
    """
    try:
        data = response.data
        return orjson.loads(data) if data else None
    finally:
        response.release_conn()
