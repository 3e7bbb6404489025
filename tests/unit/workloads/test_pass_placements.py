"""The gangs a scheduling pass starts go where the pass counted them.

The pass used to count a start's GPUs by best fit while the extender reserved
the gang's slots by its own rule (most free GPUs first): a gang could land on
the node the pass had counted for the next job, which then waited 45 s for
the stuck detector (issue 18's scale run; issue 12, "plans reach pods"). Now
the pass places every gang with the extender's rule (`solver.slots`), writes
the nodes and GPUs on the gang's pods, and the extender honours them.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from chronotope.controllers.trainingjob import reconcile
from chronotope.extender.service import ExtenderService
from chronotope.sharing.assignment import BindRequest
from chronotope.workloads.capacity import NodeCapacity, cluster_capacity, of_type, take
from chronotope.workloads.podreq import PLANNED_GANG_ANNOTATION, PLANNED_NODE_ANNOTATION
from tests.unit.controllers.test_reconcile import FakeOps
from tests.unit.workloads.test_backfill import busy_pod, node, tjob

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
A100 = {"A100-SXM4-80GB": 1.0}


def _cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Three 8-GPU nodes with 2, 4 and 8 GPUs free."""
    nodes = [node(f"n{i}", "A100-SXM4-80GB", 8) for i in range(3)]
    busy = [busy_pod("busy-0", "n0", 6), busy_pod("busy-1", "n1", 4)]
    return nodes, busy


def _jobs() -> list[dict[str, Any]]:
    gang = tjob("gang", created=NOW - timedelta(hours=2), gpus=2, types=A100, phase="Waiting")
    gang["spec"]["replicas"] = 2
    big = tjob("big", created=NOW - timedelta(hours=1), gpus=8, types=A100, phase="Waiting")
    return [gang, big]


def _extender(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> ExtenderService:
    svc = ExtenderService(bind_fn=lambda _r: None, fetch_pod=lambda _n, _p: {})
    svc.sync_nodes(nodes)
    for p in pods:
        svc.on_pod("ADDED", p)
    return svc


def test_every_started_gang_passes_the_extender_on_the_node_the_pass_counted() -> None:
    nodes, busy = _cluster()
    jobs = _jobs()
    ops = FakeOps(nodes, jobs)
    ops._pods = list(busy)
    for job in jobs:  # one reconcile each, oldest first: both start in this round
        reconcile(job, ops, NOW)
    names = [p["metadata"]["name"] for p in ops.started]
    assert names == ["gang-g0-0", "gang-g0-1", "big-g0-0"]
    planned = {
        p["metadata"]["name"]: p["metadata"]["annotations"][PLANNED_NODE_ANNOTATION]
        for p in ops.started
    }
    # the gang best-fits the node that holds it whole (n1: 4 free); big gets the empty n2
    assert planned == {"gang-g0-0": "n1", "gang-g0-1": "n1", "big-g0-0": "n2"}
    gang_plans = {p["metadata"]["annotations"].get(PLANNED_GANG_ANNOTATION) for p in ops.started}
    assert gang_plans == {"n1=4,5;n1=6,7", None}  # the whole gang's plan on each member

    bound: list[BindRequest] = []
    svc = _extender(nodes, busy)
    svc.bind_fn = bound.append
    all_nodes = [n["metadata"]["name"] for n in nodes]
    for p in ops.started:  # kube-scheduler's order: the gang's pods first
        out = svc.filter(p, all_nodes)
        assert out.passed == [planned[p["metadata"]["name"]]], out.failed
        assert svc.bind("scale", p["metadata"]["name"], "uid", out.passed[0]) == ""
    assert [b.node for b in bound] == ["n1", "n1", "n2"]


def test_the_capacity_counts_a_planned_worker_on_its_planned_gpus() -> None:
    nodes, busy = _cluster()
    ops = FakeOps(nodes, _jobs())
    ops._pods = list(busy)
    reconcile(ops.training_jobs()[0], ops, NOW)  # the gang starts; its pods are not bound
    cap = {c.name: c for c in cluster_capacity(nodes, ops.pods())}
    assert (cap["n1"].free, cap["n2"].free) == (0, 8)  # on n1, not "largest free first"
    assert cap["n2"].free_gpus == tuple(range(8))


def test_a_worker_that_fits_nowhere_leaves_the_gang_unplaced_and_counted() -> None:
    capacity = [NodeCapacity("a", "L4", 4, 3, True, free_gpus=(1, 2, 3))]
    left, placements = take(capacity, "L4", 2, 2)
    assert placements == ()  # the second worker fits nowhere: no plan on the pods
    assert left[0].free == 0


def test_a_joint_plans_placements_are_kept() -> None:
    capacity = [NodeCapacity("a", "L4", 4, 4, True, free_gpus=(0, 1, 2, 3))]
    left, placements = take(capacity, "L4", 1, 2, placements=[("a", (2, 3))])
    assert placements == (("a", (2, 3)),)
    assert left[0].free_gpus == (0, 1)


def test_a_plans_placements_on_gpus_taken_since_are_placed_again() -> None:
    # a plan placed its starts on the capacity its own starts left; the pass may give
    # those GPUs to a job before this one (found in process at scale: five gangs on one
    # 8-GPU node). The workers go where the gang rule puts them on what is left
    capacity = [
        NodeCapacity("a", "L4", 4, 2, True, free_gpus=(2, 3)),
        NodeCapacity("b", "L4", 4, 4, True, free_gpus=(0, 1, 2, 3)),
    ]
    left, placements = take(capacity, "L4", 1, 2, placements=[("a", (0, 1))])
    assert placements == (("a", (2, 3)),)  # not GPUs 0 and 1 of a, which are taken
    assert [(n.name, n.free) for n in left] == [("a", 0), ("b", 4)]
    # more GPUs asked on a node than it has free: placed again too
    left, placements = take(capacity, "L4", 2, 2, placements=[("a", (2, 3)), ("a", (2, 3))])
    assert placements == (("b", (0, 1)), ("b", (2, 3)))  # the gang rule packs them
    assert [(n.name, n.free) for n in left] == [("a", 2), ("b", 0)]


def test_the_nodes_of_a_type_follow_each_take() -> None:
    # the pass asks for one type's nodes of every capacity it builds; the index it keeps
    # per capacity must show what each take left, and a hand-built list is read afresh
    capacity = (
        NodeCapacity("a", "L4", 4, 4, True, free_gpus=(0, 1, 2, 3)),
        NodeCapacity("h", "H100", 8, 8, True, free_gpus=tuple(range(8))),
        NodeCapacity("b", "L4", 2, 2, True, free_gpus=(0, 1)),
    )
    assert [n.name for n in of_type(capacity, "L4")] == ["a", "b"]
    left, placements = take(capacity, "L4", 1, 2)
    assert placements == (("b", (0, 1)),)  # the least free node that fits
    assert [(n.name, n.free) for n in of_type(left, "L4")] == [("a", 4), ("b", 0)]
    assert of_type(left, "H100") == (capacity[1],)
    again, _ = take(left, "L4", 1, 4)
    assert [(n.name, n.free) for n in of_type(again, "L4")] == [("a", 0), ("b", 0)]
    assert [(n.name, n.free) for n in of_type(left, "L4")] == [("a", 4), ("b", 0)]
    listed = list(left)
    listed[0] = NodeCapacity("a", "L4", 4, 1, True, free_gpus=(3,))
    assert [(n.name, n.free) for n in of_type(listed, "L4")] == [("a", 1), ("b", 0)]
