"""`chronotope dev cluster up|down|status` and `chronotope dev nodes`: the local cluster tool."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]

log = logging.getLogger(__name__)

_DEFAULT_SPEC = "manifests/clusters/demo.yaml"


def add_parser(sub: Any) -> None:
    """Register `dev` (cluster up/down/status, build, nodes) on the subcommand set `sub`."""
    dev = sub.add_parser(
        "dev", help="local development cluster (real control plane + kwok GPU nodes)"
    )
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="SUBCOMMAND", required=True)

    cluster = dev_sub.add_parser("cluster", help="bring a local cluster up or down")
    csub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)

    up = csub.add_parser("up", help="build or reuse the binaries, start the cluster, add nodes")
    _name(up)
    up.add_argument("--spec", type=Path, help=f"cluster spec YAML (e.g. {_DEFAULT_SPEC})")
    up.add_argument("--port", type=int, help="kube-apiserver port (default: a free one)")
    up.add_argument(
        "--with-scheduler",
        action="store_true",
        help="also run the Chronotope extender and its kube-scheduler (schedulerName: chronotope)",
    )
    up.add_argument(
        "--with-operator",
        action="store_true",
        help="also install the CRDs and run the Chronotope controllers",
    )
    up.add_argument(
        "--dashboard-port",
        type=int,
        default=0,
        help="with --with-operator: serve the operator's dashboard on 127.0.0.1:PORT",
    )
    up.add_argument(
        "--chart-identities",
        action="store_true",
        help="apply the Helm chart's ServiceAccounts and RBAC and run the extender, its "
        "kube-scheduler and the operator under them (token kubeconfigs), not as cluster-admin",
    )
    up.set_defaults(func=_up)

    down = csub.add_parser("down", help="stop every process of the cluster (also after a crash)")
    _name(down)
    down.add_argument("--purge", action="store_true", help="also delete its state directory")
    down.set_defaults(func=_down)

    status = csub.add_parser("status", help="components, kubeconfig and GPU nodes")
    _name(status)
    status.set_defaults(func=_status)

    build = dev_sub.add_parser("build", help="build (or find cached) control-plane binaries")
    build.set_defaults(func=_build)

    nodes = dev_sub.add_parser("nodes", help="add the nodes of a cluster spec to a running cluster")
    _name(nodes)
    nodes.add_argument("--spec", type=Path, required=True)
    nodes.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the kwok Node manifests as YAML instead (for another cluster, e.g. kind)",
    )
    nodes.set_defaults(func=_nodes)


def _name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="chronotope", help="cluster name (default: chronotope)")


def _cluster(args: argparse.Namespace) -> Any:
    from chronotope.devcluster.cluster import LocalCluster
    from chronotope.devcluster.settings import ClusterSettings

    return LocalCluster(ClusterSettings.from_env(), args.name)


def _fail(exc: Exception) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


def _up(args: argparse.Namespace) -> int:
    from chronotope.devcluster.binaries import BinaryError
    from chronotope.devcluster.cluster import ClusterError
    from chronotope.devcluster.identities import COMPONENTS
    from chronotope.devcluster.process import ComponentError
    from chronotope.sim.clusterspec import load_spec

    try:
        spec = load_spec(args.spec) if args.spec else None
        cluster = _cluster(args)
        state = cluster.up(spec, apiserver_port=args.port)
        identities = cluster.chart_identities() if args.chart_identities else None
        if identities is not None:
            for component in COMPONENTS:
                who = identities.username(component)
                print(f"{component} identity: {who} ({identities.kubeconfig(component)})")
        if args.with_scheduler:
            port = cluster.start_chronotope_scheduler(identities=identities)
            pki = cluster.extender_pki()
            print(
                f"chronotope extender listening on https://127.0.0.1:{port} (client certificate "
                f"{pki.client_cert}, key {pki.client_key}, CA {pki.ca_cert})"
            )
        if args.with_operator:
            extra = ("--dashboard-port", str(args.dashboard_port)) if args.dashboard_port else ()
            cluster.start_operator(extra_args=extra, identities=identities)
            print("chronotope operator running (CRDs installed)")
            if args.dashboard_port:
                print(f"dashboard: http://127.0.0.1:{args.dashboard_port}/")
    except (
        BinaryError,
        ClusterError,
        ComponentError,
        TimeoutError,
        ValueError,
        OSError,
        RuntimeError,  # helm template failed
        LookupError,  # a ServiceAccount the chart should have rendered is missing
    ) as exc:
        return _fail(exc)
    print(f"cluster {state.name} is up: {state.server}")
    print(f"export KUBECONFIG={state.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    stopped = _cluster(args).down(quiet=True, purge=args.purge)
    print(f"cluster {args.name} {'stopped' if stopped else 'was not running'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    state = cluster.load_state()
    alive = cluster.running()
    if state is None or not alive:
        print(f"cluster {args.name} is not running")
        return 1
    for component, ok in alive.items():
        print(f"  {component:<24} {'running' if ok else 'DEAD'}")
    print(f"server:     {state.server}\nkubeconfig: {state.kubeconfig}")
    if all(alive.values()):
        from chronotope.kube.client import api_client
        from chronotope.kube.report import gpu_node_table

        with api_client(state.kubeconfig) as api:
            print(gpu_node_table(api))
    return 0 if all(alive.values()) else 1


def _build(args: argparse.Namespace) -> int:
    from chronotope.devcluster.binaries import BinaryError, ensure_binaries
    from chronotope.devcluster.settings import ClusterSettings

    try:
        binaries = ensure_binaries(ClusterSettings.from_env())
    except BinaryError as exc:
        return _fail(exc)
    for path in binaries.all():
        print(path)
    return 0


def _nodes(args: argparse.Namespace) -> int:
    from chronotope.devcluster.cluster import ClusterError
    from chronotope.sim.clusterspec import load_spec, node_manifests

    if args.print_only:
        import yaml

        try:
            manifests = node_manifests(load_spec(args.spec))
        except (ValueError, OSError) as exc:
            return _fail(exc)
        sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
        return 0
    try:
        count = _cluster(args).add_nodes(load_spec(args.spec))
    except (ClusterError, TimeoutError, ValueError, OSError) as exc:
        return _fail(exc)
    print(f"{count} nodes added")
    return 0
