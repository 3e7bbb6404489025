"""`chronotope scheduler`: run the kube-scheduler extender (HTTPS) against a cluster.

It serves HTTPS only, and only callers with a client certificate from
`--client-ca-file` may call its verbs (`extender.server`). What a failed API
call tells the caller is its status and reason, never the API server's answer
(`api_error_summary`): kube-scheduler copies a bind error into the pod's events,
which tenants read.
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from chronotope.ratelimit import EVENT_WINDOW_S, RepeatLimiter
from chronotope.ratelimit import install as repeat_install
from chronotope.sim.openb import typical_of
from chronotope.solver.online import PlacementRules, add_placement_arguments

__all__ = ["ApiCallError", "add_parser", "api_error_summary", "short_errors"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def add_parser(sub: Any) -> None:
    """Register the `scheduler` subcommand (the extender) on the subcommand set `sub`."""
    parser = sub.add_parser(
        "scheduler", help="run the GPU scheduler extender that kube-scheduler calls over HTTPS"
    )
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: in-cluster)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default: loopback)")
    parser.add_argument("--port", type=int, default=8888, help="HTTPS listen port")
    parser.add_argument(
        "--bind-port",
        type=int,
        default=0,
        help="also serve the bind verb on this port, over HTTP/2 and HTTPS, from a thread of "
        "its own, for a second extender entry in kube-scheduler's configuration (0: off; "
        "bind is always served on --port too)",
    )
    tls = parser.add_argument_group(
        "TLS (required)",
        "the extender serves HTTPS only; its verbs (filter, prioritize, bind) answer only "
        "callers with a client certificate that --client-ca-file signed, /healthz and "
        "/metrics anyone (docs/extender.md)",
    )
    tls.add_argument(
        "--tls-cert-file",
        type=Path,
        required=True,
        help="PEM serving certificate (its SANs must name the address kube-scheduler calls)",
    )
    tls.add_argument(
        "--tls-private-key-file", type=Path, required=True, help="PEM key of --tls-cert-file"
    )
    tls.add_argument(
        "--client-ca-file",
        type=Path,
        required=True,
        help="PEM CA whose client certificates may call the verbs (kube-scheduler's); "
        "give the extender a CA of its own",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="also serve Prometheus /metrics over plain HTTP on this port, so the extender's "
        "own port can stay on loopback (0: off; /metrics is always on --port too)",
    )
    parser.add_argument(
        "--metrics-address", default="0.0.0.0", help="address for --metrics-port (default: all)"
    )
    parser.add_argument(
        "--sync-timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the first list of nodes and pods",
    )
    add_placement_arguments(parser)
    parser.add_argument(
        "--tie-order",
        type=Path,
        help="file of node names, one a line: among equal scores the earlier node wins "
        "(default: by name); `chronotope replay` passes the simulator's order",
    )
    parser.set_defaults(func=_run)


GC_THRESHOLDS = (50_000, 20, 100)
"""gc thresholds after the cache syncs (Python's defaults are 700, 10, 10)."""


class ApiCallError(RuntimeError):
    """An API call failed; the message is what the extender's caller may see of it."""


def api_error_summary(exc: BaseException, own: tuple[type[BaseException], ...] = ()) -> str:
    """What a caller may see of a failed API call: its HTTP status and reason, no more.

    The API server's answer (headers, body) can carry other objects' names and
    fields; kube-scheduler puts bind errors into pod events, which tenants read.
    Duck-typed on the client's exception (`status`, `reason`), the error itself or
    its cause. Otherwise an error of the `own` types (whose messages this program
    writes) keeps its message, and any other is named by its type only.
    """
    for err in (exc, exc.__cause__):
        status, reason = getattr(err, "status", None), getattr(err, "reason", None)
        if isinstance(status, int) and isinstance(reason, str):
            return f"{status} {reason}"
    return str(exc) if isinstance(exc, own) else type(exc).__name__


def short_errors(
    fn: Callable[P, R], prefix: str = "", own: tuple[type[BaseException], ...] = ()
) -> Callable[P, R]:
    """`fn`, raising `ApiCallError(prefix + api_error_summary(...))` when it fails.

    The full error goes to this process's log only.
    """

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            cause = f"; cause: {exc.__cause__}" if exc.__cause__ is not None else ""
            log.warning("API call failed: %s%s", exc, cause)
            raise ApiCallError(prefix + api_error_summary(exc, own)) from None

    return call


def _run(args: argparse.Namespace) -> int:
    import ssl

    from aiohttp import web

    from chronotope.extender import h2binds
    from chronotope.extender.server import Binds, Metrics, build_app, tls_context
    from chronotope.extender.service import ExtenderService
    from chronotope.kube.binder import Binder, BindError, fetch_pod, post_pod_event
    from chronotope.kube.client import connect, core_v1
    from chronotope.kube.informer import Informer, Resource
    from chronotope.solver.cache import ClusterCache

    # The watch and bind threads share the GIL with the event loop that answers
    # kube-scheduler; at the default 5 ms switch interval a filter can wait several
    # intervals behind a burst of watch events. Filters are short, so switch often.
    sys.setswitchinterval(0.0005)
    try:  # before anything else: a bad certificate stops the start with the reason
        context = tls_context(args.tls_cert_file, args.tls_private_key_file, args.client_ca_file)
        h2_context = tls_context(
            args.tls_cert_file, args.tls_private_key_file, args.client_ca_file, alpn=("h2",)
        )
    except (OSError, ssl.SSLError) as exc:
        log.error("cannot serve HTTPS with the given certificates: %s", exc)
        return 2
    api = connect(args.kubeconfig)
    binder = Binder(api)
    events = ThreadPoolExecutor(1, thread_name_prefix="events")
    repeat_install()  # identical log lines: once a minute (chronotope.ratelimit)
    same_event = RepeatLimiter(EVENT_WINDOW_S)

    def post_event(key: str, reason: str, message: str) -> None:
        # on a worker thread: never an API call inside a filter; an identical event
        # on the same pod at most once per EVENT_WINDOW_S (kube's event correlator's 10 min)
        if same_event.admit((key, reason, message)) is None:
            return
        events.submit(post_pod_event, api, key, reason, message)

    rules = PlacementRules.from_args(args, typical_of(args.typical_pods))
    service = ExtenderService(
        bind_fn=short_errors(binder.bind, "binding failed: ", own=(BindError,)),
        fetch_pod=short_errors(lambda ns, name: fetch_pod(api, ns, name)),
        policy=rules.policy,
        cache=ClusterCache(
            typical=rules.typical,
            tie_order=_tie_order(args.tie_order),
            colocation=rules.colocation,
        ),
        event_fn=post_event,
    )
    binder.runs_plugin = service.runs_plugin  # from the watch-fed cache, not a read per bind
    core = core_v1(api)
    informer = Informer(
        api,
        [
            Resource("nodes", core.list_node, service.on_node, service.sync_nodes),
            Resource("pods", core.list_pod_for_all_namespaces, service.on_pod, service.sync_pods),
        ],
    )
    informer.start()
    if not informer.wait_synced(args.sync_timeout):
        log.error("could not list nodes and pods within %.0fs", args.sync_timeout)
        return 1
    # A full collection walks every object the informer holds (thousands of pods'
    # models) and pauses a filter for tens of ms; what exists after the first list
    # lives as long as the process, so take it out of collection, and collect the
    # young generation less often (watch events allocate in bursts).
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.info(
        "cache synced: %d nodes, %d holdings; policy %s, interference budget %.2fx (%s); "
        "listening on https://%s:%d%s",
        len(service.cache.nodes),
        len(service.cache.holdings),
        args.policy,
        args.interference_budget,
        args.colocation_runtime,
        args.host,
        args.port,
        f" (binds also on {args.bind_port})" if args.bind_port else "",
    )
    metrics = Metrics()
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_address, registry=metrics.registry)
    if args.bind_port:
        # kube-scheduler's binds over HTTP/2, on an event loop of their own: one kept
        # connection for all of them, and none of their work on the filter's loop (h2binds)
        h2binds.serve(Binds(service, metrics), args.host, args.bind_port, h2_context)
    web.run_app(
        build_app(service, metrics),
        host=args.host,
        port=args.port,
        ssl_context=context,
        print=None,
        access_log=None,
        handle_signals=True,
    )
    informer.stop()
    events.shutdown(wait=False)
    return 0


def _tie_order(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]
