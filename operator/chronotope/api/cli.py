"""`chronotope gen-crds` and `chronotope gen-api-docs`: regenerate or drift-check API artefacts.

Both write files derived from the models (`crds/`, `docs/api.md`); `--check`
writes nothing, prints a diff and exits 1 when the committed files differ, for
CI. Imports of the models happen inside the handlers, to keep `--help` fast.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register `gen-crds` and `gen-api-docs` on the subcommand set `sub`."""
    crds = sub.add_parser("gen-crds", help="generate the CRDs in crds/ from the API models")
    crds.add_argument("--output", type=Path, default=Path("crds"), help="directory (default: crds)")
    crds.add_argument("--check", action="store_true", help="exit 1 with a diff if files differ")
    crds.set_defaults(func=_gen_crds)

    docs = sub.add_parser("gen-api-docs", help="generate docs/api.md from the API models")
    docs.add_argument(
        "--output", type=Path, default=Path("docs/api.md"), help="file (default: docs/api.md)"
    )
    docs.add_argument(
        "--samples", type=Path, default=Path("manifests/samples"), help="samples to embed"
    )
    docs.add_argument("--check", action="store_true", help="exit 1 with a diff if the file differs")
    docs.set_defaults(func=_gen_docs)


def _gen_crds(args: argparse.Namespace) -> int:
    from chronotope.api.crd import drift, write_all

    if args.check:
        diff = drift(args.output)
        if diff:
            sys.stdout.write(diff)
            print(f"{args.output} is stale: run `chronotope gen-crds`", file=sys.stderr)
            return 1
        return 0
    for path in write_all(args.output):
        print(f"wrote {path}")
    return 0


def _gen_docs(args: argparse.Namespace) -> int:
    from chronotope.api.docs import render_api_docs

    text = render_api_docs(args.samples)
    current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
    if args.check:
        if current == text:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{args.output} (committed)",
                tofile=f"{args.output} (generated)",
            )
        )
        print(f"{args.output} is stale: run `chronotope gen-api-docs`", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0
