"""`chronotope profile configmap` and `chronotope profile plan`: model profiles for the cluster.

A TrainingJob that names `spec.parallelism.modelProfile: NAME` is planned
from the ConfigMap NAME in its namespace: `config.json` (the model's training
config) plus `profile-<GPU product>.json` (SAILOR layer times) per GPU type.
`configmap` builds that ConfigMap from a SAILOR profile directory, renaming
SAILOR's GPU names to the cluster's `nvidia.com/gpu.product` values, and
prints it as YAML for `kubectl apply -f -`. `plan` runs the elastic planner
on a profile for a given set of GPUs, to see what the operator would choose.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register `profile configmap` and `profile plan` on the subcommand set `sub`."""
    profile = sub.add_parser("profile", help="model profiles for the elastic planner")
    psub = profile.add_subparsers(dest="profile_command", metavar="SUBCOMMAND", required=True)

    cm = psub.add_parser(
        "configmap", help="print a model-profile ConfigMap built from a SAILOR profile directory"
    )
    cm.add_argument("name", help="ConfigMap name (the TrainingJob's parallelism.modelProfile)")
    cm.add_argument(
        "--from",
        dest="source",
        type=Path,
        required=True,
        help="SAILOR profile directory: <GPU>/profile.json per GPU type",
    )
    cm.add_argument("--config", type=Path, required=True, help="the model's training config JSON")
    cm.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="SAILOR=PRODUCT",
        required=True,
        help="map a profiled GPU (e.g. A100-80) to a node's nvidia.com/gpu.product; repeatable",
    )
    cm.add_argument("--namespace", "-n", default=None, help="namespace to put in the manifest")
    cm.set_defaults(func=_configmap)

    plan = psub.add_parser("plan", help="plan a model-profile ConfigMap on a set of GPUs")
    plan.add_argument("file", type=Path, help="the ConfigMap YAML (from `profile configmap`)")
    plan.add_argument(
        "--nodes",
        action="append",
        default=[],
        required=True,
        metavar="COUNTxGPUSxPRODUCT:MEMORY_GIB",
        help="e.g. 2x8xA100-SXM4-80GB:80 (2 nodes of 8 GPUs); repeatable",
    )
    plan.add_argument(
        "--objective", choices=["throughput", "throughput_per_dollar"], default="throughput"
    )
    plan.add_argument(
        "--price", action="append", default=[], metavar="PRODUCT=PER_GPU_HOUR", help="repeatable"
    )
    plan.set_defaults(func=_plan)


def _configmap(args: argparse.Namespace) -> int:
    import yaml

    from chronotope.planners.profile import profile_from_data, profile_to_data

    names: dict[str, str] = {}
    for item in args.gpu:
        sailor, sep, product = item.partition("=")
        if not sep or not sailor or not product:
            print(f"--gpu {item!r}: expected SAILOR=PRODUCT, e.g. A100-80=A100-SXM4-80GB")
            return 2
        names[sailor] = product
    try:
        data = profile_to_data(args.source, args.config, names)
        profile_from_data(data, source=args.name)  # refuse to print something unusable
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    meta: dict[str, Any] = {
        "name": args.name,
        "labels": {"chronotope.dev/model-profile": "true"},
    }
    if args.namespace:
        meta["namespace"] = args.namespace
    manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
    sys.stdout.write(yaml.safe_dump(manifest, sort_keys=False, width=1_000_000))
    return 0


def _plan(args: argparse.Namespace) -> int:
    import yaml

    from chronotope.planners.elastic import PlannerSettings, plan_elastic
    from chronotope.planners.profile import profile_from_data
    from chronotope.solver.model import Node

    doc = yaml.safe_load(args.file.read_text())
    profile = profile_from_data(doc.get("data") or {}, source=str(args.file))
    nodes = []
    for spec in args.nodes:
        shape, _, memory = spec.partition(":")
        count, gpus, product = shape.split("x", 2)
        for i in range(int(count)):
            nodes.append(
                Node.with_gpus(
                    f"{product}-{i}",
                    product,
                    int(gpus),
                    gpu_memory_mib=int(float(memory) * 1024),
                )
            )
    prices = {k: float(v) for k, _, v in (p.partition("=") for p in args.price)}
    settings = PlannerSettings(prices_per_gpu_hour=prices)
    result = plan_elastic(profile, nodes, settings, objective=args.objective)
    if result.plan is None:
        print("no plan: " + "; ".join(result.reasons))
        return 1
    print(result.plan.model_dump_json(indent=2))
    for reason in result.reasons:
        print(f"note: {reason}")
    return 0
