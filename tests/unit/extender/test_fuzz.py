"""Fuzzing the extender's wire format: any JSON is either parsed or refused with a
WireError (HTTP 400), and what is parsed never crashes the filter."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chronotope.extender import wire
from tests.unit.extender.test_service import Recorder, service

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "metadata",
        "spec",
        "annotations",
        "labels",
        "containers",
        "resources",
        "limits",
        "nodeSelector",
        "name",
        "namespace",
        "chronotope.dev/gpu-share",
        "nvidia.com/gpu",
        "chronotope.dev/gpu-compute-percent",
        "chronotope.dev/pod-group",
        "requests",
    ]
)
# pod-shaped documents with wrong types in the places the extender reads
POD_LIKE = st.recursive(
    st.none() | st.integers(-2, 9) | st.sampled_from(["1", "50", "x", "", "T4", "8Gi"]),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=16,
)


def _check(body: Any) -> None:
    try:
        args = wire.parse_extender_args(body)
    except wire.WireError:
        return
    out = service(Recorder()).filter(args.pod, args.node_names)
    assert set(out.passed) <= set(args.node_names)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON)
def test_any_json_is_parsed_or_refused(body: Any) -> None:
    _check(body)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"metadata": st.dictionaries(KEYS, POD_LIKE, max_size=4), "spec": POD_LIKE}
    ),
    st.lists(st.sampled_from(["a", "t", "v", "ghost"]), max_size=4),
)
def test_pod_shaped_nonsense_never_crashes_the_filter(
    pod: dict[str, Any], names: list[str]
) -> None:
    _check({"Pod": pod, "NodeNames": names})


# --- bounds: depth, size and types of what kube-scheduler's caller may send


def _nest(leaf: Any, depth: int, kinds: list[bool]) -> Any:
    """`leaf` inside `depth` lists or objects (kinds[i % len]: True for an object)."""
    value = leaf
    for i in range(depth):
        value = {"k": value} if kinds[i % len(kinds)] else [value]
    return value


@settings(max_examples=150, deadline=None)
@given(
    st.integers(wire.MAX_DEPTH + 1, 5000),
    st.lists(st.booleans(), min_size=1, max_size=4),
    st.sampled_from(["Pod.metadata.labels", "Pod.spec", "Pod.spec.affinity", "NodeNames", "top"]),
)
def test_any_nesting_deeper_than_the_bound_is_refused(
    depth: int, kinds: list[bool], where: str
) -> None:
    deep = _nest(None, depth, kinds)
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    body: Any = {"Pod": pod, "NodeNames": ["a"]}
    if where == "Pod.metadata.labels":
        pod["metadata"]["labels"] = deep
    elif where == "Pod.spec":
        pod["spec"] = deep
    elif where == "Pod.spec.affinity":
        pod["spec"]["affinity"] = deep  # a field the extender never reads
    elif where == "NodeNames":
        body["NodeNames"] = deep
    else:
        body = deep
    with pytest.raises(wire.WireError, match="nested deeper than"):
        wire.parse_extender_args(body)
    with pytest.raises(wire.WireError, match="nested deeper than"):
        wire.parse_binding_args({"PodName": deep} if where != "top" else deep)


def test_the_depth_bound_is_exact() -> None:
    for kinds in ([True], [False], [True, False]):
        wire.check_depth(_nest("leaf", wire.MAX_DEPTH, kinds))
        with pytest.raises(wire.WireError, match=f"nested deeper than {wire.MAX_DEPTH} levels"):
            wire.check_depth(_nest("leaf", wire.MAX_DEPTH + 1, kinds))
    wire.check_depth("a scalar")


def test_a_real_pods_depth_is_well_within_the_bound() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "managedFields": [
                {"fieldsV1": {"f:spec": {"f:affinity": {"f:nodeAffinity": {"f:x": {".": {}}}}}}}
            ],
        },
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}
                        ]
                    }
                }
            },
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    wire.check_depth(pod, 12)
    assert wire.parse_extender_args({"Pod": pod, "NodeNames": ["a"]}).node_names == ["a"]


WRONG = st.one_of(
    st.text(max_size=8), st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)
)
# (path inside the pod, what the extender needs there)
FIELDS = [
    (("metadata", "annotations"), "map"),
    (("metadata", "labels"), "map"),
    (("metadata", "name"), "string"),
    (("metadata", "namespace"), "string"),
    (("spec",), "object"),
    (("spec", "nodeSelector"), "map"),
    (("spec", "containers"), "list"),
    (("spec", "initContainers"), "list"),
    (("spec", "containers", 0, "resources"), "object"),
    (("spec", "containers", 0, "resources", "limits"), "object"),
    (("spec", "containers", 0, "resources", "requests"), "object"),
]


def _wrong_for(kind: str, value: Any) -> bool:
    if kind == "string":
        return not isinstance(value, str)
    if kind == "list":
        return not isinstance(value, list) or not all(isinstance(v, dict) for v in value)
    return not isinstance(value, dict)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), WRONG | st.dictionaries(st.text(max_size=3), WRONG, max_size=2))
def test_a_wrong_type_where_the_extender_reads_is_refused_by_name(
    field: tuple[tuple[str | int, ...], str], value: Any
) -> None:
    path, kind = field
    maps_strings = kind == "map" and isinstance(value, dict)
    if maps_strings and all(isinstance(v, str) for v in value.values()):
        return  # a well-formed map
    if kind != "map" and not _wrong_for(kind, value):
        return
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {}, "requests": {}}}]},
    }
    parent: Any = pod
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    with pytest.raises(wire.WireError) as info:
        wire.parse_extender_args({"Pod": pod, "NodeNames": ["a"]})
    # the message names the field (a resources' limits or requests: the resources)
    dotted = ".".join(str(step) for step in path).replace(".0.", "[0].")
    named = dotted.removesuffix(".limits").removesuffix(".requests")
    assert str(info.value).startswith(f"ExtenderArgs.Pod.{named} must ")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    JSON
    | st.fixed_dictionaries(
        {"PodName": JSON, "PodNamespace": JSON, "PodUID": JSON, "Node": JSON},
    )
    | st.fixed_dictionaries(
        {
            "PodName": st.text(max_size=300),
            "PodNamespace": st.text(max_size=3),
            "PodUID": st.text(max_size=3),
            "Node": st.text(max_size=3),
        },
    )
)
def test_any_binding_args_are_parsed_or_refused(body: Any) -> None:
    try:
        args = wire.parse_binding_args(body)
    except wire.WireError:
        return
    for value in (args.pod_name, args.pod_namespace, args.pod_uid, args.node):
        assert isinstance(value, str)
        assert 0 < len(value) <= wire.MAX_NAME


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=300), max_size=4))
def test_node_names_are_bounded(names: list[str]) -> None:
    body = {"Pod": {"metadata": {}}, "NodeNames": names}
    if all(0 < len(n) <= wire.MAX_NAME for n in names):
        assert wire.parse_extender_args(body).node_names == names
    else:
        with pytest.raises(wire.WireError, match="NodeNames"):
            wire.parse_extender_args(body)
    nodes = {
        "Pod": {"metadata": {}},
        "Nodes": {"items": [{"metadata": {"name": n}} for n in names]},
    }
    if all(0 < len(n) <= wire.MAX_NAME for n in names):
        assert wire.parse_extender_args(nodes).node_names == names
    else:
        with pytest.raises(wire.WireError, match=r"Nodes\.items"):
            wire.parse_extender_args(nodes)
