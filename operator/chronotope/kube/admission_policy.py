"""Install in-tree admission policies: ValidatingAdmissionPolicy objects and their bindings.

The local dev cluster installs manifests/security/assignment-policy.yaml with this
(the Helm chart renders the same objects itself); see docs/security.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from chronotope.kube.client import raw_json

__all__ = ["apply_admission_policies", "load_admission_policies"]

_NOT_FOUND = 404
_KINDS = {
    "ValidatingAdmissionPolicy": "validating_admission_policy",
    "ValidatingAdmissionPolicyBinding": "validating_admission_policy_binding",
}


def load_admission_policies(path: Path) -> list[dict[str, Any]]:
    """The objects of a policy manifest; ValueError names any other kind."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        if kind not in _KINDS:
            raise ValueError(f"{path}: {kind} is not one of {', '.join(_KINDS)}")
    if not docs:
        raise ValueError(f"{path}: no admission policy in the file")
    return docs


def apply_admission_policies(api: client.ApiClient, objs: Iterable[Mapping[str, Any]]) -> None:
    """Create each policy or binding, or replace the one of that name."""
    admission = client.AdmissionregistrationV1Api(api)
    for obj in objs:
        suffix = _KINDS[obj["kind"]]
        name = obj["metadata"]["name"]
        try:
            current = raw_json(getattr(admission, f"read_{suffix}")(name, _preload_content=False))
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            getattr(admission, f"create_{suffix}")(dict(obj), _preload_content=False).release_conn()
            continue
        body = dict(obj)
        body["metadata"] = dict(obj["metadata"]) | {
            "resourceVersion": current["metadata"]["resourceVersion"]
        }
        getattr(admission, f"replace_{suffix}")(name, body, _preload_content=False).release_conn()
