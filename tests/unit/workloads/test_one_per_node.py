"""Workers that may not share a node: host ports and self anti-affinity (`workloads.node_fit`).

A worker asking a host port fits a node only where no pod holds that port
(kube-scheduler's NodePorts filter), and two workers of one gang asking it, or
keeping off each other's nodes by a required pod anti-affinity (InterPodAffinity),
never share a node. Before, the plan knew none of this: the gang was planned where
kube-scheduler would not bind it and waited 45 s for the stuck rule to move it off
that node (`status.avoidNodes`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy
from chronotope.workloads.capacity import admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.joint import Contender, arbitrate, options_for
from chronotope.workloads.node_fit import HostPort, avoids_itself, host_ports, port_clash
from chronotope.workloads.podreq import PLANNED_NODE_ANNOTATION
from chronotope.workloads.training import decide
from tests.unit.controllers.test_reconcile import FakeOps
from tests.unit.workloads.test_backfill import node, tjob
from tests.unit.workloads.test_node_fit import (
    A100,
    NOW,
    V100,
    _planned_nodes,
    _rules,
    _status,
    _with_template,
)

PORT = {"containerPort": 7777, "hostPort": 7777}


def _container(*ports: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "w", "image": "registry.example/t:1", "ports": list(ports), **extra}


@pytest.mark.parametrize(
    ("spec", "ports"),
    [
        ({"containers": [_container({"containerPort": 80})]}, ()),
        ({"containers": [_container(PORT)]}, (HostPort(7777),)),
        # hostNetwork: the API server defaults every container port's hostPort to it
        (
            {"hostNetwork": True, "containers": [_container({"containerPort": 29500})]},
            (HostPort(29500),),
        ),
        (
            {"containers": [_container({"hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"})]},
            (HostPort(53, "UDP", "10.0.0.1"),),
        ),
        # init containers count only when they run all along (sidecars)
        ({"initContainers": [_container(PORT)], "containers": [_container()]}, ()),
        (
            {"initContainers": [_container(PORT, restartPolicy="Always")]},
            (HostPort(7777),),
        ),
        ({"containers": [_container({"hostPort": "x"}), "junk"]}, ()),
        (None, ()),
    ],
)
def test_host_ports_are_read_as_kube_scheduler_reads_them(
    spec: dict[str, Any] | None, ports: tuple[HostPort, ...]
) -> None:
    assert host_ports(spec) == ports


@pytest.mark.parametrize(
    ("wanted", "used", "clash"),
    [
        (HostPort(7777), HostPort(7777), True),
        (HostPort(7777), HostPort(7778), False),
        (HostPort(7777), HostPort(7777, "UDP"), False),
        # 0.0.0.0 binds every address: it clashes with any IP, either way round
        (HostPort(7777), HostPort(7777, "TCP", "10.0.0.1"), True),
        (HostPort(7777, "TCP", "10.0.0.1"), HostPort(7777), True),
        (HostPort(7777, "TCP", "10.0.0.1"), HostPort(7777, "TCP", "10.0.0.2"), False),
        (HostPort(7777, "TCP", "10.0.0.1"), HostPort(7777, "TCP", "10.0.0.1"), True),
    ],
)
def test_ports_clash_as_kube_schedulers_check_conflict_says(
    wanted: HostPort, used: HostPort, clash: bool
) -> None:
    assert (port_clash([wanted], [used]) is not None) is clash


def _holder(name: str, node_name: str, *, phase: str = "Running") -> dict[str, Any]:
    """A pod of another scheduler holding host port 7777 (and no GPU) on `node_name`."""
    return {
        "metadata": {"name": name, "namespace": "other", "labels": {}},
        "spec": {"nodeName": node_name, "containers": [_container(PORT)]},
        "status": {"phase": phase},
    }


def _ported(name: str, minutes: int, **spec: Any) -> dict[str, Any]:
    job = tjob(
        name,
        created=NOW - timedelta(hours=1, minutes=-minutes),
        types={A100: 2.0, V100: 1.0},
        phase="Waiting",
    )
    job["spec"] |= spec
    return _with_template(job, containers=[_container(PORT)])


def test_a_node_where_a_pod_holds_the_port_gives_the_workers_no_gpu_now() -> None:
    nodes = [node("a", A100, 8), node("b", A100, 8)]
    pods = [_holder("holder", "a"), _holder("done", "b", phase="Succeeded")]
    capacity = cluster_capacity(nodes, pods)
    assert [sorted(n.host_ports) for n in capacity] == [[HostPort(7777)], []]
    seen = admitting(capacity, A100, _rules(containers=[_container(PORT)]))
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 0), ("b", 8)]
    assert (seen.blocked, seen.short, seen.refused) == (1, 0, {})
    # a worker asking another port, or none, takes node a's GPUs as before
    other = _rules(containers=[_container({"hostPort": 7778})])
    assert [n.free for n in admitting(capacity, A100, other).nodes] == [8, 8]
    assert [n.free for n in admitting(capacity, A100, _rules()).nodes] == [8, 8]


def test_a_gang_asking_a_host_port_is_spread_and_its_ports_are_held_where_it_goes() -> None:
    spec = job_spec(_ported("j", 0, replicas=2))
    assert spec.placement.strategy is PlacementStrategy.STRICT_SPREAD
    assert job_spec(_ported("j", 0, replicas=2), as_written=True).placement.strategy is (
        PlacementStrategy.PACK
    )
    strict = _ported("j", 0, replicas=2, placement={"strategy": "StrictPack"})
    assert job_spec(strict).placement.strategy is PlacementStrategy.STRICT_PACK
    rules = _rules(containers=[_container(PORT)])
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8), node("c", A100, 8)], [])
    left, placements = take(capacity, A100, 2, 1, strategy=spec.placement.strategy, rules=rules)
    assert sorted(p[0] for p in placements) == ["b", "c"]  # one worker a node
    # the next job asking that port finds only the node the gang left
    _, more = take(left, A100, 1, 1, rules=rules)
    assert more == (("a", (0,)),)
    # before: the pack strategy put both workers on one node (one never binds)
    _, packed = take(capacity, A100, 2, 1, rules=_rules())
    assert packed[0][0] == packed[1][0]


def test_a_job_asking_a_held_port_starts_on_the_nodes_that_give_it() -> None:
    # the fast A100 node's port 7777 is held: the job starts on the V100 at once; before,
    # it was planned on the A100, and waited there 45 s for the stuck rule
    nodes = [node("a100", A100, 8), node("v100", V100, 8)]
    first, second = _ported("first", 0), _ported("second", 1)
    ops = FakeOps(nodes, [first, second])
    ops._pods = [_holder("holder", "a100")]
    _status(ops, first)
    assert _planned_nodes(ops) == {"first": "v100"}
    # the first job's worker, planned but not yet bound, holds the port on the V100
    status = _status(ops, second)
    assert "second" not in _planned_nodes(ops)
    assert status["phase"] == "Waiting", status
    assert (
        "1 node(s) have free GPUs but a pod there holds a host port its workers ask: 7777/TCP"
        in status["whyWaiting"]
    ), status["whyWaiting"]


def test_a_two_worker_gang_asking_a_port_waits_for_two_nodes_and_says_why() -> None:
    # one A100 node with 8 free GPUs holds one worker of the gang only
    job = _ported("pair", 0, replicas=2, gpuTypes=[{"name": A100, "relativeSpeed": 1.0}])
    decision = decide(job_spec(job), cluster_capacity([node("a", A100, 8)], []), NOW)
    assert decision.gpu_type is None
    assert (
        "holds at most 1 worker(s) of 1 GPU(s) (StrictSpread: its workers ask host port(s) "
        "7777/TCP), the job needs 2"
    ) in decision.reason, decision.reason


def test_the_joint_plan_leaves_out_the_nodes_where_the_port_is_held() -> None:
    # packing alone would put j on node a, the fullest that holds it
    nodes = [node("a", A100, 2), node("b", A100, 4)]
    capacity = cluster_capacity(nodes, [_holder("holder", "a")])
    job = _ported("j", 0, gpuTypes=[{"name": A100, "relativeSpeed": 1.0}])
    spec = job_spec(job)
    decision = decide(spec, capacity, NOW)
    assert decision.gpu_type == A100, decision.reason
    contender = Contender("scale/j", spec, options_for([decision]))
    other = _ported("k", 1, gpuTypes=[{"name": A100, "relativeSpeed": 1.0}])
    other["spec"]["template"]["spec"]["containers"] = [_container()]
    rival = Contender(
        "scale/k", job_spec(other), options_for([decide(job_spec(other), capacity, NOW)])
    )
    joint = arbitrate("scale/j", [contender, rival], capacity, NOW)
    assert joint.starts, joint.reason
    assert [p[0] for p in joint.placements] == ["b"], joint


def _anti(
    selector: dict[str, Any] | None, key: str = "kubernetes.io/hostname", **extra: Any
) -> dict[str, Any]:
    term: dict[str, Any] = {"topologyKey": key, **extra}
    if selector is not None:
        term["labelSelector"] = selector
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


MINE = {"app": "trainer", "chronotope.dev/job": "j"}


@pytest.mark.parametrize(
    ("affinity", "spreads"),
    [
        (_anti({"matchLabels": {"app": "trainer"}}), True),
        (_anti({"matchLabels": {"chronotope.dev/job": "j"}}), True),
        (
            _anti({"matchExpressions": [{"key": "app", "operator": "In", "values": ["trainer"]}]}),
            True,
        ),
        (_anti({"matchExpressions": [{"key": "app", "operator": "Exists"}]}), True),
        (_anti({}), True),  # an empty selector matches every pod, its own workers too
        (_anti(None), False),  # no selector matches no pod
        (_anti({"matchLabels": {"app": "other"}}), False),  # other pods: not modelled
        (
            _anti(
                {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["trainer"]}]}
            ),
            False,
        ),
        (_anti({"matchLabels": {"app": "trainer"}}, "topology.kubernetes.io/zone"), False),
        (_anti({"matchLabels": {"app": "trainer"}}, namespaces=["elsewhere"]), False),
        ({"podAffinity": _anti({})["podAntiAffinity"]}, False),  # affinity, not anti
        ({"podAntiAffinity": "junk"}, False),
    ],
)
def test_workers_that_keep_off_each_others_nodes_are_found(
    affinity: dict[str, Any], spreads: bool
) -> None:
    assert avoids_itself({"affinity": affinity}, MINE) is spreads


def test_a_gang_whose_workers_keep_off_each_others_nodes_is_spread() -> None:
    job = tjob("j", created=NOW, types={A100: 1.0}, phase="Waiting")
    job["spec"] |= {"replicas": 2}
    job["spec"]["template"]["metadata"] = {"labels": {"app": "trainer"}}
    job["spec"]["template"]["spec"]["affinity"] = _anti({"matchLabels": {"app": "trainer"}})
    assert job_spec(job).placement.strategy is PlacementStrategy.STRICT_SPREAD
    # one A100 node with 8 free GPUs holds one worker of it only
    decision = decide(job_spec(job), cluster_capacity([node("a", A100, 8)], []), NOW)
    assert decision.gpu_type is None
    assert (
        "holds at most 1 worker(s) of 1 GPU(s) (StrictSpread: a required pod anti-affinity "
        "on kubernetes.io/hostname matches its workers' own labels), the job needs 2"
    ) in decision.reason, decision.reason
    # on two nodes it starts, one worker on each (the pass's placements)
    ops = FakeOps([node("a", A100, 8), node("b", A100, 8)], [job])
    ops._pods = []
    _status(ops, job)
    assert sorted(p["metadata"]["annotations"][PLANNED_NODE_ANNOTATION] for p in ops.started) == [
        "a",
        "b",
    ]


def test_a_joint_plans_placement_on_a_node_where_the_port_is_now_held_is_made_again() -> None:
    # the joint plan put two jobs asking port 7777 on node a (it sees no ports of the
    # jobs it starts together): the second start goes where the port is free
    rules = _rules(containers=[_container(PORT)])
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    left, first = take(capacity, A100, 1, 1, placements=[("a", (0,))], rules=rules)
    assert first == (("a", (0,)),)
    _, second = take(left, A100, 1, 1, placements=[("a", (1,))], rules=rules)
    assert second == (("b", (0,)),)
    # without ports the plan's placement is kept
    _, kept = take(left, A100, 1, 1, placements=[("a", (1,))], rules=_rules())
    assert kept == (("a", (1,)),)
