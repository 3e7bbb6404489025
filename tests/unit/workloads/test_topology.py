"""A TrainingJob's required `placement.topology`: every worker in one domain.

Before, `placement.topology` and `required` were accepted by the API and read by
nothing: a gang asked to stay in one zone was counted and placed across zones.
Now the count (`training.workers_that_fit`), the scheduling pass's placement
(`capacity.take`, the extender's gang rule within the chosen domain) and the
joint CP-SAT plan keep a required domain; a preference stays a preference.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy, TopologyLevel, TrainingJobSpec
from chronotope.sharing.labels import NVLINK_LABEL, RACK_LABEL, ZONE_LABEL
from chronotope.solver.slots import domain_of, gang_domain, gang_room
from chronotope.workloads.capacity import NodeCapacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.joint import Contender, _workload, arbitrate, options_for
from chronotope.workloads.node_fit import seeks_itself_within
from chronotope.workloads.training import Action, decide, workers_that_fit

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
PACK = PlacementStrategy.PACK


def _node(name: str, zone: str, free: int, *, rack: str = "") -> NodeCapacity:
    labels = {ZONE_LABEL: zone} | ({RACK_LABEL: rack} if rack else {})
    return NodeCapacity(
        name, "A100", 8, free, True, zone=zone, free_gpus=tuple(range(8 - free, 8)), labels=labels
    )


# zone a: 8 + 2 free; zone b: 8 + 8 free
CLUSTER = (
    _node("a-0", "a", 8),
    _node("a-1", "a", 2),
    _node("b-0", "b", 8),
    _node("b-1", "b", 8),
)


def _spec(
    workers: int, topology: str = "Any", required: bool = True, **over: Any
) -> TrainingJobSpec:
    base: dict[str, Any] = {
        "replicas": workers,
        "gpu": {"count": 4},
        "gpuTypes": [{"name": "A100", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "A100", "durationSeconds": 3600},
        "placement": {"strategy": "Pack", "topology": topology, "required": required},
        "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
    }
    return TrainingJobSpec.model_validate(base | over)


def test_a_domain_is_named_by_its_label_and_a_node_without_it_is_its_own() -> None:
    labels = {ZONE_LABEL: "z1", RACK_LABEL: "r1", NVLINK_LABEL: "nv1"}
    assert domain_of("n", labels, TopologyLevel.ZONE) == "Zone/z1"
    assert domain_of("n", labels, TopologyLevel.RACK) == "Rack/r1"
    assert domain_of("n", labels, TopologyLevel.NVLINK_DOMAIN) == "NVLinkDomain/nv1"
    assert domain_of("n", labels, TopologyLevel.NODE) == "node/n"
    assert domain_of("n", {}, TopologyLevel.ZONE) == "node/n"
    assert domain_of("n", labels, TopologyLevel.ANY) is None


def test_the_gang_goes_into_the_fullest_domain_that_holds_it() -> None:
    fitting = [("a-0", 8), ("a-1", 2), ("b-0", 8), ("b-1", 8)]
    zones = {"a-0": "a", "a-1": "a", "b-0": "b", "b-1": "b"}
    # two workers of 4: both zones hold them; a has fewer free GPUs (10 < 16)
    assert gang_domain(fitting, zones, PACK, 2, 4) == "a"
    # four workers of 4: only b holds them (a holds 2)
    assert gang_domain(fitting, zones, PACK, 4, 4) == "b"
    assert gang_domain(fitting, zones, PACK, 5, 4) is None
    # StrictSpread: one a node, so two workers need two nodes with room in one zone
    assert gang_domain(fitting, zones, PlacementStrategy.STRICT_SPREAD, 2, 8) == "b"
    assert gang_room([8, 2], 4, PlacementStrategy.STRICT_PACK) == 2
    assert gang_room([], 4, PACK) == 0


def test_a_required_zone_counts_what_one_zone_holds() -> None:
    assert workers_that_fit(CLUSTER, 4, PACK, free=True) == 6
    assert workers_that_fit(CLUSTER, 4, PACK, True, TopologyLevel.ZONE) == 4
    assert workers_that_fit(CLUSTER, 4, PACK, False, TopologyLevel.ZONE) == 4  # 2 x 8 a zone


def test_a_gang_that_no_one_zone_holds_waits_and_says_so_unless_it_only_prefers() -> None:
    # five workers of 4 GPUs: the cluster has room for six, no zone for more than four
    waits = decide(_spec(5, "Zone"), CLUSTER, NOW)
    assert waits.action is Action.IMPOSSIBLE  # no zone could ever hold five
    assert "at most 4 worker(s) of 4 GPU(s) (Pack within one Zone), the job needs 5" in (
        waits.reason
    )
    # a wish, not a rule: it starts across zones
    assert decide(_spec(5, "Zone", required=False), CLUSTER, NOW).action is Action.START
    # three workers: zone b holds them now, zone a (10 free) does not
    starts = decide(_spec(3, "Zone"), CLUSTER, NOW)
    assert starts.action is Action.START
    # zone b busy: room for two now within one zone, it waits
    busy = (*CLUSTER[:2], _node("b-0", "b", 0), _node("b-1", "b", 8))
    later = decide(_spec(3, "Zone"), busy, NOW)
    assert later.action is not Action.START
    assert "room for 2 of 3 worker(s) now within one Zone" in later.reason


@pytest.mark.parametrize("strategy", ["Pack", "Spread"])
def test_the_pass_places_the_gang_inside_the_domain(strategy: str) -> None:
    # three workers of 4 GPUs: Spread alone puts one on a-0 (a node it does not use yet,
    # the most free GPUs); within one zone they all go to zone b, the only one holding them
    s = PlacementStrategy(strategy)
    _, anywhere = take(CLUSTER, "A100", 3, 4, strategy=s)
    if s is PlacementStrategy.SPREAD:
        assert {n for n, _ in anywhere} == {"a-0", "b-0", "b-1"}
    left, placed = take(CLUSTER, "A100", 3, 4, strategy=s, topology=TopologyLevel.ZONE)
    assert len(placed) == 3
    assert {n for n, _ in placed} <= {"b-0", "b-1"}
    assert sum(n.free for n in left) == sum(n.free for n in CLUSTER) - 12
    # two workers fit zone a (a-0's 8): the fuller zone, so zone b stays whole
    _, two = take(CLUSTER, "A100", 2, 4, strategy=s, topology=TopologyLevel.ZONE)
    assert {n for n, _ in two} == {"a-0"}


def test_no_domain_holds_the_gang_then_nothing_is_placed() -> None:
    left, placed = take(CLUSTER, "A100", 5, 4, topology=TopologyLevel.ZONE)
    assert placed == ()  # counted by number, as any gang that does not fit
    assert sum(n.free for n in left) == sum(n.free for n in CLUSTER) - 20


def test_a_preferred_domain_is_kept_when_one_holds_the_gang_else_it_goes_anywhere() -> None:
    spread = PlacementStrategy.SPREAD
    _, kept = take(
        CLUSTER, "A100", 3, 4, strategy=spread, topology=TopologyLevel.ZONE, required=False
    )
    assert {n for n, _ in kept} <= {"b-0", "b-1"}
    _, anywhere = take(CLUSTER, "A100", 5, 4, topology=TopologyLevel.ZONE, required=False)
    assert len(anywhere) == 5


def test_the_joint_plan_keeps_a_required_domain() -> None:
    s = _spec(3, "Zone")
    contenders = [Contender("ns/zoned", s, options_for([decide(s, CLUSTER, NOW)]))]
    assert _workload(contenders[0], NOW, CLUSTER).same_topology == "zone"
    out = arbitrate("ns/zoned", contenders, CLUSTER, NOW)
    assert out.starts
    assert {n for n, _ in out.placements} <= {"b-0", "b-1"}
    assert (
        _workload(Contender("x", _spec(3), contenders[0].options), NOW, CLUSTER).same_topology == ""
    )


def _affine(key: str, app: str = "me") -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _job(spec: TrainingJobSpec, affinity: dict[str, Any]) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": "me"}},
        "spec": {"affinity": affinity, "containers": [{"name": "w", "image": "r/t:1"}]},
    }
    body = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {"metadata": {"name": "j", "namespace": "ns"}, "spec": body | {"template": template}}


def test_workers_whose_pod_affinity_seeks_their_own_zone_require_one_zone() -> None:
    # kube-scheduler puts the others only in the first one's zone: the plan must too
    assert seeks_itself_within({"affinity": _affine(ZONE_LABEL)}, {"app": "me"}) is (
        TopologyLevel.ZONE
    )
    assert seeks_itself_within({"affinity": _affine(RACK_LABEL)}, {"app": "me"}) is (
        TopologyLevel.RACK
    )
    # another pod's label, or the hostname (StrictPack, `seeks_itself`): not this rule
    assert seeks_itself_within({"affinity": _affine(ZONE_LABEL, "cache")}, {"app": "me"}) is None
    assert seeks_itself_within({"affinity": _affine("kubernetes.io/hostname")}, {"app": "me"}) is (
        None
    )
    got = job_spec(_job(_spec(2), _affine(ZONE_LABEL))).placement
    assert (got.topology, got.required) == (TopologyLevel.ZONE, True)
    # a narrower domain the job requires itself is kept
    rack = job_spec(_job(_spec(2, "Rack"), _affine(ZONE_LABEL))).placement
    assert (rack.topology, rack.required) == (TopologyLevel.RACK, True)
    # a wider wish gives way to the affinity's rule
    wish = job_spec(_job(_spec(2, "Zone", required=False), _affine(RACK_LABEL))).placement
    assert (wish.topology, wish.required) == (TopologyLevel.RACK, True)


def test_workers_that_seek_their_own_zone_go_only_on_nodes_with_a_zone() -> None:
    # kube-scheduler refuses a pod with a required pod affinity on a key any node that
    # lacks the key: the plan leaves such nodes out too (a node affinity the workers carry)
    spec = job_spec(_job(_spec(1), _affine(ZONE_LABEL)))
    terms = spec.template["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": ZONE_LABEL, "operator": "Exists"}]}]
    bare = NodeCapacity("bare", "A100", 8, 8, True, free_gpus=tuple(range(8)), labels={})
    assert decide(spec, (bare,), NOW).action is Action.IMPOSSIBLE
    assert decide(spec, (bare, CLUSTER[2]), NOW).action is Action.START
