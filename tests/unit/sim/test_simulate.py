"""Trace simulator on a small openb slice (tests/fixtures/openb, see its README)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from chronotope.cli import main
from chronotope.sim.bound import (
    allocation_upper_bound,
    dominates,
    maximal_patterns,
    pattern_upper_bound,
    protocol_upper_bound,
)
from chronotope.sim.cli import SUMMARY_COLUMNS, parse_seeds
from chronotope.sim.engine import arrivals, simulate
from chronotope.sim.openb import load_nodes, load_pods, trace_name
from chronotope.sim.runner import make_policy
from tests.openb_fixture import NODES, PODS


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
    arrived = [pods[i] for i in arrivals(pods, total, 42, 1.3)]
    pooled = allocation_upper_bound(cluster, arrived)
    per_gpu = pattern_upper_bound(cluster, arrived)
    protocol = protocol_upper_bound(cluster, arrived)
    assert res.alloc_pct_at(130) <= protocol + 1e-6 <= per_gpu + 2e-6 <= pooled + 3e-6


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


def test_cli_bound_only_writes_the_bounds(tmp_path: Path) -> None:
    code = main(
        [
            "simulate", "openb", "--nodes", str(NODES), "--pods", str(PODS),
            "--seeds", "42", "--out", str(tmp_path), "--bound-only",
        ]
    )  # fmt: skip
    assert code == 0
    assert not (tmp_path / "summary.csv").exists()
    with (tmp_path / "bounds.csv").open() as fh:
        (row,) = list(csv.DictReader(fh))
    protocol, per_gpu = float(row["protocol_lp_pct"]), float(row["offline_lp_per_gpu_pct"])
    assert float(row["upper_bound_pct_at_130"]) == protocol <= per_gpu


def test_maximal_patterns_are_maximal_and_fit_one_gpu() -> None:
    pats = maximal_patterns([810, 470, 320, 160])
    assert pats
    for pat in pats:
        used = sum(size * k for size, k in pat.items())
        assert used <= 1000
        assert all(size > 1000 - used for size in (810, 470, 320, 160))
    assert {810: 1, 160: 1} in pats


def test_per_gpu_bound_sees_that_shares_do_not_pair() -> None:
    # Two 1-GPU nodes and three 600m shares: the pooled LP packs 1,800 of 2,000
    # milli; per GPU only one 600m share fits, so at most 1,200 (60 %).
    from chronotope.solver.model import ClusterSnapshot, Gpu, Node, PodRequest

    cluster = ClusterSnapshot(
        nodes=tuple(
            Node(name=f"n{i}", cpu_milli=8000, memory_mib=8192, gpus=(Gpu(index=0, model="T4"),))
            for i in range(2)
        )
    )
    pods = [PodRequest(name=f"p{i}", num_gpus=1, gpu_milli=600) for i in range(3)]
    assert allocation_upper_bound(cluster, pods) == pytest.approx(90.0)
    assert pattern_upper_bound(cluster, pods) == pytest.approx(60.0)


def test_protocol_bound_keeps_a_share_that_had_to_be_placed() -> None:
    # Two 1-GPU nodes; an 810m share arrives first, then two whole-GPU pods that
    # need more CPU. Offline one drops the share and takes both (100 %). Online
    # the share fits, so it is placed, and a later whole pod can only be placed
    # if the share could have been: a[whole] <= a[share] for later pods. The LP
    # then takes the share x = 2/3 and wholes 2x = 4/3 GPUs (GPU: x + 2x <= 2),
    # 1,873 of 2,000 milli; the protocol itself reaches 1,810.
    from chronotope.solver.model import ClusterSnapshot, Gpu, Node, PodRequest

    cluster = ClusterSnapshot(
        nodes=tuple(
            Node(name=f"n{i}", cpu_milli=8000, memory_mib=8192, gpus=(Gpu(index=0, model="T4"),))
            for i in range(2)
        )
    )
    share = PodRequest(name="s", cpu_milli=1000, memory_mib=1024, num_gpus=1, gpu_milli=810)
    whole = [
        PodRequest(name=f"w{i}", cpu_milli=2000, memory_mib=2048, num_gpus=1, gpu_milli=1000)
        for i in range(2)
    ]
    arrived = [share, *whole]
    assert pattern_upper_bound(cluster, arrived) == pytest.approx(100.0)
    assert protocol_upper_bound(cluster, arrived) == pytest.approx(100 * (540 + 4000 / 3) / 2000)
    # And the protocol itself, in this order, with any policy:
    from chronotope.solver.policies import Context
    from chronotope.solver.state import ClusterState

    state = ClusterState.from_snapshot(cluster)
    ctx = Context(state=state, frag=None, rng=np.random.default_rng(0))
    for pod in arrived:
        spec = state.spec(pod)
        cand = state.feasible(spec)
        if len(cand):
            node, gpus = make_policy("bestfit").choose(ctx, spec, cand)
            state.assign(node, spec, gpus)
    assert state.total_gpu_milli - int(state.total_left.sum()) == 1810


def test_dominance_needs_every_resource_and_a_subset_of_models() -> None:
    share = (1000, 1024, 1, 810, ())
    assert dominates((2000, 2048, 1, 1000, ()), share)
    assert dominates((1000, 1024, 2, 1000, ("T4",)), share)
    assert not dominates((500, 2048, 1, 1000, ()), share)  # less CPU
    assert not dominates((2000, 2048, 1, 500, ()), share)  # smaller share
    assert not dominates((2000, 2048, 1, 1000, ()), (1000, 1024, 1, 810, ("T4",)))  # any model


def test_merge_dirs_joins_split_runs(tmp_path: Path) -> None:
    from chronotope.sim.runner import CURVE_POINTS, merge_dirs

    def write(d: Path, policy: str, alloc: float) -> None:
        d.mkdir()
        row = dict.fromkeys(SUMMARY_COLUMNS, "0")
        row |= {"trace": "default", "policy": policy, "seed": "42"}
        row["gpu_alloc_pct_at_130"] = str(alloc)
        with (d / "summary.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(SUMMARY_COLUMNS))
            w.writeheader()
            w.writerow(row)
        with (d / "curves.csv").open("w", newline="") as fh:
            cw = csv.writer(fh)
            cw.writerow(["trace", "policy", "seed", *(f"alloc_at_{p}" for p in CURVE_POINTS)])
            cw.writerow(["default", policy, "42", *(min(p, alloc) for p in CURVE_POINTS)])

    write(tmp_path / "a", "fgd", 95.4)
    write(tmp_path / "b", "chronotope", 95.5)
    bound_only = tmp_path / "c"  # as `simulate openb --bound-only` leaves it
    bound_only.mkdir()
    (bound_only / "bounds.csv").write_text(
        "trace,seed,protocol_lp_pct,upper_bound_pct_at_130\ndefault,42,96.6,96.6\n"
    )
    merge_dirs(tmp_path / "out", [tmp_path / "a", tmp_path / "b", bound_only])
    with (tmp_path / "out" / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["policy"] for r in rows] == ["chronotope", "fgd"]
    assert tuple(rows[0]) == SUMMARY_COLUMNS
    assert "96.6" in (tmp_path / "out" / "bounds.csv").read_text()
    assert (tmp_path / "out" / "allocation.png").stat().st_size > 0
