"""The `chronotope` command line.

Each subcommand lives next to the code it drives and exposes
`add_parser(subparsers)`; this module only wires them together, so adding a
command never means editing a growing if-chain here. Command modules must be
cheap to import: heavy imports (ortools, kubernetes, matplotlib) happen inside
the handler.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

# Modules that contribute subcommands, in the order `--help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "chronotope.devcluster.cli",
    "chronotope.deviceplugin.cli",
    "chronotope.api.cli",
    "chronotope.extender.cli",
    "chronotope.controllers.cli",
    "chronotope.sim.cli",
    "chronotope.devcluster.replay",
    "chronotope.planners.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """The `chronotope` parser, with every subcommand from `COMMAND_MODULES`."""
    parser = argparse.ArgumentParser(
        prog="chronotope",
        description="Space-time, heterogeneity- and sharing-aware scheduling for GPU clusters.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv`, set up logging and run the chosen subcommand; returns its exit status.

    Without a subcommand it prints the help and returns 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    handler = getattr(args, "func", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    result = handler(args)
    return int(result or 0)
