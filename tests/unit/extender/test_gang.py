"""Gangs are all-or-nothing: GPUs for every member are reserved before any member binds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chronotope.sharing.labels import (
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    SCHEDULER_NAME,
    STRATEGY_ANNOTATION,
    TOPOLOGY_ANNOTATION,
    ZONE_LABEL,
)
from chronotope.workloads.podreq import (
    PLANNED_GANG_ANNOTATION,
    PLANNED_GPUS_ANNOTATION,
    PLANNED_NODE_ANNOTATION,
    gang_plan_annotation,
)
from tests.unit.extender.test_service import Recorder, bound, node, pod, service


def member(
    i: int, size: int, gpus: int, strategy: str = "Pack", gang: str = "job"
) -> dict[str, Any]:
    p = pod(f"{gang}-{i}", gpus=gpus)
    p["metadata"]["labels"] = {GANG_LABEL: gang}
    p["metadata"]["annotations"] |= {GANG_SIZE_ANNOTATION: str(size), STRATEGY_ANNOTATION: strategy}
    return p


NODES = ["a", "t", "v"]  # a: 8 x A100, t: 1 x T4, v: 4 x V100


def test_gang_that_cannot_fit_reserves_nothing_and_says_why() -> None:
    svc = service(Recorder())
    out = svc.filter(member(0, 4, 4), NODES)  # 4 x 4 GPUs > 13 GPUs in total
    assert out.passed == []
    assert "needs 4 member(s) with 4 whole GPUs each; only 3 can be placed now" in out.failed["a"]
    assert svc.filter(pod("other", gpus=8), NODES).passed == ["a"]  # nothing left held


def test_members_bind_only_into_the_reservation() -> None:
    rec = Recorder()
    svc = service(rec)
    first = svc.filter(member(0, 3, 4), NODES)
    assert set(first.passed) <= {"a", "v"}
    # the whole gang is held: a plain pod can no longer take 8 GPUs on a
    assert svc.filter(pod("other", gpus=8), ["a"]).passed == []
    for i in range(3):
        out = svc.filter(member(i, 3, 4), NODES)
        assert out.passed, f"member {i} has no reserved node"
        assert svc.bind("ns", f"job-{i}", "u", out.passed[0]) == ""
    assert sorted(n for n, _ in rec.bound.values()) == ["a", "a", "v"]
    assert svc.gangs.reservations == {}


def test_strict_spread_puts_members_on_distinct_nodes() -> None:
    svc = service(Recorder())
    svc.filter(member(0, 3, 1, "StrictSpread"), NODES)
    reservation = svc.gangs.reservations["ns/job"]
    assert sorted(reservation.slots) == ["a", "t", "v"]
    assert (
        "only 2 can be placed"  # the T4 is held by the first gang
        in svc.filter(member(0, 4, 1, "StrictSpread", "big"), NODES).failed["a"]
    )


def test_strict_pack_keeps_the_gang_on_one_node() -> None:
    svc = service(Recorder())
    svc.filter(member(0, 4, 2, "StrictPack"), NODES)
    assert svc.gangs.reservations["ns/job"].slots == ["a"] * 4


def test_bad_gang_annotations_are_named() -> None:
    bad = member(0, 2, 1)
    bad["metadata"]["annotations"][STRATEGY_ANNOTATION] = "Sideways"
    out = service(Recorder()).filter(bad, NODES)
    assert STRATEGY_ANNOTATION in out.unresolvable["a"]


def test_unclaimed_reservation_expires() -> None:
    now = [0.0]
    svc = service(Recorder())
    svc.clock = lambda: now[0]
    svc.filter(member(0, 2, 8), ["a", "v"])  # 2 x 8 cannot fit: nothing held
    svc.filter(member(0, 1, 8), ["a"])
    assert svc.filter(pod("other", gpus=1), ["a"]).passed == []
    now[0] += svc.gangs.ttl_s + 1
    svc.filter(member(0, 1, 8, gang="x"), ["v"])  # any gang filter expires stale reservations
    assert svc.filter(pod("other", gpus=1), ["a"]).passed == ["a"]


def planned_member(i: int, plan: Sequence[tuple[str, Sequence[int]]], gpus: int) -> dict[str, Any]:
    """Member `i` of a gang the operator's pass placed: its own and the whole gang's plan."""
    p = member(i, len(plan), gpus)
    node, indices = plan[i]
    p["metadata"]["annotations"] |= {
        PLANNED_NODE_ANNOTATION: node,
        PLANNED_GPUS_ANNOTATION: ",".join(map(str, indices)),
        PLANNED_GANG_ANNOTATION: gang_plan_annotation(plan),
    }
    p["spec"]["schedulerName"] = SCHEDULER_NAME
    return p


def test_a_planned_gang_is_reserved_on_its_planned_gpus_and_binds_there() -> None:
    rec = Recorder()
    svc = service(rec)
    plan = [("a", (4, 5)), ("v", (0, 1)), ("a", (6, 7))]
    for i in (2, 0, 1):  # kube-scheduler's order need not be rank order
        out = svc.filter(planned_member(i, plan, 2), NODES)
        assert out.passed == [plan[i][0]]
        assert svc.bind("ns", f"job-{i}", "u", out.passed[0]) == ""
    for i, (node_name, gpus) in enumerate(plan):
        where, assignment = rec.bound[f"ns/job-{i}"]
        assert assignment is not None
        assert (where, assignment.gpu_indices) == (node_name, gpus)
    assert svc.gangs.reservations == {}


def test_a_gang_whose_plan_no_longer_fits_is_placed_whole_by_the_rule_or_not_at_all() -> None:
    """Member 0's planned GPUs are free, member 1's are taken: no member binds alone.

    Before, each member went to its own planned GPUs on its own: member 0 bound,
    member 1 waited for GPUs that were gone, and the gang stayed half bound.
    """
    rec = Recorder()
    events: list[tuple[str, str, str]] = []
    svc = service(rec)
    svc.event_fn = lambda *e: events.append(e)
    assert svc.filter(pod("thief", gpus=4, model="V100"), ["v"]).passed == ["v"]
    plan = [("a", (0, 1)), ("v", (0, 1))]
    out = svc.filter(planned_member(0, plan, 2), NODES)
    assert out.passed == ["a"]  # the gang rule found both members room on a
    assert svc.gangs.reservations["ns/job"].slots == ["a", "a"]
    assert [e[1] for e in events] == ["PlanFallback"]
    assert "planned node v no longer fits" in events[0][2]
    for i in (0, 1):
        out = svc.filter(planned_member(i, plan, 2), NODES)
        assert out.passed == ["a"]
        assert svc.bind("ns", f"job-{i}", "u", "a") == ""
    assert sorted(n for n, _ in rec.bound.values() if n == "a") == ["a", "a"]


def test_a_planned_gang_that_fits_nowhere_holds_nothing() -> None:
    svc = service(Recorder())
    plan = [("a", (0, 1, 2, 3, 4, 5)), ("a", (6, 7, 0, 1, 2, 3))]  # overlaps itself
    out = svc.filter(planned_member(0, plan, 6), NODES)
    assert out.passed == []
    assert "only 1 can be placed now" in out.failed["a"]
    assert svc.filter(pod("other", gpus=8), ["a"]).passed == ["a"]  # nothing left held


def test_a_bad_gang_plan_is_named() -> None:
    p = planned_member(0, [("a", (0,)), ("v", (0,))], 1)
    p["metadata"]["annotations"][PLANNED_GANG_ANNOTATION] = "a=0;v=x"
    out = service(Recorder()).filter(p, NODES)
    assert PLANNED_GANG_ANNOTATION in out.unresolvable["a"]


def test_a_restarted_extender_reserves_the_rest_of_a_partly_bound_gang_on_its_plan() -> None:
    """The extender died between two members' binds: the second still goes where planned.

    Before, the restarted extender saw a bound member, refused the plan, and placed
    the rest by the gang rule (here beside member 0 on a), off the operator's plan;
    with the slot's GPUs taken, the gang stayed half bound.
    """
    rec = Recorder()
    svc = service(rec)
    plan = [("a", (0, 1)), ("v", (2, 3))]
    assert svc.filter(planned_member(0, plan, 2), NODES).passed == ["a"]
    assert svc.bind("ns", "job-0", "u", "a") == ""
    first = planned_member(0, plan, 2)
    assignment = rec.bound["ns/job-0"][1]
    assert assignment is not None
    first["spec"]["nodeName"] = "a"
    first["metadata"]["annotations"] |= assignment.to_annotations()
    events: list[tuple[str, str, str]] = []
    fresh = service(Recorder())  # restarted: the reservation of job-1's slot is gone
    fresh.event_fn = lambda *e: events.append(e)
    fresh.sync_pods([first])
    out = fresh.filter(planned_member(1, plan, 2), NODES)
    assert out.passed == ["v"]
    assert events == []
    # the slot is held: a plain pod cannot take member 1's planned GPUs meanwhile
    assert fresh.filter(pod("thief", gpus=4, model="V100"), ["v"]).passed == []
    assert fresh.bind("ns", "job-1", "u", "v") == ""
    assert fresh.gangs.reservations == {}


def test_a_partly_bound_gang_off_its_plan_falls_back_to_the_rule() -> None:
    rec = Recorder()
    plan = [("v", (0, 1)), ("a", (2, 3))]
    fresh = service(rec)
    elsewhere = planned_member(0, plan, 2)
    elsewhere["spec"]["nodeName"] = "a"  # not v: on a's first free GPUs, 0 and 1
    fresh.sync_pods([elsewhere])
    events: list[tuple[str, str, str]] = []
    fresh.event_fn = lambda *e: events.append(e)
    out = fresh.filter(planned_member(1, plan, 2), NODES)
    assert out.passed  # placed by the rule, whole
    assert [e[1] for e in events] == ["PlanFallback"]
    assert "not where the plan put them" in events[0][2]


def test_a_gang_whose_members_are_all_deleted_releases_its_reservation_at_once() -> None:
    svc = service(Recorder())
    svc.filter(member(0, 2, 4), ["a"])  # reserves 2 x 4 GPUs on a
    svc.filter(member(1, 2, 4), ["a"])
    assert svc.filter(pod("other", gpus=8), ["a"]).passed == []
    svc.on_pod("DELETED", member(0, 2, 4))
    # one member is still known: the rest of the reservation stays
    assert svc.filter(pod("other", gpus=8), ["a"]).passed == []
    svc.on_pod("DELETED", member(1, 2, 4))  # the re-planned gang's last pod: nothing left held
    assert svc.gangs.reservations == {}
    assert svc.filter(pod("other", gpus=8), ["a"]).passed == ["a"]


def planned_pod(name: str, node_name: str, gpus: tuple[int, ...], model: str) -> dict[str, Any]:
    """A one-worker pod the operator's pass placed (watched before kube-scheduler filters it)."""
    p = pod(name, gpus=len(gpus), model=model)
    p["metadata"]["annotations"] |= {
        PLANNED_NODE_ANNOTATION: node_name,
        PLANNED_GPUS_ANNOTATION: ",".join(map(str, gpus)),
    }
    p["spec"]["schedulerName"] = SCHEDULER_NAME
    return p


def test_a_gang_placed_by_the_rule_leaves_the_gpus_planned_for_pods_not_yet_filtered() -> None:
    """The stolen-plan cascade: a gang off its plan took GPUs planned for another gang.

    Before, the extender's cache held only what it had filtered, so the gang rule put
    this gang on a's GPUs, planned for `next`, whose own filter then found them
    taken. The operator counts a planned pod's GPUs from its creation; now so does
    the extender.
    """
    events: list[tuple[str, str, str]] = []
    svc = service(Recorder())
    svc.event_fn = lambda *e: events.append(e)
    nxt = planned_pod("next", "a", (0, 1, 2, 3, 4, 5), "A100")
    svc.on_pod("ADDED", nxt)  # created by the pass; kube-scheduler has not filtered it yet
    plan = [("v", (0, 1)), ("v", (2, 3))]
    # kube-scheduler rules v out (a node flapping NotReady): the gang rule places the gang
    out = svc.filter(planned_member(0, plan, 2), ["a"])
    assert out.passed == []  # a has 2 GPUs free, the gang needs 4
    assert "only 1 can be placed now" in out.failed["a"]
    assert [e[1] for e in events] == ["PlanFallback"]
    assert svc.filter(nxt, ["a", "v"]).passed == ["a"]  # its plan still fits
    assert svc.bind("ns", "next", "u", "a") == ""


def test_a_plan_holds_until_its_pod_is_filtered_bound_or_deleted() -> None:
    svc = service(Recorder())
    held = planned_pod("held", "a", (0, 1, 2, 3), "A100")
    svc.on_pod("ADDED", held)
    svc.on_pod("MODIFIED", held)  # kube-scheduler's status writes: still one hold
    assert svc.filter(pod("plain", gpus=5, model="A100"), ["a"]).passed == []
    svc.on_pod("DELETED", held)
    assert svc.filter(pod("plain", gpus=5, model="A100"), ["a"]).passed == ["a"]
    svc.on_pod("DELETED", pod("plain", gpus=5, model="A100"))
    svc.on_pod("ADDED", held)
    svc.sync_pods([held])  # a re-list holds it afresh, once
    assert svc.filter(pod("plain", gpus=5, model="A100"), ["a"]).passed == []
    svc.on_pod("DELETED", pod("plain", gpus=5, model="A100"))
    assert svc.filter(held, ["a"]).passed == ["a"]  # its own filter takes the plan's GPUs
    assert svc.bind("ns", "held", "u", "a") == ""
    svc.on_pod("MODIFIED", bound(held, "a", None))
    assert svc.filter(pod("plain", gpus=4, model="A100"), ["a"]).passed == ["a"]


def test_a_planned_gangs_members_waiting_their_filter_do_not_block_its_reservation() -> None:
    rec = Recorder()
    svc = service(rec)
    plan = [("a", (0, 1, 2, 3)), ("a", (4, 5, 6, 7))]
    members = [planned_member(i, plan, 4) for i in (0, 1)]
    for m in members:
        svc.on_pod("ADDED", m)
    assert svc.filter(pod("plain", gpus=1, model="A100"), ["a"]).passed == []
    svc.on_pod("DELETED", pod("plain", gpus=1, model="A100"))
    for i in (1, 0):
        out = svc.filter(members[i], NODES)
        assert out.passed == ["a"]
        assert svc.bind("ns", f"job-{i}", "u", "a") == ""
    assert [rec.bound[f"ns/job-{i}"][1].gpu_indices for i in (0, 1)] == [g for _, g in plan]  # type: ignore[union-attr]


def test_a_plan_holds_nothing_on_a_pod_of_another_scheduler_or_one_being_deleted() -> None:
    """Neither ever reaches the extender's filter, which is what would end the hold."""
    svc = service(Recorder())
    other = planned_pod("other-scheduler", "a", (0, 1, 2, 3, 4, 5, 6, 7), "A100")
    other["spec"]["schedulerName"] = "default-scheduler"
    svc.on_pod("ADDED", other)
    going = planned_pod("going", "v", (0, 1, 2, 3), "V100")
    svc.on_pod("ADDED", going)
    assert svc.filter(pod("plain", gpus=1, model="V100"), ["v"]).passed == []
    svc.on_pod("DELETED", pod("plain", gpus=1, model="V100"))
    going["metadata"]["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    svc.on_pod("MODIFIED", going)
    assert svc.filter(pod("plain", gpus=1, model="V100"), ["v"]).passed == ["v"]
    assert svc.filter(pod("big", gpus=8, model="A100"), ["a"]).passed == ["a"]


def test_a_gang_that_requires_one_zone_is_reserved_inside_one() -> None:
    # two 4-GPU nodes in zone x, one 8-GPU node in zone y: a StrictSpread gang of two
    # members of 4 takes y0 (most free) and an x node; within one zone, x's two nodes
    zones = {"x0": "x", "x1": "x", "y0": "y"}
    svc = service(Recorder())
    nodes = [node("x0", "A100", 4), node("x1", "A100", 4), node("y0", "A100", 8)]
    for n in nodes:
        n["metadata"]["labels"][ZONE_LABEL] = zones[n["metadata"]["name"]]
    svc.sync_nodes(nodes)

    def gang(name: str, size: int, topology: str | None) -> list[dict[str, Any]]:
        pods = [member(i, size, 4, "StrictSpread", gang=name) for i in range(size)]
        for p in pods:
            if topology:
                p["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = topology
        return pods

    free = svc.filter(gang("free", 2, None)[0], list(zones)).passed
    assert "y0" in free  # without the annotation: across zones
    assert len(free) == 2
    svc = service(Recorder())
    svc.sync_nodes(nodes)
    first = svc.filter(gang("zoned", 2, "Zone")[0], list(zones))
    assert sorted(first.passed) == ["x0", "x1"]
    # three members of 4: no zone holds them; it says so, and holds nothing
    out = svc.filter(gang("big", 3, "Zone")[0], ["y0"])
    assert "within one Zone; no Zone holds them now" in out.failed["y0"]
    bad = gang("odd", 2, "Galaxy")[0]
    said = svc.filter(bad, list(zones)).unresolvable["x0"]
    assert "placement-topology]: 'Galaxy' is not one of Any, Node" in said


def test_a_restarted_extender_keeps_the_rest_of_a_zoned_gang_in_its_bound_members_zone() -> None:
    """The extender died after one member of a one-zone gang bound: the rest join its zone.

    Before, the restarted extender chose the zone afresh (the fullest that holds the
    missing members, here y) and the gang ended across two zones.
    """
    zones = {"x0": "x", "x1": "x", "y0": "y", "y1": "y"}
    gpus = {"x0": 4, "x1": 8, "y0": 4, "y1": 4}
    nodes = [node(n, "A100", gpus[n]) for n in zones]
    for n in nodes:
        n["metadata"]["labels"][ZONE_LABEL] = zones[n["metadata"]["name"]]

    def gang(size: int) -> list[dict[str, Any]]:
        pods = [member(i, size, 4, "StrictSpread", gang="zoned") for i in range(size)]
        for p in pods:
            p["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = "Zone"
        return pods

    fresh = service(Recorder())
    fresh.sync_nodes(nodes)
    assert sorted(fresh.filter(gang(2)[0], list(zones)).passed) == ["y0", "y1"]  # fewest free
    fresh = service(Recorder())
    fresh.sync_nodes(nodes)
    first = gang(2)[0]
    first["spec"]["nodeName"] = "x1"  # bound before the restart
    fresh.sync_pods([first])
    assert fresh.filter(gang(2)[1], list(zones)).passed == ["x0"]
    assert fresh.bind("ns", "zoned-1", "u", "x0") == ""
    # and when its zone cannot hold the rest, it says so and holds nothing
    fresh = service(Recorder())
    fresh.sync_nodes(nodes)
    three = gang(3)
    three[0]["spec"]["nodeName"] = "x1"
    fresh.sync_pods([three[0]])
    said = fresh.filter(three[1], list(zones)).failed["y0"]
    assert "within Zone/x (its bound members' Zone); no Zone holds them now" in said


def test_a_restarted_extender_keeps_a_strict_spread_gang_off_its_bound_members_nodes() -> None:
    fresh = service(Recorder())
    fresh.sync_nodes([node("p", "A100", 12), node("q", "A100", 4)])
    first = member(0, 2, 4, "StrictSpread")
    first["spec"]["nodeName"] = "p"  # bound before the restart; p still has 8 free
    fresh.sync_pods([first])
    assert fresh.filter(member(1, 2, 4, "StrictSpread"), ["p", "q"]).passed == ["q"]
