"""The replay's pure side: pods as the trace asks, the simulator's tie order, the same scoring."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from chronotope.cli import main
from chronotope.sim.clusterspec import node_manifests
from chronotope.sim.engine import reference_rank, simulate
from chronotope.sim.openb import load_nodes, load_pods
from chronotope.sim.replay import (
    Arrival,
    arrivals_of,
    cluster_spec,
    pod_manifest,
    score,
    simulated_placements,
    tie_order,
)
from chronotope.solver.model import PodRequest
from chronotope.solver.online import make_policy
from chronotope.solver.policies import Choice
from tests.openb_fixture import NODES, PODS


def test_kwok_nodes_are_the_trace_nodes() -> None:
    snapshot = load_nodes(NODES)
    manifests = {m["metadata"]["name"]: m for m in node_manifests(cluster_spec(snapshot))}
    assert set(manifests) == {n.name for n in snapshot.nodes}
    for node in snapshot.nodes:
        alloc = manifests[node.name]["status"]["allocatable"]
        assert alloc["cpu"] == f"{node.cpu_milli}m"
        assert alloc["memory"] == f"{node.memory_mib}Mi"
        assert alloc.get("nvidia.com/gpu", "0") == str(len(node.gpus))


@pytest.mark.parametrize(
    ("request_", "limits", "annotations"),
    [
        pytest.param(
            PodRequest(name="s", cpu_milli=4000, memory_mib=100, num_gpus=1, gpu_milli=460),
            {"chronotope.dev/gpu-share": "1"},
            {"chronotope.dev/gpu-compute-percent": "46", "chronotope.dev/gpu-memory-mib": "1"},
            id="share",
        ),
        pytest.param(
            PodRequest(name="w", cpu_milli=8000, num_gpus=2, gpu_milli=1000, gpu_models=("T4",)),
            {"nvidia.com/gpu": "2"},
            {"chronotope.dev/gpu-models": "T4"},
            id="whole-with-model",
        ),
        pytest.param(PodRequest(name="c", cpu_milli=500), {}, {}, id="cpu-only"),
    ],
)
def test_pods_ask_what_the_trace_asks(
    request_: PodRequest, limits: dict[str, str], annotations: dict[str, str]
) -> None:
    pod = pod_manifest(Arrival(3, request_))
    assert pod["metadata"]["name"] == f"a00003-{request_.name}"
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {
        "cpu": f"{request_.cpu_milli}m",
        "memory": f"{request_.memory_mib}Mi",
    }
    assert resources["limits"] == resources["requests"] | limits
    assert pod["metadata"]["annotations"] == annotations
    assert pod["spec"]["schedulerName"] == "chronotope"


def test_a_share_that_is_no_whole_percentage_is_refused() -> None:
    with pytest.raises(ValueError, match="not a whole GPU percentage"):
        pod_manifest(Arrival(0, PodRequest(name="x", num_gpus=1, gpu_milli=125)))


def test_tie_order_is_the_simulators_rank() -> None:
    snapshot = load_nodes(NODES)
    order = tie_order(snapshot, 44)
    rank = reference_rank(len(snapshot.nodes), np.random.default_rng([44, 7]))
    position = {name: i for i, name in enumerate(order)}
    by_rank = sorted(range(len(snapshot.nodes)), key=lambda i: rank[i])
    assert [position[snapshot.nodes[i].name] for i in by_rank] == list(range(len(order)))


def test_scoring_the_simulators_placements_gives_the_simulators_figures() -> None:
    snapshot, pods = load_nodes(NODES), load_pods(PODS)
    choices: list[Choice | None] = []
    sim = simulate(snapshot, pods, make_policy("chronotope"), 43, placements=choices)
    replayed = score(snapshot, pods, 43, simulated_placements(snapshot, choices))
    assert replayed.failed == sim.failed
    np.testing.assert_array_equal(replayed.used, sim.used)
    np.testing.assert_allclose(replayed.frag, sim.frag)
    assert replayed.alloc_pct_final() == sim.alloc_pct_final()
    assert len(arrivals_of(snapshot, pods, 43)) == len(choices)


def test_simulate_writes_placements_for_one_run(tmp_path: Path) -> None:
    out = tmp_path / "placements.csv"
    args = ["simulate", "openb", "--nodes", str(NODES), "--pods", str(PODS)]
    args += ["--policies", "fgd", "--seeds", "42", "--out", str(tmp_path), "--no-bound"]
    assert main([*args, "--placements", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows[0].keys() == {"pod", "node", "gpus"}
    assert rows[0]["pod"].startswith("a00000-openb-pod-")
    summary = next(csv.DictReader((tmp_path / "summary.csv").open()))
    placed = sum(1 for r in rows if r["node"])
    assert len(rows) - placed == int(summary["failed_pods"])
    two = [a if a != "fgd" else "fgd,chronotope" for a in args]
    with pytest.raises(SystemExit, match="exactly one"):
        main([*two, "--placements", str(out)])
