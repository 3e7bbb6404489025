"""Posting Kubernetes Events: the one writer of core/v1 Events for every component.

An event is advice: a failed post is swallowed (logged at debug), never a
failed decision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json

__all__ = ["post_event"]

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
"""A post that takes longer is given up, so a stalled connection cannot hold its poster."""


def post_event(
    api: client.ApiClient,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    *,
    type_: str = "Normal",
    component: str,
) -> None:
    """Post an Event on `involved` (apiVersion, kind, name, namespace; uid when known)."""
    namespace = str(involved["namespace"])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": {k: v for k, v in involved.items() if v is not None},
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        raw_json(
            client.CoreV1Api(api).create_namespaced_event(
                namespace, body, _preload_content=False, _request_timeout=TIMEOUT_S
            )
        )
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        log.debug("event %s on %s/%s not posted: %s", reason, namespace, involved["name"], exc)
