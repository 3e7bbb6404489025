"""`chronotope replay openb` on a real control plane agrees with `chronotope simulate openb`.

The simulator and the real kube-scheduler + extender run the same policy on
the same arrivals (61 openb nodes, 506 arrivals of the default slice, seed 42):
the pods must land on the same nodes and the cluster must end as allocated.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from chronotope.cli import main
from tests.openb_fixture import NODES, PODS

pytestmark = pytest.mark.cluster


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.timeout(900)
def test_replay_places_pods_where_the_simulator_does(
    tmp_path: Path, cluster_settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    del cluster_settings  # the binaries are built (or found) by the session fixture
    monkeypatch.setenv("CHRONOTOPE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    common = ["--nodes", str(NODES), "--pods", str(PODS)]
    sim_dir, real_dir = tmp_path / "sim", tmp_path / "real"
    simulate = ["simulate", "openb", *common, "--policies", "chronotope", "--seeds", "42"]
    sim_out = ["--out", str(sim_dir), "--no-bound", "--placements", str(sim_dir / "p.csv")]
    assert main([*simulate, *sim_out]) == 0
    replay = ["replay", "openb", *common, "--policy", "chronotope", "--seed", "42"]
    assert main([*replay, "--out", str(real_dir)]) == 0
    sim, real = _rows(sim_dir / "p.csv"), _rows(real_dir / "placements.csv")
    assert [r["pod"] for r in sim] == [r["pod"] for r in real]
    same = sum(s["node"] == r["node"] for s, r in zip(sim, real, strict=True))
    assert same / len(sim) >= 0.97, f"{same} of {len(sim)} pods on the simulator's node"
    sim_summary = _rows(sim_dir / "summary.csv")[0]
    real_summary = _rows(real_dir / "summary.csv")[0]
    diff = abs(
        float(sim_summary["gpu_alloc_pct_final"]) - float(real_summary["gpu_alloc_pct_final"])
    )
    assert diff <= 0.3, (sim_summary, real_summary)
    assert int(real_summary["placed_pods"]) == sum(1 for r in real if r["node"])


@pytest.mark.timeout(600)
def test_a_partial_replay_writes_what_it_placed(
    tmp_path: Path, cluster_settings: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    del cluster_settings
    monkeypatch.setenv("CHRONOTOPE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    out = tmp_path / "partial"
    args = ["replay", "openb", "--nodes", str(NODES), "--pods", str(PODS), "--seed", "43"]
    assert main([*args, "--policy", "fgd", "--limit", "25", "--out", str(out)]) == 0
    rows = _rows(out / "placements.csv")
    assert len(rows) == 25
    summary = _rows(out / "summary.csv")[0]
    assert summary["gpu_alloc_pct_at_130"] == ""  # 25 pods never reach 130 % of demand
    assert int(summary["placed_pods"]) == sum(1 for r in rows if r["node"]) > 0
