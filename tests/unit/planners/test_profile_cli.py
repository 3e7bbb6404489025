"""`chronotope profile configmap` / `plan` on the OPT-350M fixture (SAILOR profiles)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chronotope.cli import main
from chronotope.planners.profile import profile_from_data

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sailor" / "OPT-350"


def _configmap(capsys: pytest.CaptureFixture[str], *gpus: str) -> tuple[int, str, str]:
    args = ["profile", "configmap", "opt", "--from", str(FIXTURE)]
    args += ["--config", str(FIXTURE / "training_config.json"), "-n", "ml"]
    for gpu in gpus:
        args += ["--gpu", gpu]
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_configmap_renames_gpus_and_parses_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, out, _ = _configmap(capsys, "A100-40=A100-SXM4-40GB", "V100-16=V100-SXM2-16GB")
    assert rc == 0
    doc = yaml.safe_load(out)
    assert (doc["kind"], doc["metadata"]["name"], doc["metadata"]["namespace"]) == (
        "ConfigMap",
        "opt",
        "ml",
    )
    assert set(profile_from_data(doc["data"]).gpus) == {"A100-SXM4-40GB", "V100-SXM2-16GB"}

    path = tmp_path / "cm.yaml"
    path.write_text(out)
    assert main(["profile", "plan", str(path), "--nodes", "1x4xA100-SXM4-40GB:40"]) == 0
    assert '"gpu_type": "A100-SXM4-40GB"' in capsys.readouterr().out


def test_configmap_refuses_an_unknown_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _configmap(capsys, "H100-80=H100")
    assert rc == 1
    assert not out
    assert "H100-80" in err
