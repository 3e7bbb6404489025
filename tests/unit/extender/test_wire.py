"""The extender wire format, pinned to the Go field names of k8s.io/kube-scheduler/extender/v1."""

from __future__ import annotations

from typing import Any

import pytest

from chronotope.extender import wire

# Field names exactly as in extender/v1/types.go (the structs have no JSON tags).
GO_EXTENDER_ARGS = ("Pod", "Nodes", "NodeNames")
GO_FILTER_RESULT = ("Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error")
GO_HOST_PRIORITY = ("Host", "Score")
GO_BINDING_ARGS = ("PodName", "PodNamespace", "PodUID", "Node")
GO_BINDING_RESULT = ("Error",)

POD = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}


def test_filter_args_with_node_names() -> None:
    args = wire.parse_extender_args(
        dict(zip(GO_EXTENDER_ARGS, [POD, None, ["a", "b"]], strict=True))
    )
    assert args.node_names == ["a", "b"]
    assert args.pod_key == "ns/p"


def test_filter_args_with_node_objects() -> None:
    nodes = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    args = wire.parse_extender_args({"Pod": POD, "Nodes": nodes})
    assert args.node_names == ["a", "b"]
    assert args.nodes_given_as_objects


def test_filter_result_keys_are_go_field_names() -> None:
    result = wire.filter_result(["a"], {"b": "full"}, {"c": "wrong model"})
    assert tuple(result) == GO_FILTER_RESULT
    assert result["NodeNames"] == ["a"]
    assert result["FailedAndUnresolvableNodes"] == {"c": "wrong model"}


def test_host_priorities_are_clamped() -> None:
    out = wire.host_priorities({"a": 15, "b": -3, "c": 7})
    assert all(tuple(item) == GO_HOST_PRIORITY for item in out)
    assert [item["Score"] for item in out] == [10, 0, 7]


def test_binding_args_and_result() -> None:
    body = dict(zip(GO_BINDING_ARGS, ["p", "ns", "uid-1", "node-1"], strict=True))
    args = wire.parse_binding_args(body)
    assert (args.pod_key, args.pod_uid, args.node) == ("ns/p", "uid-1", "node-1")
    assert tuple(wire.binding_result("x")) == GO_BINDING_RESULT


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"Pod": "x", "NodeNames": []}, "Pod must be a Pod object"),
        ({"Pod": POD}, "needs NodeNames"),
        ({"Pod": POD, "NodeNames": [1]}, "list of node names"),
        ({"Pod": POD, "Nodes": {"items": [{}]}}, "metadata.name"),
    ],
)
def test_malformed_extender_args(body: Any, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.parse_extender_args(body)


def test_malformed_binding_args_name_the_field() -> None:
    with pytest.raises(wire.WireError, match="PodUID"):
        wire.parse_binding_args({"PodName": "p", "PodNamespace": "ns", "Node": "n"})
