"""Topology spread (kube-scheduler's PodTopologySpread filter).

A constraint with `whenUnsatisfiable: DoNotSchedule` counts the pods its selector
selects (in the pod's own namespace) per domain of its topology key, and refuses a
node where its domain's count, plus one if it selects the pod itself, is more than
`maxSkew` above the least count of a domain it counts over (`node_fit.spread_terms`,
`node_fit.Skew`, `capacity._skews`); a gang whose own workers a constraint of
`maxSkew` 1 per node selects is placed Spread, fewest-first (`node_fit.spreads_itself`),
and its nodes take workers in levels (`node_fit.levelled`, `capacity._levelled`).
Before stop 60 the plan did not read topology spread, and until stop 61 only
`maxSkew` 1 per node while some node ran none: a gang planned where the filter
refused it was not bound there, and the stuck rule moved it after 45 s. Until stop
63 such a gang was placed StrictSpread: one with more workers than nodes said it
could never run, where kube-scheduler binds it in levels.
"""

from __future__ import annotations

from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy
from chronotope.workloads.capacity import admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import job_rules, spread_terms
from chronotope.workloads.training import decide
from tests.unit.workloads.test_backfill import node
from tests.unit.workloads.test_node_fit import A100, NOW, V100
from tests.unit.workloads.test_pod_anti_affinity import ME, _job, _labels, _pod

HOST = "kubernetes.io/hostname"
PLACE = PlacementStrategy.PACK
ZONE = "topology.kubernetes.io/zone"


def _spread(
    selector: dict[str, Any] | None,
    *,
    key: str = HOST,
    skew: int = 1,
    when: str = "DoNotSchedule",
    **extra: Any,
) -> dict[str, Any]:
    c: dict[str, Any] = {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when, **extra}
    if selector is not None:
        c["labelSelector"] = selector
    return {"topologySpreadConstraints": [c]}


TRAINERS = {"matchLabels": {"app": "trainer"}}


def test_a_constraint_is_read_as_a_term_for_the_pods_own_namespace() -> None:
    (spread,) = spread_terms(_spread(TRAINERS), ME)
    term = spread.term
    assert (spread.honor_taints, spread.every_node, spread.min_domains) == (False, False, 1)
    assert (spread.skew, spread.own, term.key) == (1, True, HOST)  # it selects ME itself
    assert term.selects(("scale", _labels(app="trainer")))
    assert not term.selects(("other", _labels(app="trainer")))  # it counts its own namespace
    assert not term.selects(("scale", _labels(app="serve")))
    # matchLabelKeys take the pod's own values
    (keyed,) = spread_terms(_spread({}, matchLabelKeys=["chronotope.dev/job"]), ME)
    assert keyed.term.selects(("scale", _labels(**{"chronotope.dev/job": "j"})))
    assert not keyed.term.selects(("scale", _labels(**{"chronotope.dev/job": "k"})))
    # any key, any skew; one that does not select the pod itself
    (zoned,) = spread_terms(_spread({"matchLabels": {"app": "serve"}}, key=ZONE, skew=3), ME)
    assert (zoned.skew, zoned.own, zoned.term.key) == (3, False, ZONE)


@pytest.mark.parametrize(
    "spec",
    [
        _spread(TRAINERS, when="ScheduleAnyway"),  # a preference: scoring, not a filter
        _spread(None),  # no selector: it counts no pod
        _spread(TRAINERS, skew=0),  # the API server rejects it
        {"topologySpreadConstraints": "junk"},
    ],
)
def test_other_constraints_are_not_read(spec: dict[str, Any]) -> None:
    assert spread_terms(spec, ME) == ()


def _spready(name: str = "j", replicas: int = 1) -> dict[str, Any]:
    job = _job(name, metadata={"labels": {"app": "trainer"}})
    job["spec"]["replicas"] = replicas
    job["spec"]["template"]["spec"] |= _spread(TRAINERS)
    return job


def test_a_node_running_a_pod_it_counts_is_refused_while_another_runs_fewer() -> None:
    # c's GPUs are all in use and it runs no trainer: its count stays 0, the least
    busy = _pod("busy", "c", {"app": "other"})
    busy["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    nodes = [node("a", A100, 8), node("b", A100, 8), node("c", A100, 8)]
    rules = job_rules(job_spec(_spready()))
    there = [busy, _pod("t", "a", {"app": "trainer"})]
    seen = admitting(cluster_capacity(nodes, there), A100, rules)
    # a: 1 + 1 - 0 is over maxSkew 1; b takes one worker
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 0), ("b", 1), ("c", 0)]
    assert seen.shunned == 2
    assert seen.shuns() == (
        "its workers' topology spread (maxSkew 1 on kubernetes.io/hostname) counts 1 pod(s) "
        "there, the fewest in a domain is 0"
    )
    # a pod in another namespace, or one it does not select, counts for nothing
    for pod in (_pod("t", "a", {"app": "trainer"}, ns="other"), _pod("s", "a", {"app": "serve"})):
        seen = admitting(cluster_capacity(nodes, [busy, pod]), A100, rules)
        assert [n.free for n in seen.nodes] == [1, 1, 0]
    # c free: every node can rise, and a gang bound fewest-first lets a take workers
    # once b and c have one; its first worker goes to b or c
    free = cluster_capacity(nodes, there[1:])
    assert [n.free for n in admitting(free, A100, rules).nodes] == [8, 8, 8]
    assert admitting(free, A100, rules).shuns() == ""
    _, placed = take(free, A100, 1, 1, rules=rules)
    assert [where for where, _ in placed] == ["c"]  # of b and c, the larger name
    # two trainers on a (pods of equal labels are counted, not merged), one on b: c is
    # the least, a is refused
    three = [*there, _pod("u", "b", {"app": "trainer"}), _pod("v", "a", {"app": "trainer"})]
    assert [n.free for n in admitting(cluster_capacity(nodes, three), A100, rules).nodes] == [
        0,
        0,
        0,
    ]


def _busy(name: str, where: str) -> dict[str, Any]:
    """A pod (app=other) that holds all 8 GPUs of node `where`: that node takes no worker."""
    pod = _pod(name, where, {"app": "other"})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    return pod


def test_a_larger_skew_lets_that_many_more_onto_a_node() -> None:
    # c is full (no trainer there): the least count stays 0, so a (one trainer) takes one
    # worker and b two
    job = _spready(replicas=3)
    job["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["maxSkew"] = 2
    spec = job_spec(job)
    assert spec.placement.strategy is PlacementStrategy.PACK
    nodes = [node("a", A100, 8), node("b", A100, 8), node("c", A100, 8)]
    trainer = _pod("t", "a", {"app": "trainer"})
    capacity = cluster_capacity(nodes, [trainer, _busy("busy", "c")])
    rules = job_rules(spec)
    assert [n.free for n in admitting(capacity, A100, rules).nodes] == [1, 2, 0]
    _, placed = take(capacity, A100, 3, 1, rules=rules, strategy=PlacementStrategy.PACK)
    assert sorted(where for where, _ in placed) == ["a", "b", "b"]
    # c free: every node rises (to 8 workers, 9 on a), and each takes up to 2 above that
    capacity = cluster_capacity(nodes, [trainer])
    assert [n.free for n in admitting(capacity, A100, rules).nodes] == [8, 8, 8]
    _, placed = take(capacity, A100, 3, 1, rules=rules, strategy=PlacementStrategy.PACK)
    assert sorted(where for where, _ in placed) == ["b", "c", "c"]  # fewest first, packed


def test_a_spread_it_does_not_select_keeps_it_off_crowded_domains() -> None:
    # the job (app=trainer) spreads over zones counting serving pods: zone x runs 3,
    # zone y 1, so with maxSkew 1 x is refused (3 + 0 - 1 > 1); it takes any number
    # of workers in y (they do not count), and a node without a zone is no domain
    job = _job("j", metadata={"labels": {"app": "trainer"}})
    job["spec"]["replicas"] = 2
    job["spec"]["template"]["spec"] |= _spread({"matchLabels": {"app": "serve"}}, key=ZONE)
    nodes = [_zoned("a", "x"), _zoned("b", "y"), node("c", A100, 8)]
    serving = [_pod(f"s{k}", "a", {"app": "serve"}) for k in range(3)]
    capacity = cluster_capacity(nodes, [*serving, _pod("s3", "b", {"app": "serve"})])
    rules = job_rules(job_spec(job))
    seen = admitting(capacity, A100, rules)
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 0), ("b", 8)]
    assert seen.refused == {
        f"no {ZONE} label for its workers' topology spread (maxSkew 1 on {ZONE})": 1
    }
    assert seen.shuns() == (
        f"its workers' topology spread (maxSkew 1 on {ZONE}) counts 3 pod(s) in its {ZONE} "
        "domain x, the fewest in a domain is 1"
    )
    decision = decide(job_spec(job), capacity, NOW)
    assert decision.gpu_type == A100


def test_a_spread_over_zones_it_selects_lets_each_zone_take_its_share() -> None:
    # zone x runs 2 trainers, zone y none, zone z 1: with maxSkew 2, x takes none,
    # y two, z one
    job = _spready()
    job["spec"]["template"]["spec"]["topologySpreadConstraints"][0] |= {
        "topologyKey": ZONE,
        "maxSkew": 2,
    }
    # (zone w's only node is full: w takes no worker, so the least stays 0)
    nodes = [_zoned("a", "x"), _zoned("b", "y"), _zoned("c", "z"), _zoned("d", "x")]
    nodes.append(_zoned("e", "w"))
    trainers = [_pod("t", "a", {"app": "trainer"}), _pod("u", "d", {"app": "trainer"})]
    pods = [*trainers, _pod("v", "c", {"app": "trainer"}), _busy("busy", "e")]
    capacity = cluster_capacity(nodes, pods)
    seen = admitting(capacity, A100, job_rules(job_spec(job)))
    assert [(n.name, n.free) for n in seen.nodes] == [
        ("a", 0),
        ("b", 2),
        ("c", 1),
        ("d", 0),
        ("e", 0),
    ]
    assert seen.shuns() == (
        f"its workers' topology spread (maxSkew 2 on {ZONE}) counts 2 pod(s) in its {ZONE} "
        "domain x, the fewest in a domain is 0"
    )


def _zoned(name: str, zone: str) -> dict[str, Any]:
    n = node(name, A100, 8)
    n["metadata"]["labels"][ZONE] = zone
    return n


def test_a_gang_it_selects_goes_one_worker_per_node() -> None:
    spec = job_spec(_spready(replicas=2))
    assert spec.placement.strategy is PlacementStrategy.SPREAD  # it was Pack
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8), node("c", A100, 8)], [])
    rules = job_rules(spec)
    _, placed = take(capacity, A100, 2, 1, rules=rules, strategy=PlacementStrategy.PACK)
    assert len({where for where, _ in placed}) == 2  # even when asked to pack
    # a job started in the pass counts for the next one's spread: its two workers go
    # to the two nodes that run none
    left, ((first, _),) = take(capacity, A100, 1, 1, rules=job_rules(job_spec(_spready("k"))))
    _, placed = take(left, A100, 2, 1, rules=rules, strategy=spec.placement.strategy)
    assert sorted(where for where, _ in placed) == sorted({"a", "b", "c"} - {first})


def _levels(placed: list[str], names: str) -> bool:
    """Whether binding the workers in this order keeps every node within 1 of the least."""
    counts = dict.fromkeys(names, 0)
    for where in placed:
        if counts[where] + 1 - min(counts.values()) > 1:
            return False
        counts[where] += 1
    return True


def test_a_gang_with_more_workers_than_nodes_is_placed_in_levels() -> None:
    # kube-scheduler binds the workers one after another, each counted for the next: with
    # maxSkew 1 per node, two nodes of 8 free GPUs take four workers, two each, so long
    # as they are bound fewest-first (before stop 63: "the cluster holds at most 2")
    job = _spready(replicas=4)
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    spec = job_spec(job)
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    decision = decide(spec, capacity, NOW)
    assert (decision.gpu_type, decision.workers) == (A100, 4)
    _, placed = take(capacity, A100, 4, 1, rules=job_rules(spec), strategy=spec.placement.strategy)
    order = [where for where, _ in placed]
    assert sorted(order) == ["a", "a", "b", "b"]
    assert _levels(order, "ab")
    # a node that holds one worker of 2 GPUs caps the level: the other takes two
    job["spec"]["gpu"] = {"count": 2}
    job["spec"]["minReplicas"] = 3
    job["spec"]["replicas"] = 3
    small = cluster_capacity([node("a", A100, 8), node("b", A100, 2)], [])
    spec = job_spec(job)
    assert decide(spec, small, NOW).workers == 3
    _, placed = take(small, A100, 3, 2, rules=job_rules(spec), strategy=spec.placement.strategy)
    order = [where for where, _ in placed]
    assert sorted(order) == ["a", "a", "b"]
    assert _levels(order, "ab")


def test_a_gang_larger_than_its_spread_lets_its_nodes_hold_says_why() -> None:
    # two nodes of 8 and 2 free GPUs, workers of 2: b holds one, so a holds two (maxSkew
    # 1 above b); four workers can never run here
    job = _spready(replicas=4)
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    job["spec"]["gpu"] = {"count": 2}
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 2)], [])
    decision = decide(job_spec(job), capacity, NOW)
    assert decision.gpu_type is None
    assert (
        "at most 3 worker(s) of 2 GPU(s) (Spread: a topology spread constraint (maxSkew 1 "
        "on kubernetes.io/hostname) matches its workers' own labels, so a node holds at "
        "most 1 more of them than the one that holds the fewest)"
    ) in decision.reason


def test_a_gang_whose_spread_counts_a_full_node_waits_at_one_worker_a_node() -> None:
    # c's GPUs are all in use: it takes no worker, so the level stays at 0 and a and b
    # take one each; three workers wait for c, and the reason names the constraint
    job = _spready(replicas=3)
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    busy = _pod("busy", "c", {"app": "other"})
    busy["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    nodes = [node("a", A100, 8), node("b", A100, 8), node("c", A100, 8)]
    capacity = cluster_capacity(nodes, [busy])
    spec = job_spec(job)
    assert [n.free for n in admitting(capacity, A100, job_rules(spec)).nodes] == [1, 1, 0]
    decision = decide(spec, capacity, NOW)
    assert decision.gpu_type is None
    assert "room for 2 of 3 worker(s) now" in decision.reason
    assert "topology spread (maxSkew 1 on kubernetes.io/hostname)" in decision.reason
    # with c free, all three start, one a node
    assert decide(spec, cluster_capacity(nodes, []), NOW).workers == 3


@pytest.mark.parametrize(
    ("policy", "free"),
    [
        # b (cordoned, no pod it counts) counts: the least count is 0, a is refused (b
        # takes one worker once uncordoned)
        ({}, [0, 1]),
        # nodeTaintsPolicy Honor: b (cordoned) is not counted, a's 1 is the least: a
        # takes one more
        ({"nodeTaintsPolicy": "Honor"}, [8, 8]),
        # minDomains 3 over one node: the least count is taken as 0
        ({"nodeTaintsPolicy": "Honor", "minDomains": 3}, [0, 1]),
    ],
)
def test_the_nodes_a_spread_counts_over_follow_its_policies(
    policy: dict[str, Any], free: list[int]
) -> None:
    cordoned = node("b", A100, 8)
    cordoned["spec"] = {"unschedulable": True}
    job = _spready()
    job["spec"]["template"]["spec"]["topologySpreadConstraints"][0] |= policy
    capacity = cluster_capacity(
        [node("a", A100, 8), cordoned], [_pod("t", "a", {"app": "trainer"})]
    )
    assert [n.free for n in admitting(capacity, A100, job_rules(job_spec(job))).nodes] == free


def test_a_spread_ignoring_node_affinity_counts_every_node() -> None:
    # the V100 node runs none of the pods it counts: with nodeAffinityPolicy Ignore the
    # least count is 0 there, and the A100 node running one is refused (without, the
    # least is a's 1, and it takes one more)
    nodes = [node("a", A100, 8), node("v", V100, 8)]
    pods = [_pod("t", "a", {"app": "trainer"})]
    job = _spready()
    capacity = cluster_capacity(nodes, pods)
    assert [n.free for n in admitting(capacity, A100, job_rules(job_spec(job))).nodes] == [8]
    job["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["nodeAffinityPolicy"] = "Ignore"
    assert [n.free for n in admitting(capacity, A100, job_rules(job_spec(job))).nodes] == [0]


@pytest.mark.parametrize("rule", ["spread", "anti-affinity"])
def test_a_gang_shares_out_a_zone_as_its_own_workers_count_there(rule: str) -> None:
    # the gang's workers spread one per zone (maxSkew 1, counting themselves), or keep
    # out of each other's zone (a required pod anti-affinity on the zone that selects
    # them): kube-scheduler binds them one after another, each counted for the next, so
    # each zone takes one. Zone x has two nodes, y one: a gang of two goes one into
    # each zone (before stop 61 both could be planned on x's two nodes, and the second
    # stayed Pending until the stuck rule moved the gang); a gang of three waits
    def gang(name: str, replicas: int) -> dict[str, Any]:
        job = _job(name, metadata={"labels": {"app": "trainer"}})
        job["spec"]["replicas"] = replicas
        job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
        pod = job["spec"]["template"]["spec"]
        if rule == "spread":
            pod |= _spread(TRAINERS, key=ZONE)
        else:
            term = {"labelSelector": TRAINERS, "topologyKey": ZONE}
            pod["affinity"] = {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
            }
        return job

    capacity = cluster_capacity([_zoned("a", "x"), _zoned("b", "y"), _zoned("d", "x")], [])
    spec = job_spec(gang("pair", 2))
    rules = job_rules(spec)
    seen = admitting(capacity, A100, rules)
    if rule == "spread":
        # bound one after another, fewest first, both zones rise to y's 8 and x takes
        # one more: 9 of its 16 GPUs, given out one a node in turn; a gang of three
        # starts (two in one zone, one in the other), one of 18 never runs
        assert [(n.name, n.free) for n in seen.nodes] == [("a", 5), ("b", 8), ("d", 4)]
        trio = job_spec(gang("trio", 3))
        assert decide(trio, capacity, NOW).workers == 3
        _, placed = take(capacity, A100, 3, 1, rules=job_rules(trio), strategy=PLACE)
        zones = ["x" if where in ("a", "d") else "y" for where, _ in placed]
        assert sorted(zones.count(z) for z in "xy") == [1, 2]
        assert zones[0] != zones[1]  # fewest first: the second goes to the other zone
        many = decide(job_spec(gang("many", 18)), capacity, NOW)
        assert many.gpu_type is None
        assert (
            f"at most 17 worker(s) of 1 GPU(s) (Pack: a topology spread constraint (maxSkew 1 "
            f"on {ZONE}) matches its workers' own labels, so a {ZONE} domain holds at most 1 "
            "more of them than the one that holds the fewest)"
        ) in many.reason
        # zone y full: the least stays 0, each zone takes one
        busy = cluster_capacity(
            [_zoned("a", "x"), _zoned("b", "y"), _zoned("d", "x")], [_busy("busy", "b")]
        )
        seen = admitting(busy, A100, rules)
        assert sorted((n.name, n.free) for n in seen.nodes) == [("a", 1), ("b", 0), ("d", 0)]
        assert decide(trio, busy, NOW).gpu_type is None
        return
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 1), ("b", 1), ("d", 0)]
    said = (
        f"its workers' topology spread (maxSkew 1 on {ZONE})"
        if rule == "spread"
        else f"its workers' pod anti-affinity on {ZONE}"
    )
    assert seen.shuns().startswith(said)
    assert f"its {ZONE} domain x" in seen.shuns()
    assert decide(spec, capacity, NOW).gpu_type == A100
    _, placed = take(capacity, A100, 2, 1, rules=rules, strategy=spec.placement.strategy)
    assert sorted(where for where, _ in placed) == ["a", "b"]
    decision = decide(job_spec(gang("trio", 3)), capacity, NOW)
    assert decision.gpu_type is None
    assert said in decision.reason
    assert "holds at most 2 worker(s)" in decision.reason or "room for 2 of 3" in decision.reason


@pytest.mark.parametrize("case", ["within one zone", "every node counts", "zones shared out"])
def test_a_gang_whose_spread_is_not_counted_in_levels_goes_one_worker_a_node(case: str) -> None:
    # where the level is not worked out (a required topology domain, a spread that counts
    # nodes of other types, a zone also shared out among its workers) the least count is
    # the bound: each node takes one worker, and a gang of more workers than nodes waits
    def gang(replicas: int) -> dict[str, Any]:
        job = _spready(f"g{replicas}", replicas=replicas)
        job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
        constraint = job["spec"]["template"]["spec"]["topologySpreadConstraints"]
        if case == "within one zone":
            job["spec"]["placement"] = {"topology": "Zone", "required": True}
        elif case == "every node counts":
            constraint[0]["nodeAffinityPolicy"] = "Ignore"
        else:
            constraint.append(_spread(TRAINERS, key=ZONE, skew=2)["topologySpreadConstraints"][0])
        return job

    nodes = [_zoned("a", "x"), _zoned("b", "x"), _zoned("c", "y")]
    if case == "every node counts":
        nodes.append(node("v", V100, 8))
    capacity = cluster_capacity(nodes, [])
    pair = job_spec(gang(2))
    assert pair.placement.strategy is (
        PlacementStrategy.STRICT_SPREAD if case == "within one zone" else PlacementStrategy.SPREAD
    )
    decision = decide(pair, capacity, NOW)
    assert decision.workers == 2
    rules = job_rules(pair)
    _, placed = take(capacity, A100, 2, 1, rules=rules, strategy=pair.placement.strategy)
    assert len({where for where, _ in placed}) == 2
    most = 2 if case == "within one zone" else 3
    assert decide(job_spec(gang(most + 1)), capacity, NOW).gpu_type is None


def test_a_joint_plan_of_a_gang_in_levels_is_kept_where_kube_scheduler_binds_it() -> None:
    # the joint (CP-SAT) plan does not model the spread: its placement is kept when
    # every node it fills ends within maxSkew of the least (its GPUs as planned), and
    # placed again fewest-first when not (four workers on one node of two)
    job = _spready(replicas=4)
    spec = job_spec(job)
    rules = job_rules(spec)
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    even = [("a", (6,)), ("b", (6,)), ("a", (7,)), ("b", (7,))]
    _, placed = take(capacity, A100, 4, 1, rules=rules, placements=even)
    assert placed == tuple(even)
    packed = [("a", (k,)) for k in range(4)]
    _, placed = take(capacity, A100, 4, 1, rules=rules, placements=packed)
    assert sorted(where for where, _ in placed) == ["a", "a", "b", "b"]


def test_a_gang_spread_per_node_and_per_zone_goes_one_a_node_across_zones() -> None:
    # the Kubernetes documentation's example: maxSkew 1 per zone and 1 per node. Four
    # nodes in two zones take four workers, one a node, alternating zones as they bind
    # (before stop 63 each zone took one: the gang waited for ever)
    job = _spready(replicas=4)
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    job["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        _spread(TRAINERS, key=ZONE)["topologySpreadConstraints"][0],
        _spread(TRAINERS)["topologySpreadConstraints"][0],
    ]
    spec = job_spec(job)
    nodes = [_zoned("a", "x"), _zoned("b", "x"), _zoned("c", "y"), _zoned("d", "y")]
    capacity = cluster_capacity(nodes, [])
    assert decide(spec, capacity, NOW).workers == 4
    _, placed = take(capacity, A100, 4, 1, rules=job_rules(spec), strategy=spec.placement.strategy)
    order = [where for where, _ in placed]
    assert sorted(order) == ["a", "b", "c", "d"]
    zones = ["x" if where in "ab" else "y" for where in order]
    assert zones[0] != zones[1]
    assert zones[2] != zones[3]
    # a fifth would need a node to take a second: not counted (it waits)
    job["spec"]["replicas"] = 5
    assert decide(job_spec(job), capacity, NOW).gpu_type is None


def test_a_gang_in_levels_per_node_is_placed_by_that_spread_not_a_flat_one() -> None:
    # per node in levels, and per zone counting every node (nodeAffinityPolicy: Ignore,
    # at the least count, maxSkew 10: it never binds here). The workers go fewest-first
    # per node: ordered by the zone's count instead (before the re-read of stop 63), a
    # second landed on a while b ran none, which kube-scheduler refuses
    job = _spready(replicas=6)
    zone = _spread(TRAINERS, key=ZONE, skew=10)["topologySpreadConstraints"][0]
    job["spec"]["template"]["spec"]["topologySpreadConstraints"].append(
        zone | {"nodeAffinityPolicy": "Ignore"}
    )
    spec = job_spec(job)
    capacity = cluster_capacity([_zoned("a", "x"), _zoned("b", "x"), _zoned("c", "y")], [])
    _, placed = take(capacity, A100, 6, 1, rules=job_rules(spec), strategy=PLACE)
    counts = dict.fromkeys("abc", 0)
    for where, _ in placed:
        assert counts[where] + 1 - min(counts.values()) <= 1, placed
        counts[where] += 1
    assert counts == dict.fromkeys("abc", 2)


def test_a_gang_too_large_for_one_of_two_spreads_is_told_it_can_never_run() -> None:
    # per zone and per node (maxSkew 1 each): zone y's one node holds one GPU, so zone x
    # holds at most 2 and the gang at most 3 of its 4 workers, with every GPU free. Each
    # spread alone bounds it, so the tighter says so (before: neither cut it, and it
    # waited for ever with "room for 3 of 4 worker(s) now")
    job = _spready(replicas=4)
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    job["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        _spread(TRAINERS)["topologySpreadConstraints"][0],
        _spread(TRAINERS, key=ZONE)["topologySpreadConstraints"][0],
    ]
    small = node("d", A100, 1)
    small["metadata"]["labels"][ZONE] = "y"
    nodes = [_zoned("a", "x"), _zoned("b", "x"), _zoned("c", "x"), small]
    decision = decide(job_spec(job), cluster_capacity(nodes, []), NOW)
    assert decision.gpu_type is None
    assert (
        f"at most 3 worker(s) of 1 GPU(s) (Spread: a topology spread constraint (maxSkew 1 "
        f"on {ZONE}) matches its workers' own labels, so a {ZONE} domain holds at most 1 "
        "more of them than the one that holds the fewest), the job needs 4"
    ) in decision.reason
    # three fit
    job["spec"]["replicas"] = 3
    assert decide(job_spec(job), cluster_capacity(nodes, []), NOW).workers == 3
