"""The operator's watch-fed store: events, relists, own writes overlaid, label selection."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from kubernetes.client import ApiClient

from chronotope.kube.reads import KubeReads
from chronotope.kube.store import OperatorCache, Store, parse_selector
from chronotope.workloads.node_fit import EPHEMERAL


def pod(name: str, ns: str = "a", **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_events_relists_and_selection() -> None:
    s = Store()
    s.on_sync([pod("w0", job="x"), pod("w1", job="x"), pod("other", "b", job="x")])
    s.on_event("DELETED", pod("w1", job="x"))
    s.on_event("ADDED", pod("w2", job="y"))
    assert names(s.list("a", "job=x")) == ["w0"]
    assert names(s.list(selector="job=x")) == ["other", "w0"]
    assert names(s.list("a")) == ["w0", "w2"]
    s.on_sync([pod("only")])
    assert names(s.list()) == ["only"]


def test_own_writes_count_until_the_watch_delivers_the_real_object() -> None:
    s = Store()
    s.put([pod("new", job="x")])
    assert len(s.list("a", "job=x")) == 1
    bound = pod("new", job="x") | {"spec": {"nodeName": "n1"}}
    s.on_event("MODIFIED", bound)
    s.put([pod("new", job="x")])  # a late overlay never hides newer watch state
    assert s.list("a", "job=x")[0]["spec"] == {"nodeName": "n1"}


def _job(rv: str, uid: str = "u1", **status: str) -> dict[str, object]:
    meta = {"name": "j", "namespace": "a", "uid": uid, "resourceVersion": rv}
    return {"metadata": meta, "status": status}


def test_a_watch_event_older_than_the_operators_own_write_is_dropped() -> None:
    # the operator patches annotations (rv 11), then status (rv 12), and stores what the
    # second patch returned; the watch then delivers rv 11, which has no status yet
    s = Store()
    s.on_event("ADDED", _job("10"))
    assert s.on_event("MODIFIED", _job("12", phase="Starting"))
    assert not s.on_event("MODIFIED", _job("11"))
    assert s.get("a", "j") == _job("12", phase="Starting")
    assert s.on_event("MODIFIED", _job("12", phase="Starting"))  # its own event: kept
    assert s.on_event("MODIFIED", _job("13", phase="Running"))
    assert s.get("a", "j") == _job("13", phase="Running")
    assert s.on_event("ADDED", _job("5", uid="u2"))  # deleted and created again: a new object
    assert s.get("a", "j") == _job("5", uid="u2")
    assert s.on_event("MODIFIED", _job("abc", uid="u2", phase="x"))  # not a number: applied
    assert s.on_event("DELETED", _job("1", uid="u2"))
    assert s.get("a", "j") is None


def test_selector_parsing() -> None:
    assert parse_selector("a=b, c=d") == {"a": "b", "c": "d"}
    assert parse_selector(None) == {}
    with pytest.raises(ValueError, match="only a=b"):
        parse_selector("a in (b)")


def test_count_requests_names_each_verb_and_watches() -> None:
    from kubernetes import client

    from chronotope.kube.client import count_requests, resource_of

    api = client.ApiClient(configuration=client.Configuration())
    sent: list[str] = []
    api.rest_client.request = lambda method, url, *a, **kw: sent.append(method)
    verbs: list[tuple[str, str]] = []
    count_requests(api, lambda verb, resource: verbs.append((verb, resource)))
    api.rest_client.request("GET", "https://h:6443/api/v1/pods", query_params=[("watch", True)])
    api.rest_client.request("GET", "/api/v1/pods?limit=5", query_params=[])
    api.rest_client.request("PATCH", "/apis/x")
    assert verbs == [("WATCH", "pods"), ("GET", "pods"), ("PATCH", "other")]
    assert sent == ["GET", "GET", "PATCH"]  # every request still goes out
    assert resource_of("/api/v1/namespaces/ns/pods/p/status") == "pods"
    assert resource_of("/apis/chronotope.dev/v1alpha1/namespaces/a/trainingjobs/j") == (
        "trainingjobs"
    )
    assert resource_of("/apis/chronotope.dev/v1alpha1/queues/q") == "queues"
    assert resource_of("/api/v1/namespaces/ns") == "namespaces"
    assert resource_of("/api/v1/namespaces/ns/events") == "events"
    assert resource_of("/version") == "other"


def test_a_store_counts_its_changes_but_not_a_dropped_event() -> None:
    s = Store()
    s.on_event("ADDED", _job("10"))
    s.on_event("MODIFIED", _job("12"))
    assert s.changes == 2
    s.on_event("MODIFIED", _job("11"))  # older: dropped
    assert s.changes == 2
    s.on_sync([])
    s.put([pod("new")])
    assert s.changes == 4


def test_the_volume_rules_are_worked_out_again_only_after_a_change() -> None:
    # (`KubeReads.volume_rules`: every claim parsed on each call cost 120-135 ms at 10,000)
    cache = SimpleNamespace(
        claims=Store(),
        volumes=Store(),
        storage_classes=Store(),
        csi_drivers=Store(),
        csi_capacities=Store(),
    )
    reads = KubeReads(cast(ApiClient, None), cast(OperatorCache, cache))
    first = reads.volume_rules()
    assert list(first) == [EPHEMERAL]  # no class: a generic ephemeral volume goes anywhere
    assert reads.volume_rules() is first
    claim = {"metadata": {"name": "data", "namespace": "a"}, "spec": {}}
    cache.claims.on_event("ADDED", claim)
    second = reads.volume_rules()
    assert list(second) == [EPHEMERAL, "a/data"]
    assert reads.volume_rules() is second
    cache.storage_classes.on_sync([])
    third = reads.volume_rules()
    assert third is not second
    cache.csi_capacities.on_event("ADDED", {"metadata": {"name": "p", "namespace": "csi"}})
    assert reads.volume_rules() is not third  # where a CSI driver has room
