"""Pod (anti-)affinity on a zone or rack, toward other pods (kube-scheduler's InterPodAffinity).

A required pod affinity on `topology.kubernetes.io/zone` to a data cache lets the
workers only into the zones where a cache pod runs (on a GPU node or not); a
required anti-affinity keeps them out of the zones where a pod it selects runs,
and a running pod's zone anti-affinity that selects them does too
(`node_fit.domains`). Before, such terms were not read: the gang was planned in
any zone, kube-scheduler did not bind it, and the stuck rule moved it after 45 s.
"""

from __future__ import annotations

from typing import Any

from chronotope.sharing.labels import ZONE_LABEL
from chronotope.workloads.capacity import admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import job_rules
from chronotope.workloads.training import decide
from tests.unit.workloads.test_backfill import node
from tests.unit.workloads.test_node_fit import A100, NOW, V100
from tests.unit.workloads.test_one_per_node import _anti
from tests.unit.workloads.test_pod_anti_affinity import _job, _near, _pod


def _zoned(name: str, product: str, gpus: int, zone: str | None) -> dict[str, Any]:
    n = node(name, product, gpus)
    if zone is not None:
        n["metadata"]["labels"][ZONE_LABEL] = zone
    return n


# a100-y: the fast type, only in zone y; v100-x in zone x; cpu-x: no GPUs, zone x;
# a100-none: an A100 node without a zone label
NODES = [
    _zoned("a100-y", A100, 8, "y"),
    _zoned("a100-none", A100, 8, None),
    _zoned("v100-x", V100, 8, "x"),
    _zoned("cpu-x", A100, 0, "x"),
]


def _rules(affinity: dict[str, Any], labels: dict[str, str] | None = None) -> Any:
    job = _job("j", metadata={"labels": labels or {"app": "trainer"}})
    job["spec"]["template"]["spec"]["affinity"] = affinity
    return job_rules(job_spec(job))


def _free(capacity: Any, rules: Any) -> dict[str, int]:
    return {n.name: n.free for t in (A100, V100) for n in admitting(capacity, t, rules).nodes}


def test_workers_that_must_share_a_zone_with_a_cache_go_only_into_its_zone() -> None:
    # the cache runs on a node without GPUs: its zone still counts
    capacity = cluster_capacity(NODES, [_pod("cache", "cpu-x", {"app": "cache"})])
    near = _rules(_near("cache", ZONE_LABEL))
    assert _free(capacity, near) == {"a100-y": 0, "a100-none": 0, "v100-x": 8}
    seen = admitting(capacity, A100, near)
    assert seen.shunned == 2
    # the job prefers the A100s; it starts on the V100s of the cache's zone at once
    job = _job("j")
    job["spec"]["template"]["spec"]["affinity"] = _near("cache", ZONE_LABEL)
    decision = decide(job_spec(job), capacity, NOW)
    assert decision.gpu_type == V100, decision.reason
    # pinned to the A100s, it waits and says why
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    decision = decide(job_spec(job), capacity, NOW)
    assert decision.gpu_type is None
    assert (
        "2 node(s) have free GPUs but a required pod affinity or anti-affinity or a topology "
        "spread keeps its workers off them, or lets fewer there: no pod in its "
        "topology.kubernetes.io/zone domain matches its workers' required pod affinity"
        in decision.reason
    ), decision.reason
    # no cache anywhere, and the workers are none: no node will do
    alone = cluster_capacity(NODES, [])
    assert set(_free(alone, near).values()) == {0}


def test_workers_kept_out_of_a_zone_by_their_anti_affinity_or_a_pods_go_elsewhere() -> None:
    pods = [_pod("noisy", "v100-x", {"app": "noisy"})]
    capacity = cluster_capacity(NODES, pods)
    anti = _rules(_anti({"matchLabels": {"app": "noisy"}}, ZONE_LABEL))
    assert _free(capacity, anti) == {"a100-y": 8, "a100-none": 8, "v100-x": 0}
    # a pod whose zone anti-affinity selects the workers, on the GPU-less node of zone x
    shy = _anti({"matchLabels": {"app": "trainer"}}, ZONE_LABEL)
    capacity = cluster_capacity(NODES, [_pod("shy", "cpu-x", {"app": "db"}, affinity=shy)])
    assert _free(capacity, _rules({}))["v100-x"] == 0
    assert _free(capacity, _rules({}, {"app": "other"}))["v100-x"] == 8


def test_a_gang_started_in_the_pass_keeps_a_zone_anti_affine_job_out_of_its_zone() -> None:
    capacity = cluster_capacity(NODES, [])
    trainer = _rules({})
    left, placed = take(capacity, V100, 1, 1, rules=trainer)
    assert [p[0] for p in placed] == ["v100-x"]
    # a later job of the pass keeps out of the trainers' zone: x
    shy = _rules(_anti({"matchLabels": {"app": "trainer"}}, ZONE_LABEL), {"app": "db"})
    assert _free(capacity, shy)["v100-x"] == 8
    assert _free(left, shy)["v100-x"] == 0
    seen = admitting(left, V100, shy)
    assert seen.shuns() == f"pod anti-affinity rules out its {ZONE_LABEL} domain x"
    # and one whose anti-affinity selects trainers, started there, keeps them out too
    left, _ = take(capacity, V100, 1, 1, rules=shy)
    assert _free(left, trainer) == {"a100-y": 8, "a100-none": 8, "v100-x": 0}


def test_the_first_of_a_zone_series_goes_anywhere_and_the_next_joins_its_zone() -> None:
    # (a node without the zone label is refused: `job_spec` requires one zone of them)
    capacity = cluster_capacity(NODES, [])
    series = _rules(_near("trainer", ZONE_LABEL))
    assert _free(capacity, series) == {"a100-y": 8, "v100-x": 8}
    left, placed = take(capacity, A100, 1, 1, rules=series)
    assert [p[0] for p in placed] == ["a100-y"]
    assert _free(left, series) == {"a100-y": 7, "v100-x": 0}
