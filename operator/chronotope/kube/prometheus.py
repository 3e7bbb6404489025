"""One Prometheus instant query, read as a number: the controllers' live traffic rate.

Shared by `pipeline_ops` and `variant_ops`; it lives in `kube` because it is
the operator's I/O edge, not because Prometheus is part of Kubernetes.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

__all__ = ["DEFAULT_PROMETHEUS", "instant_query"]

DEFAULT_PROMETHEUS = "http://127.0.0.1:9090"


def instant_query(base: str, query: str, timeout_s: float = 3.0) -> float | str:
    """A PromQL instant query's first value, or why it could not be read."""
    base = base.rstrip("/")
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        return f"Prometheus at {base} did not answer: {exc}"
    result = (body.get("data") or {}).get("result") or []
    if body.get("status") != "success" or not result:
        return f"Prometheus query {query!r} returned no series"
    try:
        return float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return f"Prometheus query {query!r} returned no number"
