"""Pod anti-affinity between workers and other pods (kube-scheduler's InterPodAffinity filter).

A worker fits a node only where no pod there is selected by the worker's required
pod anti-affinity on `kubernetes.io/hostname`, and where no pod there has one
that selects the worker (`node_fit.pod_anti_terms`, `NodeRules.shuns`). Before,
the plan knew only the worker's anti-affinity against its own gang: a gang was
planned next to a pod it (or that pod) keeps away from, kube-scheduler would not
bind it, and it waited 45 s for the stuck rule to move it off the node.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from chronotope.api.v1alpha1.trainingjob import PlacementStrategy
from chronotope.workloads.capacity import admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.joint import Contender, arbitrate, options_for
from chronotope.workloads.node_fit import (
    Neighbour,
    PodTerm,
    avoids_itself,
    job_rules,
    pod_affinity_terms,
    pod_anti_terms,
)
from chronotope.workloads.training import decide
from tests.unit.controllers.test_reconcile import FakeOps
from tests.unit.workloads.test_backfill import node, tjob
from tests.unit.workloads.test_node_fit import A100, NOW, V100, _planned_nodes, _status
from tests.unit.workloads.test_one_per_node import _anti

HOST = "kubernetes.io/hostname"
ME: Neighbour = ("scale", frozenset({("app", "trainer"), ("chronotope.dev/job", "j")}))


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


@pytest.mark.parametrize(
    ("affinity", "pod", "selected"),
    [
        # no namespaces, no namespaceSelector: the term is for the pod's own namespace
        (_anti({"matchLabels": {"app": "serve"}}), ("scale", _labels(app="serve")), True),
        (_anti({"matchLabels": {"app": "serve"}}), ("other", _labels(app="serve")), False),
        (
            _anti({"matchLabels": {"app": "serve"}}, namespaces=["other"]),
            ("other", _labels(app="serve")),
            True,
        ),
        # an empty namespaceSelector: every namespace
        (
            _anti({"matchLabels": {"app": "serve"}}, namespaceSelector={}),
            ("other", _labels(app="serve")),
            True,
        ),
        (_anti({}), ("scale", _labels()), True),  # an empty selector: every pod
        (
            _anti({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
            ("scale", _labels(app="x")),
            True,
        ),
        (_anti({"matchLabels": {"app": "serve"}}), ("scale", _labels(app="train")), False),
    ],
)
def test_a_term_selects_pods_as_kube_schedulers_affinity_term_does(
    affinity: dict[str, Any], pod: Neighbour, selected: bool
) -> None:
    (term,) = pod_anti_terms({"affinity": affinity}, ME)
    assert term.selects(pod) is selected


@pytest.mark.parametrize(
    "affinity",
    [
        _anti({"matchLabels": {"app": "serve"}}, ""),  # no topology key
        _anti(None),  # no selector: selects no pod
        _anti({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}),
        {"podAffinity": _anti({})["podAntiAffinity"]},  # affinity, not anti-affinity
        {"podAntiAffinity": "junk"},
    ],
)
def test_terms_that_cannot_be_read_here_state_nothing(affinity: dict[str, Any]) -> None:
    assert pod_anti_terms({"affinity": affinity}, ME) == ()


def test_match_label_keys_take_the_pods_own_values() -> None:
    # the API server merges matchLabelKeys (mismatchLabelKeys) into the selector as
    # key In (NotIn) the pod's own value; a key the pod lacks adds nothing
    spec = {
        "affinity": _anti(
            {"matchLabels": {"app": "trainer"}},
            matchLabelKeys=["chronotope.dev/job", "absent"],
            mismatchLabelKeys=["app"],
        )
    }
    (term,) = pod_anti_terms(spec, ME)
    assert isinstance(term, PodTerm)
    assert not term.selects(ME)  # app NotIn (trainer)
    (same_job,) = pod_anti_terms({"affinity": _anti({}, matchLabelKeys=["chronotope.dev/job"])}, ME)
    assert same_job.selects(("scale", _labels(**{"chronotope.dev/job": "j"})))
    assert not same_job.selects(("scale", _labels(**{"chronotope.dev/job": "k"})))


def test_self_anti_affinity_reads_the_terms_namespaces() -> None:
    mine = {"app": "trainer"}
    listed = {"affinity": _anti({"matchLabels": mine}, namespaces=["scale"])}
    assert avoids_itself(listed, mine, "scale")
    assert not avoids_itself(listed, mine, "other")


def _pod(
    name: str, node_name: str, labels: dict[str, str], *, affinity: Any = None, ns: str = "scale"
) -> dict[str, Any]:
    """A bound pod of another workload (no GPU) with `labels` and a pod `affinity`."""
    spec: dict[str, Any] = {"nodeName": node_name, "containers": [{"name": "c"}]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": spec,
        "status": {"phase": "Running"},
    }


def _job(name: str, minutes: int = 0, **template: Any) -> dict[str, Any]:
    job = tjob(
        name,
        created=NOW - timedelta(hours=1, minutes=-minutes),
        types={A100: 2.0, V100: 1.0},
        phase="Waiting",
    )
    job["spec"]["template"] |= template
    return job


KEEP_OFF_SERVING = _anti({"matchLabels": {"app": "serve"}})
KEEP_TRAINERS_OFF = _anti({"matchLabels": {"app": "trainer"}})


def test_the_cluster_model_knows_each_nodes_pods_and_their_anti_affinity() -> None:
    pods = [
        _pod("serve", "a", {"app": "serve"}, affinity=KEEP_TRAINERS_OFF),
        _pod("cache", "b", {"app": "cache"}),
    ]
    a, b = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], pods)
    assert set(a.neighbours) == {("scale", _labels(app="serve"))}
    assert [t.selects(ME) for t in a.repels] == [True]
    assert set(b.neighbours) == {("scale", _labels(app="cache"))}
    assert b.repels == ()


def test_a_job_knows_its_workers_namespace_and_labels() -> None:
    spec = job_spec(_job("j", metadata={"labels": {"app": "trainer"}}))
    assert job_rules(spec).who == ME
    assert spec.template is not None
    assert spec.template["metadata"]["namespace"] == "scale"


@pytest.mark.parametrize(
    ("pods", "template"),
    [
        # the workers' anti-affinity selects the serving pod on node a
        ([_pod("serve", "a", {"app": "serve"})], {"spec": {"affinity": KEEP_OFF_SERVING}}),
        # the serving pod's anti-affinity selects the workers
        (
            [_pod("serve", "a", {"app": "serve"}, affinity=KEEP_TRAINERS_OFF)],
            {"metadata": {"labels": {"app": "trainer"}}},
        ),
    ],
)
def test_a_node_a_pod_anti_affinity_keeps_the_workers_off_gives_them_no_gpu_now(
    pods: list[dict[str, Any]], template: dict[str, Any]
) -> None:
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], pods)
    job = _job("j")
    job["spec"]["template"]["spec"] |= template.get("spec", {})
    job["spec"]["template"] |= {k: v for k, v in template.items() if k != "spec"}
    rules = job_rules(job_spec(job))
    seen = admitting(capacity, A100, rules)
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 0), ("b", 8)]
    assert (seen.shunned, seen.blocked, seen.short) == (1, 0, 0)
    # a job neither selects nor is selected by takes node a's GPUs as before
    plain = job_rules(job_spec(_job("k", metadata={"labels": {"app": "other"}})))
    assert [n.free for n in admitting(capacity, A100, plain).nodes] == [8, 8]


def test_a_pod_in_another_namespace_is_not_selected_by_a_term_for_the_pods_own() -> None:
    pods = [_pod("serve", "a", {"app": "serve"}, ns="other")]
    capacity = cluster_capacity([node("a", A100, 8)], pods)
    job = _job("j")
    job["spec"]["template"]["spec"]["affinity"] = KEEP_OFF_SERVING
    assert [n.free for n in admitting(capacity, A100, job_rules(job_spec(job))).nodes] == [8]


def test_a_job_started_in_the_pass_keeps_later_ones_off_its_nodes() -> None:
    # the first job's workers keep serving pods off their node; the second job's
    # workers are serving pods: the node the first took is no longer theirs, and the
    # other way round a job whose workers avoid the first's finds its node shunned
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    first = _job("first", metadata={"labels": {"app": "trainer"}})
    first["spec"]["template"]["spec"]["affinity"] = KEEP_OFF_SERVING
    rules = job_rules(job_spec(first))
    left, placed = take(capacity, A100, 1, 1, rules=rules)
    (where,) = (p[0] for p in placed)
    served = job_rules(job_spec(_job("serve", metadata={"labels": {"app": "serve"}})))
    seen = admitting(left, A100, served)
    assert [n.name for n in seen.nodes if n.free == 0] == [where]
    assert seen.shunned == 1
    shy = _job("shy", metadata={"labels": {"app": "x"}})
    shy["spec"]["template"]["spec"]["affinity"] = KEEP_TRAINERS_OFF
    assert [
        n.name for n in admitting(left, A100, job_rules(job_spec(shy))).nodes if not n.free
    ] == [where]


def test_a_job_kept_off_the_fast_type_starts_on_the_other_and_one_that_cannot_says_why() -> None:
    # the only A100 node holds a serving pod the workers keep off: the job starts on
    # the V100 at once; before, it was planned on the A100 and waited there 45 s
    nodes = [node("a100", A100, 8), node("v100", V100, 8)]
    job = _job("j")
    job["spec"]["template"]["spec"]["affinity"] = KEEP_OFF_SERVING
    ops = FakeOps(nodes, [job])
    ops._pods = [_pod("serve", "a100", {"app": "serve"})]
    _status(ops, job)
    assert _planned_nodes(ops) == {"j": "v100"}
    pinned = _job("pinned", 1)
    pinned["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    pinned["spec"]["template"]["spec"]["affinity"] = KEEP_OFF_SERVING
    capacity = cluster_capacity(nodes, [_pod("serve", "a100", {"app": "serve"})])
    decision = decide(job_spec(pinned), capacity, NOW)
    assert decision.gpu_type is None
    assert (
        "1 node(s) have free GPUs but a required pod affinity or anti-affinity or a topology "
        "spread keeps its workers off them, or lets fewer there: a pod there matches its "
        "workers' pod anti-affinity"
    ) in decision.reason, decision.reason


def test_the_joint_plan_leaves_out_the_nodes_a_pod_anti_affinity_shuns() -> None:
    # packing alone would put j on node a, the fullest that holds it
    nodes = [node("a", A100, 2), node("b", A100, 4)]
    capacity = cluster_capacity(nodes, [_pod("serve", "a", {"app": "serve"})])
    job = _job("j")
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    job["spec"]["template"]["spec"]["affinity"] = KEEP_OFF_SERVING
    spec = job_spec(job)
    decision = decide(spec, capacity, NOW)
    assert decision.gpu_type == A100, decision.reason
    other = _job("k", 1)
    other["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    rival = Contender(
        "scale/k", job_spec(other), options_for([decide(job_spec(other), capacity, NOW)])
    )
    contender = Contender("scale/j", spec, options_for([decision]))
    joint = arbitrate("scale/j", [contender, rival], capacity, NOW)
    assert joint.starts, joint.reason
    assert [p[0] for p in joint.placements] == ["b"], joint


def test_a_joint_placement_where_a_job_started_since_shuns_the_workers_is_made_again() -> None:
    # the joint plan put both jobs on node a (it does not see the pods of the jobs it
    # starts together); the first keeps serving pods off its node: the second, a
    # serving job, goes where the gang rule puts it
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    first = _job("first", metadata={"labels": {"app": "trainer"}})
    first["spec"]["template"]["spec"]["affinity"] = KEEP_OFF_SERVING
    left, placed = take(
        capacity, A100, 1, 1, placements=[("a", (0,))], rules=job_rules(job_spec(first))
    )
    assert placed == (("a", (0,)),)
    served = job_rules(job_spec(_job("serve", metadata={"labels": {"app": "serve"}})))
    _, second = take(left, A100, 1, 1, placements=[("a", (1,))], rules=served)
    assert second == (("b", (0,)),)
    # a job neither selects nor is selected by keeps the plan's placement
    plain = job_rules(job_spec(_job("k", metadata={"labels": {"app": "other"}})))
    _, kept = take(left, A100, 1, 1, placements=[("a", (1,))], rules=plain)
    assert kept == (("a", (1,)),)


# ---------------------------------------------------------------- required pod affinity
def _near(app: str, key: str = HOST) -> dict[str, Any]:
    """A required pod affinity to pods labelled `app` (on the node, by default)."""
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def test_pod_affinity_is_read_whole_or_not_at_all() -> None:
    (term,) = pod_affinity_terms({"affinity": _near("cache")}, ME)
    assert term.selects(("scale", _labels(app="cache")))
    # one term on a zone is read with its key
    both = _near("cache")
    terms = both["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    zoned = _near("db", "topology.kubernetes.io/zone")["podAffinity"]
    terms.append(zoned["requiredDuringSchedulingIgnoredDuringExecution"][0])
    assert [t.key for t in pod_affinity_terms({"affinity": both}, ME)] == [
        HOST,
        "topology.kubernetes.io/zone",
    ]
    # one that cannot be read (no label selector: the API server would refuse it):
    # left out whole
    del terms[1]["labelSelector"]
    assert pod_affinity_terms({"affinity": both}, ME) == ()
    assert pod_anti_terms({"affinity": _near("cache")}, ME) == ()


def test_workers_that_must_share_a_node_with_a_pod_go_only_where_one_runs() -> None:
    pods = [_pod("cache", "b", {"app": "cache"})]
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], pods)
    job = _job("j")
    job["spec"]["template"]["spec"]["affinity"] = _near("cache")
    seen = admitting(capacity, A100, job_rules(job_spec(job)))
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 0), ("b", 8)]
    assert seen.shunned == 1
    # no pod meets it anywhere, and the workers do not meet it: no node will do
    alone = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    assert [n.free for n in admitting(alone, A100, job_rules(job_spec(job))).nodes] == [0, 0]


def test_the_first_of_a_series_goes_anywhere_and_the_rest_join_it() -> None:
    # the workers meet their own affinity: with no such pod running, any node will do
    # (kube-scheduler's first-of-a-series rule), and the gang is packed onto one node
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], [])
    job = _job("j", metadata={"labels": {"app": "trainer"}})
    job["spec"] |= {"replicas": 2, "placement": {"strategy": "Spread"}}
    job["spec"]["template"]["spec"]["affinity"] = _near("trainer")
    spec = job_spec(job)
    assert spec.placement.strategy is PlacementStrategy.STRICT_PACK
    rules = job_rules(spec)
    assert [n.free for n in admitting(capacity, A100, rules).nodes] == [8, 8]
    left, placed = take(capacity, A100, 2, 1, strategy=spec.placement.strategy, rules=rules)
    (where,) = {p[0] for p in placed}
    # the next job of the series goes only beside them
    later = _job("k", metadata={"labels": {"app": "trainer"}})
    later["spec"]["template"]["spec"]["affinity"] = _near("trainer")
    seen = admitting(left, A100, job_rules(job_spec(later)))
    assert [n.name for n in seen.nodes if n.free] == [where]


def test_jobs_a_pods_anti_affinity_does_not_select_still_share_one_answer() -> None:
    # a pod with an anti-affinity on the type's nodes: jobs it does not select, of equal
    # templates (here asking CPU, so their answer is looked up node by node), share
    # `admitting`'s answer (the pass asks it for every job); a job it selects gets its own
    pods = [_pod("serve", "a", {"app": "serve"}, affinity=KEEP_TRAINERS_OFF)]
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], pods)
    cpu = [{"name": "w", "image": "registry.example/t:1", "resources": {"requests": {"cpu": "1"}}}]

    def rules(name: str, app: str) -> Any:
        job = _job(name, metadata={"labels": {"app": app}})
        job["spec"]["template"]["spec"]["containers"] = cpu
        return job_rules(job_spec(job))

    plain = [rules(n, "x") for n in "jk"]
    assert plain[0] == plain[1]
    assert plain[0].who != plain[1].who
    first, second = (admitting(capacity, A100, r, 2) for r in plain)
    assert first is second
    assert first.shunned == 0
    assert admitting(capacity, A100, rules("t", "trainer"), 2).shunned == 1
