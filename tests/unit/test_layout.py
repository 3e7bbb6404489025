"""The source root must never become a package: `operator/__init__.py` would shadow the stdlib."""

from __future__ import annotations

import operator
from pathlib import Path

import chronotope
from chronotope.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_operator_source_root_has_no_init() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_stdlib_operator_is_not_shadowed() -> None:
    assert operator.add(2, 3) == 5
    assert not str(getattr(operator, "__file__", "")).startswith(str(ROOT / "operator"))


def test_package_lives_under_the_source_root() -> None:
    assert Path(chronotope.__file__).resolve().parent == ROOT / "operator" / "chronotope"


def test_cli_lists_dev_cluster_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["dev", "cluster", "up", "--name", "x"])
    assert args.name == "x"
    assert callable(args.func)
