"""The vendored Kubernetes OpenAPI definitions, and how they are cut from the full spec.

Why vendored: the CRDs embed real Kubernetes types (a TrainingJob's
`spec.template` is a core/v1 PodTemplateSpec), generated from the Kubernetes
OpenAPI rather than written by hand, and generation must work on a fresh
clone without Go or a Kubernetes checkout. `core-v1.json` beside this module
holds only the definitions reachable from `ROOTS`, with their descriptions
removed (the CRDs do not carry them); every other key and value is the
upstream `api/openapi-spec/v3/api__v1_openapi.json` of the version it names
(README.md there: source, version, licence, how to refresh it).

Pure: `subset` is dicts in, dict out; `load_document` only reads the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "ROOTS",
    "VENDORED",
    "OpenApiError",
    "definitions",
    "load_document",
    "reachable",
    "ref_name",
    "subset",
]

VENDORED = Path(__file__).with_name("core-v1.json")
"""The trimmed copy shipped in the package."""

ROOTS = ("io.k8s.api.core.v1.PodTemplateSpec",)
"""The types the CRDs embed; the vendored copy holds their closure under `$ref`."""

_REF_PREFIX = "#/components/schemas/"


class OpenApiError(ValueError):
    """The OpenAPI document lacks a definition, or is not an OpenAPI v3 document."""


def ref_name(ref: str) -> str:
    """`#/components/schemas/io.k8s.api.core.v1.PodSpec` -> `io.k8s.api.core.v1.PodSpec`."""
    if not ref.startswith(_REF_PREFIX):
        raise OpenApiError(f"unsupported $ref {ref!r} (only {_REF_PREFIX}...)")
    return ref[len(_REF_PREFIX) :]


def definitions(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """The `components.schemas` of an OpenAPI v3 document."""
    try:
        schemas: Mapping[str, Any] = document["components"]["schemas"]
    except (KeyError, TypeError):
        raise OpenApiError("not an OpenAPI v3 document: no components.schemas") from None
    return schemas


def reachable(schemas: Mapping[str, Any], roots: Iterable[str]) -> list[str]:
    """Names of `roots` and every definition they reach through `$ref`, sorted."""
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        if name not in schemas:
            raise OpenApiError(f"no definition {name!r} in the OpenAPI document")
        seen.add(name)
        pending.extend(_refs(schemas[name]))
    return sorted(seen)


def _refs(node: Any) -> list[str]:
    if isinstance(node, list):
        return [name for item in node for name in _refs(item)]
    if not isinstance(node, dict):
        return []
    found = [ref_name(node["$ref"])] if isinstance(node.get("$ref"), str) else []
    for key, value in node.items():
        if key == "properties":
            found.extend(name for sub in value.values() for name in _refs(sub))
        elif key != "$ref":
            found.extend(_refs(value))
    return found


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_descriptions(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _without_descriptions(sub) for name, sub in value.items()}
        elif key != "description":
            out[key] = _without_descriptions(value)
    return out


def subset(
    document: Mapping[str, Any], *, version: str, source: str, roots: Iterable[str] = ROOTS
) -> dict[str, Any]:
    """The vendored document: the definitions `roots` reach, descriptions removed.

    `version` (e.g. `v1.33.13`) and `source` (where the full document came from)
    are recorded in `info`, so the file says what it is a copy of.
    """
    schemas = definitions(document)
    names = reachable(schemas, roots)
    return {
        "openapi": document.get("openapi", "3.0.0"),
        "info": {
            "title": "Kubernetes core/v1 definitions embedded in Chronotope's CRDs",
            "version": version,
            "x-source": source,
            "x-license": "Apache-2.0 (The Kubernetes Authors)",
            "x-roots": list(roots),
        },
        "components": {"schemas": {name: _without_descriptions(schemas[name]) for name in names}},
    }


@cache
def load_document() -> dict[str, Any]:
    """The vendored document (read once)."""
    document: dict[str, Any] = json.loads(VENDORED.read_text(encoding="utf-8"))
    return document
