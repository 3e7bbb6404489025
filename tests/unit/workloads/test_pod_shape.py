"""The pod-template walker (workloads.pod_shape) and the type table it walks (kube.admission)."""

from __future__ import annotations

import pytest

from chronotope.kube.admission import _expr, pod_template_types
from chronotope.workloads.pod_shape import MAX_PROBLEMS, ObjectType, check_shape

POD = {"name": "str", "items": "list:Item", "limits": "map:quantity"}
TABLE = {
    "Pod": ObjectType(POD, frozenset({"name"})),
    "Item": ObjectType({"port": "int", "on": "bool", "weight": "float", "raw": "any"}),
}


@pytest.mark.parametrize(
    ("value", "errors", "unknown"),
    [
        ({"name": "a"}, (), ()),
        ({"name": "a", "items": None, "limits": None}, (), ()),
        ({}, ("p.name: required",), ()),
        ({"name": None}, ("p.name: required",), ()),
        ("x", ("p: must be an object, not the string 'x'",), ()),
        ({"name": 1}, ("p.name: must be a string, not the number 1",), ()),
        ({"name": "a", "items": {}}, ("p.items: must be a list, not an object",), ()),
        (
            {"name": "a", "items": [{"port": 80}, {"port": 8.0}, {"port": 8.5}, {"port": True}]},
            (
                "p.items[2].port: must be an integer, not the number 8.5",
                "p.items[3].port: must be an integer, not a boolean",
            ),
            (),
        ),
        (
            {"name": "a", "items": [{"on": "true", "weight": "1", "raw": {"x": [1]}}]},
            (
                "p.items[0].on: must be true or false, not the string 'true'",
                "p.items[0].weight: must be a number, not the string '1'",
            ),
            (),
        ),
        (
            {"name": "a", "limits": {"cpu": 1, "mem": "1.5Gi", "x": "2e3", "y": "1K", "z": []}},
            (
                "p.limits[y]: '1K' is not a quantity (e.g. 1, 500m, 4Gi)",
                "p.limits[z]: [] is not a quantity (e.g. 1, 500m, 4Gi)",
            ),
            (),
        ),
        ({"name": "a", "nmae": "b", "items": [{"prot": 1}]}, (), ("p.nmae", "p.items[0].prot")),
    ],
)
def test_check_shape_reports_by_path(
    value: object, errors: tuple[str, ...], unknown: tuple[str, ...]
) -> None:
    report = check_shape(value, "Pod", TABLE, "p")
    assert (report.errors, report.unknown) == (errors, unknown)


def test_problems_are_capped() -> None:
    report = check_shape({"name": "a", "items": [{"port": "x"}] * 50}, "Pod", TABLE, "p")
    assert len(report.errors) == MAX_PROBLEMS


def test_a_broken_table_is_a_key_error_not_bad_input() -> None:
    with pytest.raises(KeyError):
        check_shape({"name": "a", "items": [{}]}, "Pod", {"Pod": TABLE["Pod"]}, "p")


@pytest.mark.parametrize(
    ("openapi", "expr", "refs"),
    [
        ("str", "str", []),
        ("datetime", "str", []),
        ("object", "any", []),
        ("List[V1Container]", "list:V1Container", ["V1Container"]),
        ("list[V1Container]", "list:V1Container", ["V1Container"]),  # clients before 36
        ("Dict[str, str]", "map:str", []),
        ("dict(str, str)", "map:str", []),
        ("List[List[int]]", "list:list:int", []),
    ],
)
def test_client_types_become_shape_expressions(openapi: str, expr: str, refs: list[str]) -> None:
    found: list[str] = []
    assert _expr(openapi, found) == expr
    assert found == refs


def test_the_table_covers_the_pod_template_closure_with_quantities_marked() -> None:
    table = pod_template_types()
    assert table["V1PodTemplateSpec"].fields == {"metadata": "V1ObjectMeta", "spec": "V1PodSpec"}
    assert table["V1PodSpec"].fields["containers"] == "list:V1Container"
    assert "containers" in table["V1PodSpec"].required
    assert table["V1Container"].fields["imagePullPolicy"] == "str"
    assert table["V1ResourceRequirements"].fields["limits"] == "map:quantity"
    assert table["V1EmptyDirVolumeSource"].fields["sizeLimit"] == "quantity"
    assert table["V1HTTPGetAction"].fields["port"] == "any"  # int or string
    refs = {
        ref.split(":")[-1]
        for kind in table.values()
        for ref in kind.fields.values()
        if ref.split(":")[-1][:1].isupper()
    }
    assert refs <= set(table)  # closed: every referenced type is in the table
