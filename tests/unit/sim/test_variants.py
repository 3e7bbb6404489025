"""Resampled workloads: the asked mix, real request shapes, reproducible from the seed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from chronotope.sim.openb import load_pods
from chronotope.sim.variants import kind_of, parse_mix, resample, write_pods
from tests.openb_fixture import PODS


def test_resampling_follows_the_mix_with_the_traces_own_shapes(tmp_path: Path) -> None:
    pods = load_pods(PODS)
    out = resample(pods, {"cpu": 0.3, "share": 0.2}, seed=5, count=1000)
    kinds = Counter(kind_of(p) for p in out)
    assert kinds["cpu"] == 300
    assert kinds["share"] == 200
    base = Counter(kind_of(p) for p in pods)
    # the kinds not asked for keep their relative weight in the rest
    assert abs(kinds["single"] / kinds["multi"] - base["single"] / base["multi"]) < 0.2 * (
        base["single"] / base["multi"]
    )
    shapes = {(p.cpu_milli, p.memory_mib, p.num_gpus, p.gpu_milli) for p in pods}
    assert all((p.cpu_milli, p.memory_mib, p.num_gpus, p.gpu_milli) in shapes for p in out)
    assert resample(pods, {"cpu": 0.3, "share": 0.2}, seed=5, count=1000) == out
    path = tmp_path / "openb_pod_list_x.csv"
    write_pods(path, out)
    assert load_pods(path) == out


@pytest.mark.parametrize("text", ["gpu=0.2", "cpu=0.8,share=0.5", "cpu=-0.1"])
def test_bad_mixes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"kind|fractions"):
        parse_mix(text)
