"""The pod template's schema: the vendored Kubernetes OpenAPI, converted as controller-gen does."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from chronotope.api.crd import build_crd
from chronotope.api.k8s import INT_OR_STRING, QUANTITY, crd_schema, kubernetes_version
from chronotope.api.k8s.openapi import ROOTS, definitions, load_document, reachable, subset
from chronotope.api.k8s.structural import SchemaError, embedded_schema
from chronotope.api.schema import embedded_fields, kubernetes_type, structural_schema
from chronotope.api.v1alpha1 import KINDS
from chronotope.api.v1alpha1.trainingjob import POD_TEMPLATE_SPEC, TrainingJobSpec
from chronotope.devcluster.settings import ClusterSettings

SPEC = Path("api/openapi-spec/v3/api__v1_openapi.json")


def _pod_template() -> dict[str, Any]:
    return crd_schema(POD_TEMPLATE_SPEC)


def _container() -> dict[str, Any]:
    containers: dict[str, Any] = _pod_template()["properties"]["spec"]["properties"]["containers"]
    return dict(containers["items"])


def _nodes(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for key, value in node.items():
            if key == "properties":
                found.extend(n for sub in value.values() for n in _nodes(sub))
            elif key in ("items", "additionalProperties"):
                found.extend(_nodes(value))
    return found


def test_the_vendored_copy_is_closed_and_names_its_source() -> None:
    doc = load_document()
    schemas = definitions(doc)
    assert reachable(schemas, ROOTS) == sorted(schemas)  # nothing extra, nothing missing
    assert doc["info"]["version"] == ClusterSettings.from_env().k8s_version
    assert doc["info"]["x-license"].startswith("Apache-2.0")
    assert kubernetes_version() == doc["info"]["version"]
    for schema in schemas.values():
        assert all("description" not in node for node in _nodes(schema))


def _full_document(version: str) -> Path | None:
    roots = [os.environ.get("GOMODCACHE", ""), str(Path.home() / "go" / "pkg" / "mod")]
    for root in filter(None, roots):
        path = Path(root) / f"k8s.io/kubernetes@{version}" / SPEC
        if path.is_file():
            return path
    path = ClusterSettings.from_env().cache_dir / "src" / f"kubernetes-{version}" / SPEC
    return path if path.is_file() else None


def test_the_vendored_copy_is_what_the_script_cuts_from_the_full_document() -> None:
    version = load_document()["info"]["version"]
    full = _full_document(version)
    if full is None:
        pytest.skip(f"no Kubernetes {version} source here (hack/build-binaries.sh fetches it)")
    made = subset(
        json.loads(full.read_text()),
        version=version,
        source=f"github.com/kubernetes/kubernetes@{version}/{SPEC.as_posix()}",
    )
    assert made == load_document(), "run hack/vendor-k8s-openapi.py"


def test_controller_gens_special_types() -> None:
    resources = _container()["properties"]["resources"]["properties"]
    assert resources["limits"]["additionalProperties"] == QUANTITY
    probe = _container()["properties"]["livenessProbe"]["properties"]
    assert probe["httpGet"]["properties"]["port"] == INT_OR_STRING
    assert probe["httpGet"]["required"] == ["port"]
    meta = _pod_template()["properties"]["metadata"]
    assert sorted(meta["properties"]) == [
        "annotations",
        "finalizers",
        "labels",
        "name",
        "namespace",
    ]
    assert meta["properties"]["labels"] == {
        "type": "object",
        "additionalProperties": {"type": "string"},
    }


def test_defaults_required_and_list_semantics() -> None:
    container = _container()
    assert container["required"] == ["name"]
    assert "default" not in container["properties"]["name"]  # a zero-value filler, dropped
    ports = container["properties"]["ports"]
    assert ports["x-kubernetes-list-type"] == "map"
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    assert ports["items"]["properties"]["protocol"]["default"] == "TCP"  # a +default marker
    secrets = _pod_template()["properties"]["spec"]["properties"]["imagePullSecrets"]
    # a list-map key the items do not require keeps its zero default (the server needs one)
    assert secrets["items"]["properties"]["name"] == {"type": "string", "default": ""}
    assert secrets["items"]["x-kubernetes-map-type"] == "atomic"


def test_the_whole_schema_is_structural_and_description_free() -> None:
    for node in _nodes(_pod_template()):
        assert "description" not in node
        assert not {"$ref", "allOf", "oneOf"} & set(node), node
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == INT_OR_STRING["anyOf"]
        else:
            assert "anyOf" not in node
            assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), node
        if node.get("type") == "array":
            assert "items" in node
        assert not {k for k in node if k.startswith("x-kubernetes-patch")}


def _defs(**extra: Any) -> dict[str, Any]:
    return {"t.A": {"type": "object", "properties": extra}}


@pytest.mark.parametrize(
    ("defs", "words"),
    [
        pytest.param(_defs(x={"type": "string", "not": {}}), "keyword 'not'", id="unknown-key"),
        pytest.param(
            _defs(x={"oneOf": [{"type": "string"}, {"type": "integer"}]}),
            "keyword 'oneOf'",
            id="union",
        ),
        pytest.param(_defs(x={"description": "no type"}), "no type", id="untyped"),
        pytest.param(
            _defs(x={"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "allOf with 2 parts",
            id="allof",
        ),
        pytest.param(
            _defs(
                x={
                    "type": "array",
                    "items": {"type": "object", "properties": {"k": {"type": "string"}}},
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["k"],
                }
            ),
            "neither required nor defaulted",
            id="map-key",
        ),
        pytest.param(_defs(x={"$ref": "#/components/schemas/t.B"}), "no definition", id="ref"),
    ],
)
def test_constructs_the_api_server_would_refuse_fail_generation(
    defs: dict[str, Any], words: str
) -> None:
    with pytest.raises(SchemaError, match=words):
        embedded_schema("t.A", defs)


def test_a_type_that_contains_itself_stops_as_free_form() -> None:
    defs = {
        "t.Node": {
            "type": "object",
            "properties": {"child": {"$ref": "#/components/schemas/t.Node"}},
        }
    }
    assert embedded_schema("t.Node", defs) == {
        "type": "object",
        "properties": {"child": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }


def test_the_trainingjob_crd_embeds_the_pod_template() -> None:
    assert embedded_fields(TrainingJobSpec) == {"template": POD_TEMPLATE_SPEC}
    info = next(i for i in KINDS if i.kind == "TrainingJob")
    spec = build_crd(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["template"]
    assert template["description"].startswith("Pod template for every worker")
    assert {k: v for k, v in template.items() if k != "description"} == _pod_template()
    assert "x-kubernetes-preserve-unknown-fields" not in template
    others = [i for i in KINDS if i.kind != "TrainingJob"]
    assert all(embedded_fields(i.spec_model) == {} for i in others)


def test_only_a_free_form_field_can_hold_a_kubernetes_type() -> None:
    class Bad(BaseModel):
        template: str = Field(json_schema_extra=kubernetes_type(POD_TEMPLATE_SPEC))

    with pytest.raises(SchemaError, match="dict"):
        structural_schema(Bad)
