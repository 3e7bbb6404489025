"""The admission webhook's wire format and registration (pure).

`review` answers one AdmissionRequest with `workloads.admission` (validation,
or defaulting as a JSON patch), `response` wraps the answer in an
AdmissionReview, and `webhook_configurations` declares the Validating- and
MutatingWebhookConfiguration the server's paths expect: which kinds and
operations reach it, which updates are not even sent (`MATCH_CONDITIONS`), and
the failure policies (docs/webhook.md says why). The Helm chart renders the
same registration (`charts/chronotope/templates/webhook.yaml`; a test compares).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from chronotope.workloads.admission import KINDS, Lookups, Review, default, validate
from chronotope.workloads.pod_shape import TypeTable

__all__ = [
    "MATCH_CONDITIONS",
    "MUTATE_PATH",
    "MUTATING_WEBHOOK",
    "RULES",
    "VALIDATE_PATH",
    "VALIDATING_WEBHOOK",
    "response",
    "review",
    "webhook_configurations",
]

VALIDATE_PATH, MUTATE_PATH = "/validate", "/mutate"
VALIDATING_WEBHOOK, MUTATING_WEBHOOK = "validate.chronotope.dev", "default.chronotope.dev"

RULES = [
    {
        "apiGroups": ["chronotope.dev"],
        "apiVersions": ["v1alpha1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["trainingjobs", "inferencepipelines", "modelvariants"],
        "scope": "Namespaced",
    }
]
"""The main resources only: `/status` writes (the operator's) and `/scale` (`kubectl
scale`) never reach the webhook."""

MATCH_CONDITIONS = [
    {
        "name": "spec-changed",
        "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
    }
]
"""Only creates and spec changes are sent: metadata writes (finalizers, the operator's
annotations, a deletion) keep working while the webhook is down."""


def review(
    request: Mapping[str, Any], lookups: Lookups, pod_types: TypeTable, *, mutate: bool
) -> Review:
    """The answer to one AdmissionRequest (`AdmissionReview.request`). Pure.

    Kinds, operations and subresources the webhook is not registered for are
    allowed unchanged: a registration wider than `RULES` must never block.
    """
    kind = str((request.get("kind") or {}).get("kind") or "")
    operation = request.get("operation")
    if kind not in KINDS or request.get("subResource") or operation not in ("CREATE", "UPDATE"):
        return Review()
    obj = dict(request.get("object") or {})
    old = request.get("oldObject") if operation == "UPDATE" else None
    if request.get("namespace"):
        obj["metadata"] = dict(obj.get("metadata") or {}) | {"namespace": request["namespace"]}
    if mutate:
        return default(kind, obj, old)
    return validate(kind, obj, old, lookups, pod_types)


def response(body: Mapping[str, Any], answer: Review) -> dict[str, Any]:
    """The AdmissionReview to send back for the review `body` and its `answer`. Pure."""
    request = body.get("request") or {}
    out: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": answer.allowed}
    if not answer.allowed:
        out["status"] = {"code": 422, "reason": "Invalid", "message": answer.message}
    if answer.warnings:
        out["warnings"] = list(answer.warnings)
    if answer.patch:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(json.dumps(list(answer.patch)).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion") or "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": out,
    }


def webhook_configurations(
    name: str,
    client_config: Mapping[str, Any],
    *,
    failure_policy: str = "Fail",
    timeout_seconds: int = 5,
) -> list[dict[str, Any]]:
    """The Validating- and MutatingWebhookConfiguration `name` for a server at `client_config`.

    `client_config` is an admissionregistration clientConfig without the path
    (`{"url": "https://host:port", "caBundle": ...}` or `{"service": {...},
    "caBundle": ...}`). The validating webhook fails as `failure_policy` says;
    the mutating one is `Ignore`: its defaults are the ones the models apply
    when they read the object anyway (docs/webhook.md).
    """
    if failure_policy not in ("Fail", "Ignore"):
        raise ValueError(f"failure_policy must be Fail or Ignore, not {failure_policy!r}")
    if not 1 <= timeout_seconds <= 30:  # noqa: PLR2004 - the API server's bounds
        raise ValueError(f"timeout_seconds must be within 1..30, not {timeout_seconds}")

    def hook(hook_name: str, path: str, policy: str) -> dict[str, Any]:
        config = dict(client_config)
        if "url" in config:
            config["url"] = str(config["url"]).rstrip("/") + path
        else:
            config["service"] = dict(config["service"]) | {"path": path}
        return {
            "name": hook_name,
            "clientConfig": config,
            "rules": RULES,
            "matchConditions": MATCH_CONDITIONS,
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout_seconds,
        }

    api_version = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": api_version,
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [hook(VALIDATING_WEBHOOK, VALIDATE_PATH, failure_policy)],
        },
        {
            "apiVersion": api_version,
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                hook(MUTATING_WEBHOOK, MUTATE_PATH, "Ignore") | {"reinvocationPolicy": "Never"}
            ],
        },
    ]
