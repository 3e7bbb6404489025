"""`chronotope replay openb`: the simulator's arrivals, placed by the real scheduler.

Brings up a local cluster whose kwok nodes are the trace's nodes (or uses
`$KUBECONFIG`), runs kube-scheduler with the Chronotope extender configured
like the simulator (policy, the trace's typical pods, the seed's tie order),
submits the arrivals of `simulate openb` for the seed one pod at a time, and
writes DIR/summary.csv (the simulator's columns plus `placed_pods`) and
DIR/placements.csv (`pod,node,gpus`), to compare with
`chronotope simulate openb --placements`.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chronotope.solver.model import ClusterSnapshot

__all__ = ["add_parser"]

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    """Register `replay openb` on the subcommand set `sub`."""
    replay = sub.add_parser(
        "replay", help="replay a trace on a real control plane through the real scheduler"
    )
    traces = replay.add_subparsers(dest="trace_kind", metavar="TRACE", required=True)
    p = traces.add_parser("openb", help="the Alibaba openb GPU-sharing trace (ATC'23)")
    p.add_argument("--nodes", type=Path, required=True, help="node list CSV")
    p.add_argument("--pods", type=Path, required=True, help="pod list CSV")
    p.add_argument("--policy", default="chronotope", help="the extender's online policy")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--tune-ratio", type=float, default=1.3, help="arrived demand / capacity")
    p.add_argument("--limit", type=int, help="submit only the first N arrivals")
    p.add_argument("--keep", action="store_true", help="leave the local cluster running")
    p.set_defaults(func=_handle)


def _handle(args: argparse.Namespace) -> int:

    from chronotope.sim.openb import load_nodes, load_pods, trace_name
    from chronotope.sim.replay import (
        arrivals_of,
        pod_manifest,
        score,
        tie_order,
        write_placements,
    )
    from chronotope.sim.runner import summary_row
    from chronotope.solver.online import POLICY_NAMES

    if args.policy not in POLICY_NAMES:
        print(f"error: unknown policy {args.policy!r}", file=sys.stderr)
        return 2
    snapshot = load_nodes(args.nodes)
    pods = load_pods(args.pods)
    arrivals = arrivals_of(snapshot, pods, args.seed, args.tune_ratio)
    if args.limit is not None:
        arrivals = arrivals[: args.limit]
    manifests = [pod_manifest(a) for a in arrivals]  # refuses what a pod cannot ask
    args.out.mkdir(parents=True, exist_ok=True)
    order_file = args.out / "tie-order.txt"
    order_file.write_text("\n".join(tie_order(snapshot, args.seed)) + "\n")
    extender_args = (
        "--policy",
        args.policy,
        "--typical-pods",
        str(args.pods.resolve()),
        "--tie-order",
        str(order_file.resolve()),
    )
    placed = _submit(args, snapshot, manifests, extender_args)
    write_placements(args.out / "placements.csv", arrivals, placed)
    result = score(
        snapshot, pods, args.seed, placed, tune_ratio=args.tune_ratio, policy=args.policy
    )
    row = summary_row(trace_name(args.pods), args.policy, args.seed, result)
    row["placed_pods"] = sum(p is not None for p in placed)
    _write_summary(args.out / "summary.csv", row)
    print(
        f"{row['placed_pods']} of {len(arrivals)} pods placed; "
        f"GPU allocation {row['gpu_alloc_pct_final']} %; written to {args.out}"
    )
    return 0


def _submit(
    args: argparse.Namespace,
    snapshot: ClusterSnapshot,
    manifests: list[dict[str, Any]],
    extender_args: tuple[str, ...],
) -> list[tuple[str, tuple[int, ...]] | None]:
    """Submit the manifests one at a time to `$KUBECONFIG`'s cluster or a local one."""
    from tqdm import tqdm

    from chronotope.devcluster.cluster import LocalCluster
    from chronotope.devcluster.settings import ClusterSettings
    from chronotope.kube.client import api_client
    from chronotope.kube.nodes import wait_nodes_untainted
    from chronotope.kube.replay import ensure_namespace, place_one
    from chronotope.sim.replay import cluster_spec

    cluster = None
    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig:
        print(
            "using $KUBECONFIG; its chronotope scheduler must run with: "
            f"chronotope scheduler {' '.join(extender_args)}"
        )
        config = Path(kubeconfig)
    else:
        cluster = LocalCluster(ClusterSettings.from_env(), "replay")
        spec = cluster_spec(snapshot)
        print(f"starting a local cluster with {spec.node_count} nodes ({spec.gpu_count} GPUs)")
        state = cluster.up(spec)
        cluster.start_chronotope_scheduler(extender_args=extender_args)
        config = state.kubeconfig
    namespace = f"replay-{args.seed}"
    placed: list[tuple[str, tuple[int, ...]] | None] = []
    try:
        with api_client(config) as api:
            # kube-scheduler skips nodes still tainted not-ready: wait for every node
            wait_nodes_untainted(api, {n.name for n in snapshot.nodes}, timeout=600)
            ensure_namespace(api, namespace)
            for manifest in tqdm(manifests, desc="replay", unit="pod"):
                placed.append(place_one(api, namespace, manifest))
    finally:
        if cluster is not None and not args.keep:
            cluster.down()
    return placed


def _write_summary(path: Path, row: dict[str, Any]) -> None:
    from chronotope.sim.cli import SUMMARY_COLUMNS

    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*SUMMARY_COLUMNS, "placed_pods"])
        writer.writeheader()
        writer.writerow(row)
