"""A pod's CPU and memory requests as kube-scheduler's NodeResourcesFit sums them.

`k8s.io/component-helpers/resource.PodRequests`: containers add up, sidecars (init
containers with `restartPolicy: Always`) add to them, another init container runs
beside the sidecars started before it, and the pod's `overhead` is added. Before, a
sidecar counted only as an init container running alone and the overhead not at
all, so a node's free CPU looked larger than kube-scheduler's.
"""

from __future__ import annotations

from typing import Any

import pytest

from chronotope.workloads.podreq import PodRequestError, pod_resources


def _c(cpu: str, memory: str = "0", **extra: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}


@pytest.mark.parametrize(
    ("spec", "cpu", "memory"),
    [
        ({"containers": [_c("1", "1Gi"), _c("500m", "512Mi")]}, 1500, 1536),
        # an init container runs alone: the larger of it and the containers
        ({"containers": [_c("1")], "initContainers": [_c("3")]}, 3000, 0),
        # a sidecar runs with the containers; the init container after it beside it
        (
            {
                "containers": [_c("1")],
                "initContainers": [_c("250m", restartPolicy="Always"), _c("2")],
            },
            2250,
            0,
        ),
        ({"containers": [_c("1")], "initContainers": [_c("1", restartPolicy="Always")]}, 2000, 0),
        # the pod's overhead (its RuntimeClass's) on top
        (
            {"containers": [_c("1", "1Gi")], "overhead": {"cpu": "250m", "memory": "160Mi"}},
            1250,
            1184,
        ),
    ],
)
def test_requests_add_up_as_kube_scheduler_adds_them(
    spec: dict[str, Any], cpu: int, memory: int
) -> None:
    assert pod_resources({"spec": spec}) == (cpu, memory)


def test_a_malformed_quantity_names_where_it_is() -> None:
    with pytest.raises(PodRequestError, match=r"initContainers\[c\]\.resources"):
        pod_resources({"spec": {"initContainers": [_c("lots")]}})
    with pytest.raises(PodRequestError, match="overhead"):
        pod_resources({"spec": {"overhead": {"cpu": "lots"}}})
