"""Paths of the openb fixture slices (tests/fixtures/openb, see its README)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FIXTURES", "NODES", "PODS"]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "openb"
NODES = FIXTURES / "openb_node_list_gpu_node_slice.csv"
"""Every 20th GPU node of openb (61 nodes)."""
PODS = FIXTURES / "openb_pod_list_default_slice.csv"
