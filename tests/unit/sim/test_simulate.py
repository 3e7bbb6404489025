"""Trace simulator on a small openb slice (tests/fixtures/openb, see its README)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from chronotope.cli import main
from chronotope.sim.bound import allocation_upper_bound
from chronotope.sim.cli import SUMMARY_COLUMNS, parse_seeds
from chronotope.sim.engine import arrivals, simulate
from chronotope.sim.openb import load_nodes, load_pods, trace_name
from chronotope.sim.runner import make_policy

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "openb"
NODES = FIX / "openb_node_list_gpu_node_slice.csv"
PODS = FIX / "openb_pod_list_default_slice.csv"


def test_parse_seeds_and_trace_name() -> None:
    assert parse_seeds("42-44,50") == [42, 43, 44, 50]
    assert trace_name(Path("x/openb_pod_list_gpushare40.csv")) == "gpushare40"


def test_arrivals_reach_the_tuned_demand_and_depend_only_on_the_seed() -> None:
    cluster = load_nodes(NODES)
    pods = load_pods(PODS)
    total = sum(len(n.gpus) for n in cluster.nodes) * 1000
    order = arrivals(pods, total, 42, 1.3)
    assert order == arrivals(pods, total, 42, 1.3)
    demand = sum(pods[i].total_gpu_milli for i in order)
    assert 1.2 * total < demand <= 1.3 * total + 8000


@pytest.mark.parametrize("policy", ["random", "bestfit", "gpupacking", "fgd", "chronotope"])
def test_runs_stay_within_capacity(policy: str) -> None:
    cluster = load_nodes(NODES)
    pods = load_pods(PODS)
    res = simulate(cluster, pods, make_policy(policy), 42)
    assert (res.used <= res.total_milli).all()
    assert 50 < res.alloc_pct_at(130) <= 100
    total = res.total_milli
    bound = allocation_upper_bound(cluster, [pods[i] for i in arrivals(pods, total, 42, 1.3)])
    assert res.alloc_pct_at(130) <= bound + 1e-6


def test_cli_writes_summary_and_plot(tmp_path: Path) -> None:
    code = main(
        [
            "simulate", "openb", "--nodes", str(NODES), "--pods", str(PODS),
            "--policies", "bestfit,fgd", "--seeds", "42", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert code == 0
    with (tmp_path / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == SUMMARY_COLUMNS
    assert {r["policy"] for r in rows} == {"bestfit", "fgd"}
    assert (tmp_path / "allocation.png").stat().st_size > 0
