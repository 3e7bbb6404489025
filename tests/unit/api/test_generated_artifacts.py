"""The committed CRDs and docs/api.md are exactly what the models generate (drift check)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chronotope.api.crd import drift, render_all
from chronotope.api.docs import render_api_docs
from chronotope.cli import main

REPO_ROOT = Path(__file__).resolve().parents[3]
CRDS = REPO_ROOT / "crds"
DOCS = REPO_ROOT / "docs" / "api.md"
SAMPLES = REPO_ROOT / "manifests" / "samples"


def test_committed_crds_match_the_models() -> None:
    diff = drift(CRDS)
    assert not diff, f"crds/ is stale; run `chronotope gen-crds`:\n{diff}"


def test_committed_api_docs_match_the_models() -> None:
    expected = render_api_docs(SAMPLES.relative_to(REPO_ROOT))
    assert DOCS.read_text(encoding="utf-8") == expected, "run `chronotope gen-api-docs`"


def test_gen_crds_check_fails_on_drift_and_writes_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "crds"
    shutil.copytree(CRDS, out)
    assert main(["gen-crds", "--check", "--output", str(out)]) == 0
    victim = next(iter(render_all()))
    (out / victim).write_text((out / victim).read_text().replace("minimum: 1", "minimum: 2"))
    assert main(["gen-crds", "--check", "--output", str(out)]) == 1
    assert "(generated)" in capsys.readouterr().out
    assert main(["gen-crds", "--output", str(out)]) == 0
    assert not drift(out)


def test_gen_crds_check_reports_missing_and_stale_files(tmp_path: Path) -> None:
    (tmp_path / "chronotope.dev_gadgets.yaml").write_text("kind: Gadget\n")
    diff = drift(tmp_path)
    assert "stale file" in diff
    assert "chronotope.dev_trainingjobs.yaml" in diff


def test_gen_api_docs_check(tmp_path: Path) -> None:
    target = tmp_path / "api.md"
    args = ["gen-api-docs", "--output", str(target), "--samples", str(SAMPLES)]
    assert main([*args, "--check"]) == 1
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
