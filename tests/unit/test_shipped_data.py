"""The data the product's own commands need ships in `data/` (data/README.md).

A fresh clone has no `../shared`: the commands' defaults must point into
`data/`, every file must be there, and each must be the published file,
unchanged (compared with `../shared/data/` when that is beside the checkout).
"""

from __future__ import annotations

import argparse
import filecmp
from pathlib import Path

import pytest
import yaml

from chronotope.cli import build_parser
from chronotope.paths import REPO_ROOT, data_dir
from chronotope.planners.profile import profile_to_data

SHARED = REPO_ROOT.parent / "shared" / "data"

# shipped path -> its path in the benchmark data set (None: made from it, see data/README.md)
SHIPPED: dict[str, str | None] = {
    "openb/openb_node_list_gpu_node.csv": "openb/openb_node_list_gpu_node.csv",
    "openb/openb_pod_list_default.csv": "openb/openb_pod_list_default.csv",
    "philly/philly.csv": "philly/philly.csv",
    "gavel/isolated_throughputs.json": None,
    "gavel/LICENSE": None,
    "sailor/OPT-350/A100-80/profile.json": "sailor/profiles/OPT-350/A100-80/profile.json",
    "sailor/OPT-350/GH-96/profile.json": "sailor/profiles/OPT-350/GH-96/profile.json",
    "sailor/OPT-350/V100-16/profile.json": "sailor/profiles/OPT-350/V100-16/profile.json",
    "sailor/OPT-350/training_config.json": "sailor/configs/training_config_opt_350.json",
    "sailor/LICENSE": "sailor/LICENSE",
    "azure-llm/AzureLLMInferenceTrace_conv.csv": "azure-llm/AzureLLMInferenceTrace_conv.csv",
    "orion/LICENSE": "orion/LICENSE",
}


def test_data_dir_is_the_repository_data_folder() -> None:
    assert data_dir() == REPO_ROOT / "data"


@pytest.mark.parametrize("rel", sorted(SHIPPED))
def test_every_shipped_file_is_there_and_unchanged(rel: str) -> None:
    path = data_dir() / rel
    assert path.is_file(), f"{path} is missing (data/README.md lists it)"
    assert rel.split("/", maxsplit=1)[0] in (data_dir() / "README.md").read_text()
    source = SHIPPED[rel]
    if source is not None and SHARED.is_dir():
        assert filecmp.cmp(path, SHARED / source, shallow=False), f"{rel} differs from {source}"


def test_orion_kernel_profiles_are_the_published_ones() -> None:
    ours = sorted(p.name for p in (data_dir() / "orion" / "model_kernels").iterdir())
    assert "resnet50_4_fwd" in ours
    if SHARED.is_dir():
        published = SHARED / "orion" / "model_kernels"
        assert ours == sorted(p.name for p in published.iterdir())
        for name in ours:
            shipped = data_dir() / "orion" / "model_kernels" / name
            assert filecmp.cmp(shipped, published / name, shallow=False), name


def _defaults(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args([*argv, "--out", "unused"])


def test_command_defaults_point_into_data() -> None:
    openb = _defaults("simulate", "openb")
    training = _defaults("simulate", "training", "--start", "x", "--end", "y", "--cluster", "c")
    variants = _defaults("simulate", "variants")
    colocation = _defaults("simulate", "colocation")
    defaults: list[Path] = [
        openb.nodes,
        *openb.pods,
        training.trace,
        training.throughputs,
        variants.trace,
        colocation.kernels,
    ]
    for path in defaults:
        assert path.is_relative_to(data_dir()), path
        assert path.exists(), path


def test_the_sample_profile_configmap_is_made_from_the_shipped_profile() -> None:
    sample = yaml.safe_load((REPO_ROOT / "manifests" / "profiles" / "opt-350.yaml").read_text())
    made = profile_to_data(
        data_dir() / "sailor" / "OPT-350",
        data_dir() / "sailor" / "OPT-350" / "training_config.json",
        {"A100-80": "A100-SXM4-80GB", "GH-96": "H100-SXM5-80GB", "V100-16": "V100-SXM2-32GB"},
    )
    assert made == sample["data"]


def test_the_readme_needs_nothing_beside_the_clone() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "../shared" not in readme
