"""`chronotope operator`: run the kopf controllers against a cluster."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register the `operator` subcommand on the subcommand set `sub`."""
    parser = sub.add_parser("operator", help="run the Chronotope controllers (kopf)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: in-cluster)")
    parser.add_argument(
        "--prometheus",
        default="http://127.0.0.1:9090",
        help="Prometheus base URL for InferencePipelines and ModelVariants whose traffic "
        "query names none",
    )
    parser.add_argument(
        "--dashboard-port",
        type=int,
        default=0,
        help="serve the read-only dashboard on this port (0: off)",
    )
    parser.add_argument("--dashboard-address", default="127.0.0.1", help="dashboard bind address")
    parser.add_argument(
        "--tuner-down-delay-s",
        type=float,
        default=60.0,
        help="an InferencePipeline stage scales down only this long after its last change",
    )
    parser.add_argument(
        "--variant-refresh-s",
        type=float,
        default=30.0,
        help="a ModelVariant serving group is re-planned on any change, else this often",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, help="seconds between reconciles of each job"
    )
    parser.add_argument(
        "--health-port", type=int, default=0, help="serve /healthz on this loopback port (0: off)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus /metrics on this port (0: off)",
    )
    parser.add_argument(
        "--metrics-address", default="0.0.0.0", help="address for /metrics (default: all)"
    )
    parser.add_argument(
        "--sync-timeout", type=float, default=60.0, help="seconds to wait for the first lists"
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import kopf

    from chronotope.controllers.inferencepipeline import TunerSettings
    from chronotope.controllers.metrics import OperatorMetrics
    from chronotope.controllers.modelvariant import GroupMemo
    from chronotope.controllers.operator import build_registry
    from chronotope.kube.client import connect
    from chronotope.kube.pipeline_ops import KubePipelineOps
    from chronotope.kube.store import OperatorCache
    from chronotope.kube.trainingjob_ops import KubeClusterOps
    from chronotope.kube.variant_ops import KubeVariantOps

    if args.kubeconfig:
        # kopf logs in through the kubernetes client, which reads KUBECONFIG (the edge
        # of the program is the one place that touches the environment)
        os.environ["KUBECONFIG"] = str(args.kubeconfig)
    api = connect(args.kubeconfig)
    cache = OperatorCache(api)
    if not cache.start(args.sync_timeout):
        logging.getLogger(__name__).error(
            "could not list nodes, pods and TrainingJobs within %.0fs", args.sync_timeout
        )
        return 1
    if args.dashboard_port:
        from chronotope.dashboard.server import serve_dashboard

        serve_dashboard(cache, args.dashboard_port, args.dashboard_address)
    metrics = OperatorMetrics(
        stale_after_s=max(30.0, 10 * args.interval),
        group_stale_after_s=max(120.0, 4 * args.variant_refresh_s),
    )
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    registry = build_registry(
        KubeClusterOps(api, cache),
        interval=args.interval,
        metrics=metrics,
        pipeline_ops=KubePipelineOps(api, cache, prometheus=args.prometheus),
        tuner=TunerSettings(down_delay_s=args.tuner_down_delay_s),
        variant_ops=KubeVariantOps(api, cache, prometheus=args.prometheus),
        memo=GroupMemo(refresh_s=args.variant_refresh_s),
    )
    logging.getLogger("kopf").setLevel(logging.WARNING)
    liveness = f"http://127.0.0.1:{args.health_port}/healthz" if args.health_port else None
    kopf.run(registry=registry, standalone=True, clusterwide=True, liveness_endpoint=liveness)
    return 0
