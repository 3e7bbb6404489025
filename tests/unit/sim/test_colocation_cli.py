"""`chronotope simulate colocation` on tiny profiles in Orion's format (written by the test)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from chronotope.cli import main

HEADER = "Name,Profile,Memory_footprint,SM_usage,Duration\n"


def _kernels(root: Path) -> Path:
    root.mkdir()
    (root / "net_4_fwd").write_text(HEADER + "Conv,1,0,98,100000\nBN,0,0,64,40000\n" * 5)
    (root / "net_32_fb1").write_text(HEADER + "Conv,1,0,400,200000\nBN,0,0,300,80000\n" * 8)
    (root / "net_32_fb0").write_text(HEADER + "k,-1,1,1,7\n")  # Orion's placeholder
    return root


def test_summary_has_one_row_per_policy_and_refuses_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "simulate",
            "colocation",
            "--kernels",
            str(_kernels(tmp_path / "k")),
            "--requests",
            "30",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = {r["policy"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert list(rows) == ["exclusive", "packing", "orion", "chronotope", "chronotope-gated"]
    assert rows["exclusive"]["gpus_used"] == "3"  # 2 HP copies + 1 BE, one GPU each
    assert float(rows["exclusive"]["hp_p99_slowdown_max"]) == 1.0
    assert float(rows["packing"]["hp_p99_slowdown_max"]) > 1.0
    assert rows["packing"]["pairs"] == "1"
    assert (out / "slowdown.png").stat().st_size > 0
    assert "skipped net_32_fb0" in capsys.readouterr().out


def test_an_impossible_budget_is_an_error(tmp_path: Path) -> None:
    code = main(
        [
            "simulate",
            "colocation",
            "--kernels",
            str(_kernels(tmp_path / "k")),
            "--budget",
            "0.9",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
