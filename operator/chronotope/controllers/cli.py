"""`chronotope operator`: run the kopf controllers against a cluster."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chronotope.sim.openb import typical_of
from chronotope.solver.online import PlacementRules, add_placement_arguments

if TYPE_CHECKING:
    from chronotope.controllers.metrics import OperatorMetrics
    from chronotope.kube.store import OperatorCache
    from chronotope.workloads.leader import LeaseTiming

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
    # the extender's --policy, --interference-budget, --colocation-runtime: give both the
    # same, so a pipeline's GPU shares fit the free GPUs where the extender would place
    # them, and a ModelVariant group counts as many shares a GPU as it puts on one
    add_placement_arguments(parser)
    parser.add_argument(
        "--tuner-down-delay-s",
        type=float,
        default=60.0,
        help="an InferencePipeline stage scales down only this long after its last change",
    )
    parser.add_argument(
        "--tuner-envelope-s",
        type=float,
        default=60.0,
        help="the InferencePipeline tuner also reads the traffic query over windows doubling "
        "from its own up to this many seconds (InferLine's envelope; no longer than the "
        "query's own window: that one rate only)",
    )
    parser.add_argument(
        "--replan-period-s",
        type=float,
        default=600.0,
        help="an InferencePipeline on Prometheus traffic is planned again on the live rate "
        "this often",
    )
    parser.add_argument(
        "--variant-refresh-s",
        type=float,
        default=30.0,
        help="a ModelVariant serving group is re-planned on any change, else this often",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        help="seconds between reconciles of each InferencePipeline, ModelVariant and Queue",
    )
    parser.add_argument(
        "--resync",
        type=float,
        default=300.0,
        help="TrainingJobs are reconciled on events; each also at least this often (seconds)",
    )
    parser.add_argument(
        "--health-port", type=int, default=0, help="serve /healthz on this port (0: off)"
    )
    parser.add_argument(
        "--health-address",
        default="127.0.0.1",
        help="address for /healthz (a kubelet probe needs the pod's IP: 0.0.0.0)",
    )
    _add_leader_flags(parser)
    _add_webhook_flags(parser)
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


def _add_webhook_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the validating and defaulting admission webhook (HTTPS) on this port (0: off)",
    )
    parser.add_argument(
        "--webhook-address", default="0.0.0.0", help="address for the webhook (default: all)"
    )
    parser.add_argument(
        "--webhook-cert-dir",
        type=Path,
        help="directory with tls.crt and tls.key; when it has neither, a self-signed CA "
        "(ca.crt, the registration's caBundle) and serving certificate are generated into it",
    )
    parser.add_argument(
        "--webhook-host",
        action="append",
        help="DNS name or IP the generated certificate is for (repeatable; default: "
        "127.0.0.1 and localhost)",
    )


def _start_webhook(args: argparse.Namespace, api: Any, cache: Any) -> str | None:
    """Start the admission webhook when --webhook-port is set; why it could not, or None."""
    import ssl

    from chronotope.controllers.webhook import WebhookServer, WebhookSettings
    from chronotope.controllers.webhook_tls import ensure_certificates
    from chronotope.kube.admission import KubeAdmissionLookups, pod_template_types

    if not args.webhook_port:
        return None
    if args.webhook_cert_dir is None:
        return "--webhook-port needs --webhook-cert-dir (its tls.crt/tls.key, or where to generate)"
    hosts = args.webhook_host or ["127.0.0.1", "localhost"]
    try:
        files = ensure_certificates(args.webhook_cert_dir, hosts)
        settings = WebhookSettings(args.webhook_port, args.webhook_address, files.cert, files.key)
        WebhookServer(settings, KubeAdmissionLookups(api, cache), pod_template_types()).start()
    except (OSError, ValueError, ssl.SSLError) as exc:
        return f"admission webhook: {exc}"
    if files.ca is not None:
        logging.getLogger(__name__).info("webhook CA bundle: %s", files.ca)
    return None


def _add_leader_flags(parser: argparse.ArgumentParser) -> None:
    from chronotope.workloads.leader import LeaseTiming

    default = LeaseTiming()
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="run the controllers only while holding a coordination.k8s.io Lease "
        "(several replicas: one leads, the others stand by)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        default="default",
        help="namespace of the Lease (the chart passes its release namespace)",
    )
    parser.add_argument("--leader-election-id", default="chronotope-operator", help="Lease name")
    parser.add_argument(
        "--leader-election-identity",
        default="",
        help="holder identity (default: $POD_NAME, else hostname and a random suffix)",
    )
    parser.add_argument(
        "--leader-lease-duration",
        type=int,
        default=default.lease_s,
        help="seconds a Lease holds without renewal",
    )
    parser.add_argument(
        "--leader-renew-deadline",
        type=float,
        default=default.renew_deadline_s,
        help="seconds a leader may go without renewing before it exits",
    )
    parser.add_argument(
        "--leader-retry-period",
        type=float,
        default=default.retry_s,
        help="seconds between attempts to acquire or renew",
    )


def _run(args: argparse.Namespace) -> int:
    import kopf

    from chronotope.controllers.inferencepipeline import TunerSettings
    from chronotope.controllers.metrics import OperatorMetrics
    from chronotope.controllers.modelvariant import GroupMemo
    from chronotope.controllers.operator import build_registry
    from chronotope.kube.client import connect, count_requests
    from chronotope.kube.pipeline_ops import KubePipelineOps
    from chronotope.kube.store import OperatorCache
    from chronotope.kube.trainingjob_ops import KubeClusterOps
    from chronotope.kube.variant_ops import KubeVariantOps
    from chronotope.ratelimit import install as repeat_install

    repeat_install()  # identical log lines: once a minute (chronotope.ratelimit)
    for handler in logging.getLogger().handlers:  # a long-running process: when, too
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    timing = _leader_timing(args)
    if isinstance(timing, str):
        logging.getLogger(__name__).error("bad leader-election durations: %s", timing)
        return 2
    if args.kubeconfig:
        # kopf logs in through the kubernetes client, which reads KUBECONFIG (the edge
        # of the program is the one place that touches the environment)
        os.environ["KUBECONFIG"] = str(args.kubeconfig)
    metrics = OperatorMetrics(
        stale_after_s=max(30.0, 10 * args.interval, 2 * args.resync),
        group_stale_after_s=max(120.0, 4 * args.variant_refresh_s),
    )
    api = connect(args.kubeconfig)
    count_requests(api, lambda verb, resource: metrics.api_requests.labels(verb, resource).inc())
    cache = OperatorCache(api)
    if not cache.start(args.sync_timeout):
        logging.getLogger(__name__).error(
            "could not list nodes, pods and TrainingJobs within %.0fs", args.sync_timeout
        )
        return 1
    if args.dashboard_port:
        from chronotope.dashboard.server import serve_dashboard

        serve_dashboard(cache, args.dashboard_port, args.dashboard_address)
    webhook_error = _start_webhook(args, api, cache)  # every replica serves it, leader or not
    if webhook_error:
        logging.getLogger(__name__).error("%s", webhook_error)
        return 1
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    from chronotope.controllers.queues import run_status_loop
    from chronotope.controllers.trainingjob_loop import TrainingJobLoop

    job_ops = KubeClusterOps(api, cache)
    job_loop = TrainingJobLoop(job_ops, cache.training_jobs.list, metrics, resync_s=args.resync)
    cache.listen(job_loop.on_change)

    placement = PlacementRules.from_args(args, typical_of(args.typical_pods))  # the extender's
    registry = build_registry(
        interval=args.interval,
        metrics=metrics,
        pipeline_ops=KubePipelineOps(api, cache, prometheus=args.prometheus),
        tuner=TunerSettings(
            down_delay_s=args.tuner_down_delay_s,
            replan_period_s=args.replan_period_s,
            envelope_s=args.tuner_envelope_s,
            placement=placement,
        ),
        variant_ops=KubeVariantOps(api, cache, prometheus=args.prometheus),
        memo=GroupMemo(refresh_s=args.variant_refresh_s, placement=placement),
    )
    logging.getLogger("kopf").setLevel(logging.WARNING)
    liveness = (
        f"http://{args.health_address}:{args.health_port}/healthz" if args.health_port else None
    )

    queues_changed = _queue_inputs(cache)

    def queue_status(stop: threading.Event) -> None:
        run_status_loop(job_ops, stop, args.interval, metrics.observe_queue, changed=queues_changed)

    run_controllers = _controllers(kopf, registry, (job_loop.run, queue_status), liveness)
    if timing is not None:
        return _run_elected(args, timing, api, metrics, run_controllers)
    metrics.leader.set(1)  # no election: this process is the one writer
    run_controllers(None)
    return 0


_QUEUE_INPUTS = ("trainingjobs", "queues", "localqueues", "inferencepipelines", "modelvariants")


def _queue_inputs(cache: OperatorCache) -> threading.Event:
    """An event the cache sets when something the Queue loop reads changes."""
    from chronotope.workloads.training_quota import is_serving_pod

    changed = threading.Event()

    def on_queue_input(kind: str, _event: str, obj: dict[str, Any]) -> None:
        # serving workloads that wait for quota are pending; their pods may reclaim lent quota
        if kind in _QUEUE_INPUTS or (kind == "pods" and is_serving_pod(obj)):
            changed.set()

    cache.listen(on_queue_input)
    return changed


def _controllers(
    kopf: Any,
    registry: Any,
    loops: tuple[Callable[[threading.Event], None], ...],
    liveness: str | None,
) -> Callable[[threading.Event | None], None]:
    """The controllers' run: `loops` on threads, kopf on its own event loop.

    The loops are the TrainingJob work queue and the Queue status writer.
    """

    def run_controllers(stop: threading.Event | None = None) -> None:
        # kopf stops on SIGTERM itself once it runs; `stop` covers a signal that came
        # before. It reaches kopf as a future of kopf's loop: a threading.Event would
        # park a thread of the loop's executor that the loop's shutdown then waits for.
        jobs_stop = threading.Event()
        threads = [
            threading.Thread(target=run, args=(jobs_stop,), name=f"loop-{i}", daemon=True)
            for i, run in enumerate(loops)
        ]
        for thread in threads:
            thread.start()
        loop = asyncio.new_event_loop()
        stopped: asyncio.Future[None] = loop.create_future()
        if stop is not None:
            threading.Thread(
                target=_forward_stop, args=(stop, loop, stopped), name="stop", daemon=True
            ).start()
        try:
            kopf.run(
                loop=loop,
                registry=registry,
                standalone=True,
                clusterwide=True,
                liveness_endpoint=liveness,
                stop_flag=stopped,
            )
        finally:  # what asyncio.run does after its coroutine
            jobs_stop.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()
                for thread in threads:
                    thread.join(timeout=30)

    return run_controllers


def _forward_stop(
    stop: threading.Event, loop: asyncio.AbstractEventLoop, stopped: asyncio.Future[None]
) -> None:
    stop.wait()

    def resolve() -> None:
        if not stopped.done():
            stopped.set_result(None)

    with contextlib.suppress(RuntimeError):  # the loop already closed: kopf stopped on its own
        loop.call_soon_threadsafe(resolve)


def _leader_timing(args: argparse.Namespace) -> LeaseTiming | str | None:
    """The election's durations with --leader-elect (None without), or why they are wrong."""
    from chronotope.workloads.leader import LeaseTiming

    if not args.leader_elect:
        return None
    try:
        return LeaseTiming(
            lease_s=args.leader_lease_duration,
            renew_deadline_s=args.leader_renew_deadline,
            retry_s=args.leader_retry_period,
        )
    except ValueError as exc:
        return str(exc)


def _run_elected(
    args: argparse.Namespace,
    timing: LeaseTiming,
    api: Any,
    metrics: OperatorMetrics,
    run_controllers: Callable[[threading.Event], None],
) -> int:
    """Run the controllers only while this process holds the Lease (controllers.leader)."""
    from chronotope.controllers.leader import LeaderElection, run_elected
    from chronotope.kube.leader import KubeLease

    identity = (
        args.leader_election_identity
        or os.environ.get("POD_NAME")
        or f"{socket.gethostname()}_{secrets.token_hex(4)}"
    )
    namespace, name = args.leader_election_namespace, args.leader_election_id
    election = LeaderElection(
        KubeLease(api, namespace, name, timeout_s=timing.retry_s * 2),
        identity,
        timing,
        name=f"{namespace}/{name}",
        on_leading=lambda leading: metrics.leader.set(1 if leading else 0),
    )
    health = (args.health_address, args.health_port) if args.health_port else None
    return run_elected(election, run_controllers, health=health)
