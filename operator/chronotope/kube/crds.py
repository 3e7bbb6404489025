"""Install Chronotope's CRDs and wait until the API server serves them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["install_crds"]

_CONFLICT = 409


def install_crds(
    api: client.ApiClient, crds: Sequence[dict[str, Any]], timeout: float = 60
) -> None:
    """Create or replace each CRD, then wait until all are Established.

    Raises `TimeoutError` when they are not Established within `timeout` seconds.
    """
    ext = client.ApiextensionsV1Api(api)
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as exc:
            if exc.status != _CONFLICT:
                raise
            current = ext.read_custom_resource_definition(name)
            version = {"resourceVersion": current.metadata.resource_version}
            ext.replace_custom_resource_definition(
                name, crd | {"metadata": crd["metadata"] | version}
            )
    deadline = time.monotonic() + timeout
    for crd in crds:
        name = crd["metadata"]["name"]
        while True:
            obj = ext.read_custom_resource_definition(name)
            conditions = obj.status.conditions or [] if obj.status else []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
