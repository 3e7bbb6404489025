"""Turn pydantic JSON Schema into a Kubernetes *structural* openAPIV3Schema.

Why: the API server accepts only structural schemas (every node typed, no
`$ref`, no `anyOf` with null, no `additionalProperties: false`, OpenAPI 3.0
`exclusiveMinimum` booleans). pydantic emits JSON Schema 2020-12, so this
module rewrites it: refs are inlined, `Optional[X]` becomes an optional `X`
(nulls are pruned by the server), `dict[str, Any]` keeps unknown fields.
Anything it does not understand raises, so an unsupported construct in a
model fails generation instead of producing a CRD the server rejects.

Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

__all__ = ["SchemaError", "structural_schema", "walk_properties"]

Schema = dict[str, Any]

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


class SchemaError(ValueError):
    """A model uses a construct that has no structural-schema equivalent."""


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
