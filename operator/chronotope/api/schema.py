"""Turn pydantic JSON Schema into a Kubernetes *structural* openAPIV3Schema.

Why: the API server accepts only structural schemas (every node typed, no
`$ref`, no `anyOf` with null, no `additionalProperties: false`, OpenAPI 3.0
`exclusiveMinimum` booleans). pydantic emits JSON Schema 2020-12, so this
module rewrites it: refs are inlined, `Optional[X]` becomes an optional `X`
(nulls are pruned by the server), `dict[str, Any]` keeps unknown fields.
Anything it does not understand raises, so an unsupported construct in a
model fails generation instead of producing a CRD the server rejects.

A field that holds a Kubernetes type (`kubernetes_type`, e.g. a pod template)
gets that type's schema from the vendored Kubernetes OpenAPI (`api.k8s`), so
the API server checks it as it checks the type itself.

Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from chronotope.api.k8s import SchemaError, crd_schema

__all__ = [
    "KUBERNETES_TYPE",
    "SchemaError",
    "embedded_fields",
    "kubernetes_type",
    "structural_schema",
    "walk_properties",
]

Schema = dict[str, Any]

KUBERNETES_TYPE = "x-chronotope-kubernetes-type"
"""JSON Schema key (on a `dict[str, Any]` field) naming the Kubernetes type the field holds."""

# Keys the Kubernetes JSONSchemaProps accepts that we pass through unchanged.
_PASS_THROUGH = frozenset(
    {
        "type",
        "format",
        "description",
        "default",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
        "nullable",
    }
)
_DROPPED = frozenset({"title", "examples", "$defs"})


def kubernetes_type(name: str) -> dict[str, Any]:
    """`json_schema_extra` for a field holding Kubernetes type `name` (an OpenAPI definition).

    Example: `Field(json_schema_extra=kubernetes_type("io.k8s.api.core.v1.PodTemplateSpec"))`.
    """
    return {KUBERNETES_TYPE: name}


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural openAPIV3Schema for `model`, with camelCase property names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _convert(raw, defs, path=model.__name__)


def _resolve(node: Schema, defs: Schema, path: str) -> Schema:
    """Inline `$ref`, single-entry `allOf` and `anyOf [X, null]`; siblings override."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        return _resolve({**copy.deepcopy(target), **node}, defs, path)
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaError(f"{path}: allOf with {len(parts)} parts")
        return _resolve({**parts[0], **node}, defs, path)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"{path}: unions are not structural; use one type")
        if node.get("default", ...) is None:
            del node["default"]
        return _resolve({**options[0], **node}, defs, path)
    return node


def _convert(node: Schema, defs: Schema, path: str) -> Schema:
    node = _resolve(node, defs, path)
    if KUBERNETES_TYPE in node:
        return _embedded(node, path)
    return _convert_resolved(node, defs, path)


def _convert_resolved(node: Schema, defs: Schema, path: str) -> Schema:
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key in _PASS_THROUGH or key.startswith("x-kubernetes-"):
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out[key.replace("exclusiveM", "m")] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            _convert_additional(out, value, defs, path)
        else:
            raise SchemaError(f"{path}: JSON Schema keyword {key!r} has no structural equivalent")
    if "default" in out and out["default"] is None:
        del out["default"]
    if "description" in out:
        out["description"] = " ".join(out["description"].split())
    if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        raise SchemaError(f"{path}: no type (structural schemas type every node)")
    return out


def _embedded(node: Schema, path: str) -> Schema:
    """The Kubernetes type's schema, with the field's own description."""
    if node.get("type") != "object":
        raise SchemaError(f"{path}: a Kubernetes type must be held by a dict[str, Any] field")
    out: Schema = {}
    if "description" in node:
        out["description"] = " ".join(node["description"].split())
    out.update(crd_schema(node[KUBERNETES_TYPE]))
    return out


def embedded_fields(model: type[BaseModel]) -> dict[str, str]:
    """Dotted path (as `walk_properties` writes it) -> Kubernetes type, for each such field."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    found: dict[str, str] = {}

    def walk(node: Schema, path: str) -> None:
        node = _resolve(node, raw.get("$defs", {}), path)
        if KUBERNETES_TYPE in node:
            found[path] = node[KUBERNETES_TYPE]
            return
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}" if path else name)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    walk(raw, "")
    return found


def _convert_additional(out: Schema, value: Any, defs: Schema, path: str) -> None:
    if value is False:
        return  # extra="forbid": the server prunes unknown fields instead
    if value is True or value == {}:
        out["x-kubernetes-preserve-unknown-fields"] = True
        return
    out["additionalProperties"] = _convert(value, defs, f"{path}{{}}")


def walk_properties(schema: Schema, path: str = "") -> list[tuple[str, Schema]]:
    """Every (dotted path, node) below `schema`, depth first; list items appear as `path[]`."""
    found: list[tuple[str, Schema]] = []
    for name, sub in schema.get("properties", {}).items():
        sub_path = f"{path}.{name}" if path else name
        found.append((sub_path, sub))
        found.extend(walk_properties(sub, sub_path))
    if "items" in schema:
        found.extend(walk_properties(schema["items"], f"{path}[]"))
    if isinstance(schema.get("additionalProperties"), dict):
        found.extend(walk_properties(schema["additionalProperties"], f"{path}{{}}"))
    return found
