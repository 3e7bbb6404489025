"""`chronotope simulate openb`: replay openb traces with online policies.

Writes DIR/summary.csv (one row per trace, policy and seed, the columns of
the FGD artifact's published results), DIR/bounds.csv (the LP upper bounds
per trace and seed: offline pooled, offline per-GPU and protocol-aware; see
`sim.bound`) and DIR/allocation.png; `--bound-only` writes bounds.csv alone.
Heavy imports happen in the handler so `chronotope --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from chronotope.paths import data_file

__all__ = ["POLICIES", "SUMMARY_COLUMNS", "add_parser", "parse_seeds"]

POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "chronotope")
SUMMARY_COLUMNS = (
    "trace",
    "policy",
    "seed",
    "gpu_alloc_pct_at_100",
    "gpu_alloc_pct_at_130",
    "unalloc_gpus_at_130",
    "frag_amount_pct_at_100",
    "frag_ratio_pct_at_100",
    "failed_pods",
    "gpu_alloc_pct_final",
)


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,45,50' or a mix of both."""
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def add_parser(subparsers: Any) -> None:
    """Register `simulate openb`, `training`, `inference` and `variants` on `subparsers`."""
    sim = subparsers.add_parser("simulate", help="replay a GPU trace with online policies")
    traces = sim.add_subparsers(dest="trace_kind", metavar="TRACE")
    # `simulate training` is defined in chronotope.sim.training_cli
    from chronotope.sim import training_cli

    training_cli.add_parser(traces)
    from chronotope.sim import inference_cli

    inference_cli.add_parser(traces)
    from chronotope.sim import serving_cli

    serving_cli.add_parser(traces)
    from chronotope.sim import colocation_cli

    colocation_cli.add_parser(traces)
    p = traces.add_parser("openb", help="the Alibaba openb GPU-sharing trace (ATC'23)")
    p.add_argument(
        "--nodes",
        type=Path,
        default=data_file("openb", "openb_node_list_gpu_node.csv"),
        help="node list CSV (default: the openb GPU nodes in data/openb/)",
    )
    p.add_argument(
        "--pods",
        type=Path,
        nargs="+",
        default=[data_file("openb", "openb_pod_list_default.csv")],
        help="pod list CSV(s) (default: the openb `default` trace in data/openb/)",
    )
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated; also 'batched' (not an online policy: windows of 64 arrivals "
        "placed jointly with CP-SAT where the online policy fails a pod; a separate row)",
    )
    p.add_argument("--seeds", default="42-51", help="e.g. 42-51")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--tune-ratio", type=float, default=1.3, help="arrived demand / capacity")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--no-bound", action="store_true", help="skip the LP upper bounds")
    p.add_argument(
        "--bound-only", action="store_true", help="only the LP upper bounds (bounds.csv), no runs"
    )
    p.add_argument(
        "--bucket-pct",
        type=float,
        default=5.0,
        help="arrival bucket of the protocol-aware LP bound, in %% of GPU capacity",
    )
    p.add_argument(
        "--placements",
        type=Path,
        help="also write this placements.csv (pod,node,gpus) for the one trace, policy and "
        "seed given (compare with `chronotope replay openb`)",
    )
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:
    from chronotope.sim.runner import BATCHED, RunSpec, run_all

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.bound_only:
        if args.no_bound:
            raise SystemExit("--bound-only and --no-bound exclude each other")
        policies = []
    known = (*POLICIES, BATCHED)
    unknown = sorted(set(policies) - set(known))
    if unknown:
        raise SystemExit(f"unknown policies: {', '.join(unknown)} (known: {', '.join(known)})")
    spec = RunSpec(
        nodes=args.nodes,
        pods=tuple(args.pods),
        policies=tuple(policies),
        seeds=tuple(parse_seeds(args.seeds)),
        out=args.out,
        tune_ratio=args.tune_ratio,
        jobs=max(1, args.jobs),
        bound=not args.no_bound,
        bucket_pct=args.bucket_pct,
    )
    if args.placements is not None:
        if len(spec.pods) != 1 or len(policies) != 1 or len(spec.seeds) != 1:
            raise SystemExit("--placements needs exactly one pod list, one policy and one seed")
        if policies[0] == BATCHED:
            raise SystemExit("--placements is for online policies, not 'batched'")
    run_all(spec)
    if args.placements is not None:
        from chronotope.sim.runner import write_simulated_placements

        write_simulated_placements(
            spec.nodes,
            spec.pods[0],
            policies[0],
            spec.seeds[0],
            tune_ratio=spec.tune_ratio,
            out=args.placements,
        )
    return 0
