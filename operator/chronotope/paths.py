"""Where the files shipped beside the package live: the repository root and `data/`.

The one place that knows the source layout (`operator/chronotope/` under the
repository root). A container image or another install that puts `data/`
elsewhere sets CHRONOTOPE_DATA_DIR.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO_ROOT", "data_dir", "data_file"]

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository root when running from a checkout (`operator/` is its source root)."""


def data_dir() -> Path:
    """The shipped data directory (data/README.md): CHRONOTOPE_DATA_DIR, else REPO_ROOT/data."""
    override = os.environ.get("CHRONOTOPE_DATA_DIR")
    return Path(override) if override else REPO_ROOT / "data"


def data_file(*parts: str) -> Path:
    """A path under the shipped data directory, e.g. `data_file("philly", "philly.csv")`."""
    return data_dir().joinpath(*parts)
