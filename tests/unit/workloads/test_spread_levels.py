"""A gang's own topology spread in levels, checked against kube-scheduler's rule by search.

kube-scheduler binds a gang's workers one after another; PodTopologySpread lets a
worker onto a node when its domain's count plus one is at most `maxSkew` above the
least count over the domains the constraint counts. For small random clusters (per
node, or per zone; some GPUs busy, some pods the spread counts already there) the
most workers any binding order places is found by exhaustive search, and the plan's
count (`capacity.admitting`, `training.workers_that_fit`) must equal it: never more
(a gang planned that kube-scheduler leaves unbound), never fewer (a gang that waits
for room it has). And `capacity.take`'s placement must bind in its own order.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import pytest

from chronotope.workloads.capacity import admitting, cluster_capacity, take
from chronotope.workloads.job_spec import job_spec
from chronotope.workloads.node_fit import job_rules
from chronotope.workloads.training import workers_that_fit
from tests.unit.workloads.test_backfill import busy_pod, node
from tests.unit.workloads.test_node_fit import A100
from tests.unit.workloads.test_pod_anti_affinity import _pod
from tests.unit.workloads.test_topology_spread import TRAINERS, ZONE, _spread, _spready

HOST = "kubernetes.io/hostname"


def _most(
    free: tuple[int, ...], counts: tuple[int, ...], zone: tuple[int, ...], skew: int, per: int
) -> int:
    """The most workers of `per` GPUs bound one after another under the rule (search)."""

    @cache
    def best(free: tuple[int, ...], counts: tuple[int, ...]) -> int:
        least = min(counts)
        out = 0
        for k, f in enumerate(free):
            d = zone[k]
            if f >= per and counts[d] + 1 - least <= skew:
                nf = (*free[:k], f - per, *free[k + 1 :])
                nc = (*counts[:d], counts[d] + 1, *counts[d + 1 :])
                out = max(out, 1 + best(nf, nc))
        return out

    return best(free, counts)


def _case(
    seed: int, key: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], tuple[Any, ...]]:
    """Random nodes, pods and a gang; and the search's view (free, counts, zone of each node)."""
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    zones = rng.randint(1, 3) if key == ZONE else n
    drawn = [k if key == HOST else rng.randrange(zones) for k in range(n)]
    named = {z: i for i, z in enumerate(dict.fromkeys(drawn))}  # only zones with a node count
    zone = tuple(named[z] for z in drawn)
    zones = len(named)
    nodes, pods = [], []
    free = []
    counts = [0] * zones
    for k in range(n):
        total = rng.randint(1, 4)
        busy = rng.randint(0, total) if rng.random() < 0.4 else 0
        spec = node(f"n{k}", A100, total)
        spec["metadata"]["labels"][ZONE] = f"z{zone[k]}"
        nodes.append(spec)
        if busy:
            pods.append(busy_pod(f"busy{k}", f"n{k}", busy))
        free.append(total - busy)
        for t in range(rng.choice((0, 0, 1, 2))):
            pods.append(_pod(f"t{k}-{t}", f"n{k}", {"app": "trainer"}))
            counts[zone[k]] += 1
    skew = rng.choice((1, 1, 2))
    per = rng.choice((1, 1, 2))
    job = _spready(f"g{seed}", replicas=8)
    job["spec"]["template"]["spec"] |= _spread(TRAINERS, key=key, skew=skew)
    job["spec"]["gpu"] = {"count": per}
    job["spec"]["gpuTypes"] = [{"name": A100, "relativeSpeed": 1.0}]
    return nodes, pods, job, (tuple(free), tuple(counts), zone, skew, per)


@pytest.mark.parametrize("key", [HOST, ZONE])
def test_the_plan_counts_what_kube_scheduler_binds_in_turn(key: str) -> None:
    for seed in range(150):
        nodes, pods, job, (free, counts, zone, skew, per) = _case(seed, key)
        most = _most(free, counts, zone, skew, per)
        spec = job_spec(job)
        rules = job_rules(spec)
        capacity = cluster_capacity(nodes, pods)
        seen = admitting(capacity, A100, rules, per)
        now = workers_that_fit(seen.nodes, per, spec.placement.strategy, True)
        assert now == most, (seed, free, counts, zone, skew, per, now, most)
        if not now:
            continue
        _, placed = take(capacity, A100, now, per, rules=rules, strategy=spec.placement.strategy)
        assert len(placed) == now, seed
        state = list(counts)
        for where, _ in placed:  # bound in the plan's order, each passes the filter
            d = zone[int(where[1:])]
            assert state[d] + 1 - min(state) <= skew, (seed, placed)
            state[d] += 1


def _most_of_two(
    free: tuple[int, ...], zone: tuple[int, ...], node_skew: int, zone_skew: int
) -> int:
    """`_most` for one-GPU workers under a spread per node and one per zone at once."""

    @cache
    def best(free: tuple[int, ...], nodes: tuple[int, ...], zones: tuple[int, ...]) -> int:
        out = 0
        for k, f in enumerate(free):
            d = zone[k]
            if (
                f
                and nodes[k] + 1 - min(nodes) <= node_skew
                and zones[d] + 1 - min(zones) <= zone_skew
            ):
                out = max(
                    out,
                    1
                    + best(
                        (*free[:k], f - 1, *free[k + 1 :]),
                        (*nodes[:k], nodes[k] + 1, *nodes[k + 1 :]),
                        (*zones[:d], zones[d] + 1, *zones[d + 1 :]),
                    ),
                )
        return out

    return best(free, (0,) * len(free), (0,) * (max(zone) + 1))


def test_a_spread_per_node_and_one_per_zone_never_count_more_than_binds() -> None:
    # both at once (the Kubernetes documentation's example): the zone's is counted in
    # levels, each node taking what the per-node one lets it at the least count. Never
    # more than any binding order places, and take's order binds; fewer where nodes
    # would take a second worker once every node runs one (not counted)
    exact = 0
    for seed in range(150):
        rng = random.Random(seed)
        n = rng.randint(2, 4)
        drawn = [rng.randrange(2) for _ in range(n)]
        named = {z: i for i, z in enumerate(dict.fromkeys(drawn))}
        zone = tuple(named[z] for z in drawn)
        free = tuple(rng.randint(1, 3) for _ in range(n))
        nodes = []
        for k in range(n):
            made = node(f"n{k}", A100, free[k])
            made["metadata"]["labels"][ZONE] = f"z{zone[k]}"
            nodes.append(made)
        node_skew, zone_skew = rng.choice((1, 2)), rng.choice((1, 2))
        job = _spready(f"g{seed}", replicas=8)
        job["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
            _spread(TRAINERS, key=HOST, skew=node_skew)["topologySpreadConstraints"][0],
            _spread(TRAINERS, key=ZONE, skew=zone_skew)["topologySpreadConstraints"][0],
        ]
        spec = job_spec(job)
        rules = job_rules(spec)
        capacity = cluster_capacity(nodes, [])
        now = workers_that_fit(
            admitting(capacity, A100, rules).nodes, 1, spec.placement.strategy, True
        )
        most = _most_of_two(free, zone, node_skew, zone_skew)
        assert now <= most, (seed, now, most)
        exact += now == most
        if not now:
            continue
        _, placed = take(capacity, A100, now, 1, rules=rules, strategy=spec.placement.strategy)
        per_node, per_zone = [0] * n, [0] * (max(zone) + 1)
        for where, _ in placed:
            k = int(where[1:])
            assert per_node[k] + 1 - min(per_node) <= node_skew, (seed, placed)
            assert per_zone[zone[k]] + 1 - min(per_zone) <= zone_skew, (seed, placed)
            per_node[k] += 1
            per_zone[zone[k]] += 1
    assert exact >= 40  # where one a node suffices: 45 of the 150 (both at the least: 8)
