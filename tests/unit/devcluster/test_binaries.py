"""Missing binaries give a clear, actionable error instead of a stack trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from chronotope.devcluster.binaries import BinaryError, ensure_binaries
from chronotope.devcluster.settings import ClusterSettings


def test_missing_go_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    settings = ClusterSettings(cache_dir=tmp_path / "cache", state_root=tmp_path / "state")
    with pytest.raises(BinaryError, match="Go is not installed"):
        ensure_binaries(settings)


def test_bin_dir_without_binaries_names_them(tmp_path: Path) -> None:
    settings = ClusterSettings(cache_dir=tmp_path, state_root=tmp_path, bin_dir=tmp_path)
    with pytest.raises(BinaryError, match="kube-apiserver"):
        ensure_binaries(settings)
