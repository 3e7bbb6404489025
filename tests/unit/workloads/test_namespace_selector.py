"""Pod (anti-)affinity terms whose `namespaceSelector` names labels.

kube-scheduler reads such a term against the namespaces' labels: the namespaces
it selects join those it lists (`mergeAffinityTermNamespacesIfNotEmpty`). The plan
reads them the same way (`PodTerm.among`, with the labels in the cluster model:
`ClusterFacts.namespaces`). Before, an anti-affinity term with one was left out
and an affinity with one left the whole affinity unmodelled: a gang whose workers
must run beside a cache in a labelled team's namespace was planned anywhere,
kube-scheduler would not bind it, and the stuck rule moved it after 45 s.
"""

from __future__ import annotations

from typing import Any

from chronotope.workloads.capacity import ClusterFacts, admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import (
    anti_among,
    job_rules,
    near_among,
    pod_affinity_terms,
    pod_anti_terms,
)
from tests.unit.workloads.test_backfill import node
from tests.unit.workloads.test_node_fit import A100
from tests.unit.workloads.test_one_per_node import _anti
from tests.unit.workloads.test_pod_anti_affinity import ME, _job, _labels, _pod

LABELS = {
    "data": {"team": "data", "kubernetes.io/metadata.name": "data"},
    "web": {"team": "web"},
    "scale": {"team": "ml"},
    "listed": {},
}
FACTS = ClusterFacts(namespaces=LABELS)
TEAM_DATA = {"matchLabels": {"team": "data"}}


def _near(selector: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"podAffinity": _anti(selector, **extra)["podAntiAffinity"]}


def test_a_term_selects_the_namespaces_its_selector_matches_and_those_it_lists() -> None:
    spec = {
        "affinity": _anti(
            {"matchLabels": {"app": "cache"}}, namespaceSelector=TEAM_DATA, namespaces=["listed"]
        )
    }
    (raw,) = pod_anti_terms(spec, ME)
    assert not raw.selects(("data", _labels(app="cache")))  # not read yet: selects no one
    (term,) = anti_among([raw], LABELS)
    assert term.namespaces == frozenset({"data", "listed"})
    assert term.selects(("data", _labels(app="cache")))
    assert term.selects(("listed", _labels(app="cache")))
    assert not term.selects(("web", _labels(app="cache")))
    assert not term.selects(("data", _labels(app="db")))
    # the namespaces' labels unknown: an anti-affinity term with one is left out, an
    # affinity with one is unmodelled whole (as kube-scheduler's would be unknowable)
    assert anti_among([raw], None) == ()
    near = pod_affinity_terms({"affinity": _near({"matchLabels": {"app": "cache"}})}, ME)
    assert near_among([*near, raw], None) == ()
    assert len(near_among([*near, raw], LABELS)) == 2


def test_a_selector_by_expressions_reads_every_namespace() -> None:
    expression = {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["data"]}]}
    spec = {"affinity": _anti({"matchLabels": {"app": "x"}}, namespaceSelector=expression)}
    (term,) = anti_among(pod_anti_terms(spec, ME), LABELS)
    assert term.namespaces == frozenset({"web", "scale", "listed"})


def test_a_gangs_affinity_to_a_pod_in_a_labelled_namespace_keeps_it_beside_that_pod() -> None:
    pods = [_pod("cache", "a", {"app": "cache"}, ns="data"), _pod("cache", "b", {"app": "cache"})]
    nodes = [node("a", A100, 8), node("b", A100, 8)]
    job = _job("j")
    job["spec"]["template"]["spec"]["affinity"] = _near(
        {"matchLabels": {"app": "cache"}}, namespaceSelector=TEAM_DATA
    )
    rules = job_rules(job_spec(job))
    seen = admitting(cluster_capacity(nodes, pods, facts=FACTS), A100, rules)
    assert [(n.name, n.free) for n in seen.nodes] == [("a", 8), ("b", 0)]
    assert seen.shunned == 1
    assert "no pod there matches its workers' required pod affinity" in seen.shuns()
    # without the namespaces' labels the affinity is not modelled: both nodes count
    unknown = admitting(cluster_capacity(nodes, pods), A100, rules)
    assert [n.free for n in unknown.nodes] == [8, 8]


def test_a_running_pods_anti_affinity_on_labelled_namespaces_keeps_the_workers_off() -> None:
    # a pod in team web's namespace keeps pods of team ml's namespaces off its node
    away = _anti(
        {"matchLabels": {"app": "trainer"}}, namespaceSelector={"matchLabels": {"team": "ml"}}
    )
    pods = [_pod("serve", "a", {"app": "serve"}, affinity=away, ns="web")]
    capacity = cluster_capacity([node("a", A100, 8), node("b", A100, 8)], pods, facts=FACTS)
    trainer = job_rules(job_spec(_job("j", metadata={"labels": {"app": "trainer"}})))
    assert [n.free for n in admitting(capacity, A100, trainer).nodes] == [0, 8]
    # a worker started in the pass with such a term keeps later matching jobs off too
    shy = _job("shy", metadata={"labels": {"app": "other"}})
    shy["spec"]["template"]["spec"]["affinity"] = away
    left, placed = take(capacity, A100, 1, 1, rules=job_rules(job_spec(shy)))
    ((where, _),) = placed
    assert where == "b"
    assert [n.free for n in admitting(left, A100, trainer).nodes] == [0, 0]
