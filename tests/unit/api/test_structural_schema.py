"""The generated CRDs obey the API server's structural-schema and CEL-cost rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from chronotope.api.crd import build_crd
from chronotope.api.k8s import INT_OR_STRING
from chronotope.api.schema import SchemaError, embedded_fields, structural_schema, walk_properties
from chronotope.api.v1alpha1 import KINDS, KindInfo

FORBIDDEN = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "const", "title", "uniqueItems"}
IDS = [info.kind for info in KINDS]


def _own_fields(info: KindInfo, section: str) -> list[tuple[str, dict[str, Any]]]:
    """Chronotope's own fields: a Kubernetes type's inner fields are the Kubernetes API's."""
    schema = _schema(info)["properties"][section]
    embedded = [f"spec.{p}" for p in embedded_fields(info.spec_model)] if section == "spec" else []
    return [
        (path, node)
        for path, node in walk_properties(schema, section)
        if not any(path.startswith(f"{e}.") or path.startswith(f"{e}[") for e in embedded)
    ]


def _schema(info: KindInfo) -> dict[str, Any]:
    version = build_crd(info)["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _nodes(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for key, value in node.items():
            if key == "properties":
                for sub in value.values():
                    found.extend(_nodes(sub))
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                found.extend(_nodes(value))
    return found


@pytest.mark.parametrize("info", KINDS, ids=IDS)
def test_every_node_is_typed_and_structural(info: KindInfo) -> None:
    for node in _nodes(_schema(info)):
        if node.get("x-kubernetes-int-or-string"):  # the one structural anyOf
            assert node["anyOf"] == INT_OR_STRING["anyOf"]
            assert "type" not in node
            continue
        assert FORBIDDEN.isdisjoint(node), sorted(FORBIDDEN & set(node))
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), node
        assert node.get("additionalProperties") is not False
        if node.get("exclusiveMinimum") is not None:
            assert node["exclusiveMinimum"] is True
            assert "minimum" in node


@pytest.mark.parametrize("info", KINDS, ids=IDS)
def test_every_field_has_a_description(info: KindInfo) -> None:
    for section in ("spec", "status"):
        for path, node in _own_fields(info, section):
            assert node.get("description"), f"{info.kind} {path} has no description"


@pytest.mark.parametrize("info", KINDS, ids=IDS)
def test_spec_lists_and_strings_are_bounded_for_cel_cost(info: KindInfo) -> None:
    # a Kubernetes type's fields are unbounded, as in the type itself: no rule reads them
    # (the API server estimates every rule's cost when it accepts the CRD: e2e/api)
    for path, node in _own_fields(info, "spec"):
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path} needs maxItems"
        if node.get("type") == "string":
            assert {"maxLength", "enum", "format"} & set(node), f"{path} needs maxLength"


@pytest.mark.parametrize("info", KINDS, ids=IDS)
def test_rules_have_messages_and_valid_field_paths(info: KindInfo) -> None:
    for node in _nodes(_schema(info)):
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["rule"]
            assert rule["message"]
            field = rule.get("fieldPath")
            if field:
                target = node
                for part in field.lstrip(".").split("."):
                    target = target["properties"][part]


def test_kubectl_ergonomics() -> None:
    for info in KINDS:
        crd = build_crd(info)
        names = crd["spec"]["names"]
        assert names["categories"] == ["chronotope"]
        assert names["shortNames"]
        version = crd["spec"]["versions"][0]
        assert "status" in version["subresources"]
        columns = [c["name"] for c in version["additionalPrinterColumns"]]
        # workloads lead with their phase; the quota kinds have none (Kueue's columns)
        if info.kind not in {"Queue", "LocalQueue"}:
            assert columns[0] == "Phase"
        assert columns[-1] == "Age"
    scopes = {info.kind: build_crd(info)["spec"]["scope"] for info in KINDS}
    assert scopes["Queue"] == "Cluster"
    assert {k for k, scope in scopes.items() if scope == "Namespaced"} == set(scopes) - {"Queue"}
    scale = build_crd(KINDS[0])["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def test_unions_are_refused() -> None:
    class Bad(BaseModel):
        value: int | str

    with pytest.raises(SchemaError, match="unions"):
        structural_schema(Bad)


def test_optional_becomes_optional_not_nullable() -> None:
    class Opt(BaseModel):
        value: int | None = None

    node = structural_schema(Opt)["properties"]["value"]
    assert node == {"type": "integer"}
