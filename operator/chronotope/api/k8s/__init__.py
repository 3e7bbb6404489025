"""Kubernetes API types embedded in Chronotope's CRDs, from the Kubernetes OpenAPI.

`openapi` holds the vendored, trimmed OpenAPI v3 document (`core-v1.json`,
README.md: source, version, licence) and how it is cut from the full one;
`structural` turns one of its definitions into a structural CRD schema, as
controller-gen does for JobSet and Kueue. `crd_schema` is the two together.

Pure: the only I/O is reading the vendored file.
"""

from __future__ import annotations

from typing import Any

from chronotope.api.k8s.openapi import definitions, load_document
from chronotope.api.k8s.structural import INT_OR_STRING, QUANTITY, SchemaError, embedded_schema

__all__ = ["INT_OR_STRING", "QUANTITY", "SchemaError", "crd_schema", "kubernetes_version"]


def crd_schema(name: str) -> dict[str, Any]:
    """The structural schema of the vendored definition `name`, e.g. a PodTemplateSpec."""
    return embedded_schema(name, definitions(load_document()))


def kubernetes_version() -> str:
    """The Kubernetes release the vendored definitions come from (e.g. `v1.33.13`)."""
    return str(load_document()["info"]["version"])
