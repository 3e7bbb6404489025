"""Jobs are planned only on the nodes their pods may use (taints, nodeSelector, node affinity).

Before, the scheduling pass counted every GPU node of a type for every job: a job
whose template does not tolerate a node's taint (a team's dedicated pool), or
that selects nodes by label, was planned where kube-scheduler would never put
its pods. They stayed Pending, the stuck rule re-planned the gang after 45 s on
the same node, and so on, while GPUs it could use sat idle.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import TrainingJobSpec
from chronotope.controllers.trainingjob import reconcile
from chronotope.sharing.labels import GPU_PRODUCT_LABEL
from chronotope.workloads.capacity import (
    _ADMITTED,
    NodeCapacity,
    admitting,
    cluster_capacity,
    take,
)
from chronotope.workloads.gang import JOB_LABEL
from chronotope.workloads.joint import Contender, arbitrate
from chronotope.workloads.node_fit import (
    HostPort,
    NodeRules,
    Taint,
    avoiding,
    next_avoid,
    node_taints,
)
from chronotope.workloads.podreq import PLANNED_NODE_ANNOTATION
from chronotope.workloads.preemption import plan_preemption
from chronotope.workloads.training import Action, decide
from tests.unit.controllers.test_reconcile import FakeOps
from tests.unit.workloads.test_backfill import node, tjob

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
A100, V100, H100 = "A100-SXM4-80GB", "V100-SXM2-32GB", "H100"
RESERVED = {"key": "dedicated", "value": "team-b", "effect": "NoSchedule"}
TOLERATE = {"key": "dedicated", "operator": "Equal", "value": "team-b", "effect": "NoSchedule"}


def _rules(**pod_spec: Any) -> NodeRules:
    return NodeRules.of_template({"spec": pod_spec}, whole_gpus=True)


def _term(*expressions: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        term["matchFields"] = list(fields)
    return term


def _affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


LABELS = {"pool": "a", "gen": "4", "zone": "z1"}


@pytest.mark.parametrize(
    ("pod_spec", "refused"),
    [
        ({}, None),
        ({"nodeSelector": {"pool": "a"}}, None),
        ({"nodeSelector": {"pool": "b"}}, "nodeSelector pool=b"),
        # the planner sets the GPU product itself: the template's is not a constraint
        ({"nodeSelector": {"nvidia.com/gpu.product": "other"}}, None),
        ({"affinity": _affinity(_term({"key": "pool", "operator": "In", "values": ["a"]}))}, None),
        (
            {"affinity": _affinity(_term({"key": "pool", "operator": "NotIn", "values": ["a"]}))},
            "required node affinity",
        ),
        ({"affinity": _affinity(_term({"key": "pool", "operator": "Exists"}))}, None),
        (
            {"affinity": _affinity(_term({"key": "pool", "operator": "DoesNotExist"}))},
            "required node affinity",
        ),
        ({"affinity": _affinity(_term({"key": "gen", "operator": "Gt", "values": ["3"]}))}, None),
        (
            {"affinity": _affinity(_term({"key": "gen", "operator": "Lt", "values": ["4"]}))},
            "required node affinity",
        ),
        # the terms are ORed, a term's expressions ANDed
        (
            {
                "affinity": _affinity(
                    _term(
                        {"key": "pool", "operator": "In", "values": ["a"]},
                        {"key": "zone", "operator": "In", "values": ["z2"]},
                    ),
                    _term({"key": "zone", "operator": "In", "values": ["z1"]}),
                )
            },
            None,
        ),
        (
            {
                "affinity": _affinity(
                    _term(fields=({"key": "metadata.name", "operator": "In", "values": ["n0"]},))
                )
            },
            "required node affinity",
        ),
        (
            {
                "affinity": _affinity(
                    _term(fields=({"key": "metadata.name", "operator": "In", "values": ["n1"]},))
                )
            },
            None,
        ),
        # an empty term matches no node (kube's rule)
        ({"affinity": _affinity({})}, "required node affinity"),
        # malformed affinity states nothing here (the API server rejects the pod)
        ({"affinity": _affinity(_term({"key": "pool", "operator": "Near"}))}, None),
    ],
)
def test_node_selectors_and_required_affinity_follow_kube_schedulers_rules(
    pod_spec: dict[str, Any], refused: str | None
) -> None:
    assert _rules(**pod_spec).refuses("n1", LABELS, ()) == refused


@pytest.mark.parametrize(
    ("tolerations", "tolerated"),
    [
        ([], False),
        ([TOLERATE], True),
        ([{**TOLERATE, "value": "team-a"}], False),
        ([{"key": "dedicated", "operator": "Exists"}], True),  # any value, any effect
        ([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], False),
        ([{"operator": "Exists"}], True),  # no key and Exists: every taint
        ([{"key": "other", "operator": "Exists"}], False),
    ],
)
def test_a_taint_must_be_tolerated(tolerations: list[dict[str, Any]], tolerated: bool) -> None:
    taints = (Taint("dedicated", "team-b", "NoSchedule"),)
    why = _rules(tolerations=tolerations).refuses("n1", {}, taints)
    assert (why is None) == tolerated
    if not tolerated:
        assert why == "taint dedicated=team-b:NoSchedule not tolerated"


def test_only_filtering_taints_count_and_the_gpu_resources_taint_is_tolerated_for_whole_gpus() -> (
    None
):
    obj = {
        "spec": {
            "taints": [
                {"key": "soft", "effect": "PreferNoSchedule"},
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "evict", "effect": "NoExecute"},
            ]
        }
    }
    taints = node_taints(obj)
    assert [str(t) for t in taints] == ["nvidia.com/gpu=present:NoSchedule", "evict:NoExecute"]
    whole = NodeRules.of_template({}, whole_gpus=True)
    shared = NodeRules.of_template({}, whole_gpus=False)
    assert whole.refuses("n", {}, taints[:1]) is None  # ExtendedResourceToleration adds it
    assert (
        shared.refuses("n", {}, taints[:1])
        == "taint nvidia.com/gpu=present:NoSchedule not tolerated"
    )
    assert whole.refuses("n", {}, taints) == "taint evict:NoExecute not tolerated"


def _tainted(name: str, product: str, gpus: int, **labels: str) -> dict[str, Any]:
    n = node(name, product, gpus)
    n["metadata"]["labels"] |= labels
    n["spec"] = {"taints": [RESERVED]}
    return n


def test_a_gang_is_placed_only_on_nodes_its_workers_may_use() -> None:
    capacity = tuple(cluster_capacity([_tainted("big", A100, 8), node("small", A100, 4)], []))
    plain, tolerant = _rules(), _rules(tolerations=[TOLERATE])
    kept, refused, *_ = admitting(capacity, A100, plain)
    assert [n.name for n in kept] == ["small"]
    assert refused == {"taint dedicated=team-b:NoSchedule not tolerated": 1}
    _, placements = take(capacity, A100, 2, 2, rules=plain)
    assert [p[0] for p in placements] == ["small", "small"]
    _, placements = take(capacity, A100, 1, 8, rules=tolerant)
    assert placements == (("big", tuple(range(8))),)
    # a worker that fits on no node it may use leaves the gang unplaced
    _, placements = take(capacity, A100, 1, 8, rules=plain)
    assert placements == ()


def _with_template(job: dict[str, Any], **pod_spec: Any) -> dict[str, Any]:
    job["spec"]["template"]["spec"] |= pod_spec
    return job


def _planned_nodes(ops: FakeOps) -> dict[str, str]:
    """job -> the node the pass planned its (one) worker on."""
    return {
        p["metadata"]["labels"][JOB_LABEL]: p["metadata"]["annotations"][PLANNED_NODE_ANNOTATION]
        for p in ops.started
    }


def _status(ops: FakeOps, job: dict[str, Any]) -> dict[str, Any]:
    out = reconcile(job, ops, NOW)
    assert out.status is not None
    return out.status


def test_jobs_start_where_their_pods_may_go_and_a_job_no_node_admits_says_why() -> None:
    # the only free A100s are on team b's dedicated node; the V100 node is open to all
    nodes = [_tainted("a100-b", A100, 8), node("v100", V100, 4), node("v100-x", V100, 8)]
    speeds = {A100: 1.0, V100: 0.5}
    old = NOW - timedelta(hours=1)
    running = tjob("running", created=old - timedelta(hours=1), types=speeds, phase="Running")
    either = tjob("either", created=old - timedelta(minutes=30), types=speeds, phase="Waiting")
    pinned = tjob("pinned", created=old, types={A100: 1.0}, phase="Waiting")
    team_b = _with_template(
        tjob("team-b", created=old, types={A100: 1.0}, phase="Waiting"), tolerations=[TOLERATE]
    )
    selected = _with_template(
        tjob("selected", created=old, types={V100: 1.0}, phase="Waiting"),
        nodeSelector={"pool": "x"},
    )
    nodes[2]["metadata"]["labels"]["pool"] = "x"
    ops = FakeOps(nodes, [running, either, pinned, team_b, selected])
    ops._pods = []
    _status(ops, either)
    _status(ops, team_b)
    _status(ops, selected)
    placed = _planned_nodes(ops)
    # before, "either" was planned on the faster A100 node whose taint it does not
    # tolerate, and "selected" on the V100 node that fits it best (v100, 4 free)
    assert placed == {"either": "v100", "team-b": "a100-b", "selected": "v100-x"}
    why = _status(ops, pinned)
    assert why["phase"] != "Starting"
    assert "none of its 1 node(s) admits its workers" in why["whyWaiting"]
    assert "1 by taint dedicated=team-b:NoSchedule not tolerated" in why["whyWaiting"]


def test_a_capacity_built_by_hand_has_no_labels_or_taints() -> None:
    n = NodeCapacity("a", "L4", 4, 4, True)
    assert (n.labels, n.taints) == ({}, ())
    assert admitting((n,), "L4", _rules(nodeSelector={"pool": "a"}))[1] == {
        "nodeSelector pool=a": 1
    }


def test_the_joint_plan_puts_a_job_bound_to_some_nodes_where_its_pods_may_go() -> None:
    # two queues' heads contend for V100s: the joint CP-SAT plan gives each worker only
    # the nodes its node rules admit (before stop 55 such a job was left out of it)
    nodes = [node("v100", V100, 2), node("v100-x", V100, 2)]
    nodes[1]["metadata"]["labels"]["pool"] = "x"
    old = NOW - timedelta(hours=1)
    sel = _with_template(
        tjob("sel", created=old, types={V100: 1.0}, phase="Waiting"), nodeSelector={"pool": "x"}
    )
    other = tjob("other", created=old + timedelta(minutes=1), types={V100: 1.0}, phase="Waiting")
    other["spec"]["queue"] = "q2"
    ops = FakeOps(nodes, [sel, other])
    ops._pods = []
    started = reconcile(sel, ops, NOW).events
    assert "joint plan over 2 job(s)" in next(m for _, r, m in started if r == "Started")
    _status(ops, other)
    placed = _planned_nodes(ops)
    assert placed["sel"] == "v100-x"  # without its rules the joint plan put it on v100
    assert "other" in placed


def test_the_joint_plan_gives_a_worker_only_the_nodes_it_may_use() -> None:
    # the solver's own check: a request naming its nodes is placed on them or not at all
    capacity = tuple(cluster_capacity([node("a", V100, 2), node("b", V100, 4)], []))
    speeds = {V100: 1.0}
    specs = [
        _with_template(tjob(n, created=NOW, gpus=2, types=speeds, phase="Waiting"), **rules)
        for n, rules in (("free", {}), ("on-a", {"nodeSelector": {"pool": "a"}}))
    ]
    capacity = tuple(replace(n, labels={"pool": n.name, GPU_PRODUCT_LABEL: V100}) for n in capacity)
    contenders = []
    for job in specs:
        spec = TrainingJobSpec.model_validate(job["spec"])
        (d,) = [decide(spec, capacity, NOW)]
        assert d.action is Action.START
        contenders.append(Contender(f"scale/{job['metadata']['name']}", spec, (d,)))
    for me in ("scale/free", "scale/on-a"):
        out = arbitrate(me, contenders, capacity, NOW)
        assert out.starts
        node_of = {"scale/free": "b", "scale/on-a": "a"}[me]
        assert {p[0] for p in out.placements} == {node_of}


def test_a_node_holds_only_the_workers_its_free_cpu_and_memory_allow() -> None:
    rules = _rules(
        containers=[{"name": "w", "resources": {"requests": {"cpu": "16", "memory": "64Gi"}}}]
    )
    assert (rules.cpu_milli, rules.memory_mib) == (16000, 65536)
    assert rules.fit_by(40000, 1 << 40)[0] == 2  # the node states no memory: CPU binds
    assert rules.fit_by(1 << 40, 1 << 40)[0] is None
    assert rules.fit_by(64000, 100000)[0] == 1
    assert _rules().fit_by(0, 0)[0] is None  # asks for nothing: no limit


def _cpu_node(name: str, cpu: str) -> dict[str, Any]:
    n = node(name, A100, 8)
    for key in ("capacity", "allocatable"):
        n["status"][key]["cpu"] = cpu
    return n


def _cpu_job(name: str, created: datetime) -> dict[str, Any]:
    job = tjob(name, created=created, types={A100: 1.0}, phase="Waiting")
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "16"}}
    return job


def test_workers_are_planned_where_their_cpu_fits_too() -> None:
    # 8 free GPUs on each node, but CPU for two 16-core workers only: before, the pass
    # packed the one-GPU jobs onto one node, where all but two stayed Pending for CPU
    nodes = [_cpu_node("n0", "32"), _cpu_node("n1", "32")]
    jobs = [_cpu_job(f"j{i}", NOW - timedelta(hours=1, minutes=-i)) for i in range(5)]
    ops = FakeOps(nodes, jobs)
    ops._pods = []
    statuses = [_status(ops, job) for job in jobs]
    placed = _planned_nodes(ops)
    assert sorted(placed.values()) == ["n0", "n0", "n1", "n1"], placed
    assert "j4" not in placed  # both nodes' CPU is taken: it waits, and says why
    assert (
        "2 node(s) have free GPUs but too little free CPU or memory for a worker: "
        "16000m CPU, 0 MiB" in statuses[4]["whyWaiting"]
    ), statuses[4]["whyWaiting"]


def test_a_job_whose_worker_needs_more_cpu_than_any_node_allocates_is_told_so() -> None:
    # 16 cores a worker, 8 allocatable on the only node: before, the job waited for
    # "room" that could never come; now it is Pending, Unschedulable, saying why
    nodes = [_cpu_node("n0", "8")]
    job = _cpu_job("big-cpu", NOW - timedelta(hours=1))
    ops = FakeOps(nodes, [job])
    ops._pods = []
    status = _status(ops, job)
    assert not ops.started
    assert status["phase"] == "Pending", status
    assert status["whyWaiting"] == (
        "cannot ever run here: A100-SXM4-80GB: none of its 1 node(s) admits its workers (1 by "
        "allocatable CPU or memory below one worker's request (16000m CPU, 0 MiB))"
    )


def test_a_cordoned_node_makes_a_job_wait_not_fail() -> None:
    # the node lifecycle controller taints a cordoned node `unschedulable` (and a node
    # under pressure or not ready likewise): it takes no pod now, so the job waits for
    # it (`Waiting`), as before; it is not a node that refuses the job for good
    cordoned = node("a", A100, 8)
    cordoned["spec"] = {
        "unschedulable": True,
        "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
    }
    assert node_taints(cordoned) == ()
    job = tjob("j", created=NOW - timedelta(hours=1), types={A100: 1.0}, phase="Waiting")
    ops = FakeOps([cordoned], [job])
    ops._pods = []
    status = _status(ops, job)
    assert status["phase"] == "Waiting", status
    assert "room for 0 of 1 worker(s) now" in status["whyWaiting"]


def test_the_remembered_answers_match_a_fresh_look_after_every_take() -> None:
    # a pass asks `admitting` of each capacity for every job and carries the answers
    # over each start (`take`): they must be what looking at every node again gives
    rng = random.Random(7)
    capacity: tuple[NodeCapacity, ...] = tuple(
        NodeCapacity(
            f"n{i}",
            "L4",
            8,
            8,
            True,
            free_gpus=tuple(range(8)),
            cpu_free_milli=rng.choice([8000, 32000, 64000]),
            labels={"pool": rng.choice("ab")},
            taints=(Taint("dedicated", "x"),) if i % 5 == 0 else (),
            host_ports=frozenset([HostPort(7777)]) if i % 7 == 0 else frozenset(),
        )
        for i in range(30)
    )
    port = {"hostPort": 7777}
    asks = [
        _rules(),
        _rules(nodeSelector={"pool": "a"}),
        _rules(tolerations=[{"operator": "Exists"}]),
        _rules(containers=[{"name": "w", "resources": {"requests": {"cpu": "6"}}}]),
        _rules(containers=[{"name": "w", "ports": [port]}]),
        _rules(
            containers=[{"name": "w", "ports": [port], "resources": {"requests": {"cpu": "6"}}}]
        ),
    ]
    for _ in range(60):
        rules, per_worker = rng.choice(asks), rng.choice([1, 2])
        remembered = [admitting(capacity, "L4", r, p) for r in asks for p in (1, 2)]
        _ADMITTED.clear()
        fresh = [admitting(capacity, "L4", r, p) for r in asks for p in (1, 2)]
        assert [(u.nodes, u.refused, u.short, u.blocked) for u in remembered] == [
            (u.nodes, u.refused, u.short, u.blocked) for u in fresh
        ]
        capacity, _ = take(capacity, "L4", rng.choice([1, 2]), per_worker, rules=rules)


def _running(
    name: str, node_name: str, gpus: int, priority: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A preemptible running job of `gpus` H100s on `node_name`, and its one worker pod."""
    job = tjob(
        name, created=NOW - timedelta(hours=3), gpus=gpus, types={H100: 1.0}, priority=priority
    )
    job["spec"]["preemptible"] = True
    job["status"] = {"phase": "Running", "plan": {"gpuType": H100, "totalGpus": gpus, "workers": 1}}
    pod = {
        "metadata": {"name": f"{name}-g0-0", "namespace": "scale", "labels": {JOB_LABEL: name}},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }
    return job, pod


@pytest.mark.parametrize("dedicated", [True, False])
def test_preemption_spares_the_victims_the_job_starts_without(dedicated: bool) -> None:
    # the cheapest victim (lowest priority) frees GPUs the urgent job cannot use: on a
    # node its pods may not go to, or too few next to a job nobody may stop; the next
    # victim makes the fit, and the first is spared (kube-scheduler's reprieve; before,
    # both were stopped)
    nodes = [node("n0", H100, 8), node("n1", H100, 8)]
    cheap, cheap_pod = _running("cheap", "n0", 2 if not dedicated else 8, priority=0)
    other, other_pod = _running("other", "n1", 8, priority=1)
    pods = [cheap_pod, other_pod]
    if dedicated:
        nodes[0]["spec"] = {"taints": [RESERVED]}
    else:  # six GPUs of n0 held by a job that is not preemptible
        keeper, keeper_pod = _running("keeper", "n0", 6, priority=0)
        keeper["spec"]["preemptible"] = False
        pods.append(keeper_pod)
    urgent = TrainingJobSpec.model_validate(
        tjob("urgent", created=NOW, gpus=8, types={H100: 1.0}, priority=5)["spec"]
    )
    got = plan_preemption("scale/urgent", urgent, [cheap, other], nodes, pods, now=NOW)
    assert got is not None
    assert got.victims == ("scale/other",)
    assert got.decision.action is Action.START


def test_avoiding_excludes_nodes_by_name_in_every_term_and_keeps_an_empty_term_empty() -> None:
    plain = {"spec": {"containers": [{"name": "w"}]}}
    rules = NodeRules.of_template(avoiding(plain, ["x", "y"]), whole_gpus=True)
    assert rules.refuses("x", {}, ()) == "node affinity excluding it by name"
    assert rules.refuses("y", {}, ()) == "node affinity excluding it by name"
    assert rules.refuses("z", {}, ()) is None
    assert plain == {"spec": {"containers": [{"name": "w"}]}}  # not changed in place
    pool_a = _term({"key": "pool", "operator": "In", "values": ["a"]})
    ored = {"spec": {"affinity": _affinity(pool_a, {})}}
    rules = NodeRules.of_template(avoiding(ored, ["x"]), whole_gpus=True)
    assert rules.refuses("x", {"pool": "a"}, ()) == "node affinity excluding it by name"
    assert rules.refuses("z", {"pool": "a"}, ()) is None
    # the empty term matched nothing before; it must not come to match all but x
    assert rules.refuses("z", {"pool": "b"}, ()) == "required node affinity"
    terms = avoiding(ored, ["x"])["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[1] == {}
    assert avoiding(ored, []) == ored


@pytest.mark.parametrize(
    ("avoided", "stuck", "usable", "after"),
    [
        ([], ["a"], ["a", "b"], ["a"]),
        (["a"], ["b"], ["a", "b", "c"], ["a", "b"]),
        (["b", "a"], ["b"], ["a", "b", "c"], ["a", "b"]),  # seen again: the latest
        # it would rule out every node it may use: start over with the node just seen
        (["a"], ["b"], ["a", "b"], ["b"]),
        # its only node: nothing to avoid, it waits there as before
        ([], ["a"], ["a"], []),
        (["gone"], ["a"], ["a", "b"], ["gone", "a"]),
        ([], [], ["a"], []),
        ([f"n{i}" for i in range(40)], ["a"], ["a", "b"], [*(f"n{i}" for i in range(9, 40)), "a"]),
    ],
)
def test_the_avoided_nodes_never_rule_out_every_node_a_job_may_use(
    avoided: list[str], stuck: list[str], usable: list[str], after: list[str]
) -> None:
    assert next_avoid(avoided, stuck, usable) == after
