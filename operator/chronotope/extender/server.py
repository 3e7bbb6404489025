"""HTTPS edge of the extender: aiohttp routes, the caller check, metrics, health. No decisions.

Routes: `POST /filter`, `POST /prioritize`, `POST /bind` (the verbs), `GET /healthz`,
`GET /metrics`. Who may call what (docs/extender.md, docs/security.md):

- The verbs: only a caller whose TLS client certificate the client CA signed
  (kube-scheduler). The TLS context asks every caller for a certificate and does
  not demand one (`CERT_OPTIONAL`): a certificate from any other CA fails the
  handshake, and a caller without one gets 403 on every route but the two below.
- `GET /healthz` and `GET /metrics`: anyone who reaches the port; read-only.

A malformed body gets HTTP 400 with a short message and never reaches the
service (`wire` bounds its size, depth and types). An unexpected fault gets 500
with no detail (the details go to the log) and the service keeps running.
Filter and prioritize run inline (pure, in memory, no waiting); bind makes API
calls, so it runs in a thread pool off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from chronotope.extender import wire
from chronotope.extender.service import ExtenderService

__all__ = ["OPEN_ROUTES", "Metrics", "build_app", "tls_context"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_ROUTES = frozenset({"/healthz", "/metrics"})
"""Paths anyone may GET without a client certificate; every other request needs one."""

VERBS = {"/filter": "filter", "/prioritize": "prioritize", "/bind": "bind"}

REFUSED = "forbidden: the extender's verbs need a client certificate from its client CA"


class Metrics:
    """The extender's Prometheus metrics: latency by verb, decisions, refused requests."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Register the metrics on `registry`, or on a fresh one when None."""
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram(
            "chronotope_extender_request_seconds",
            "Extender request latency by verb",
            ["verb"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
        )
        self.decisions = Counter(
            "chronotope_extender_decisions_total",
            "Filter/bind outcomes",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "chronotope_extender_bad_requests_total",
            "Malformed requests answered with 400",
            ["verb"],
            registry=self.registry,
        )
        self.unauthenticated = Counter(
            "chronotope_extender_unauthenticated_requests_total",
            "Requests without a client certificate answered with 403",
            ["verb"],
            registry=self.registry,
        )


def tls_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """The server's TLS context: serve `cert`/`key`, verify callers against `client_ca` only.

    The system's CAs are not loaded: only certificates `client_ca` signed pass.
    Raises OSError or ssl.SSLError when a file is missing or not PEM of its kind.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(cafile=client_ca)
    # ask for a certificate, do not demand one: /healthz and /metrics stay open, and the
    # verbs are refused per request (_authenticate); a certificate from another CA
    # still fails the handshake
    context.verify_mode = ssl.CERT_OPTIONAL
    context.set_alpn_protocols(["http/1.1"])
    return context


def _has_client_cert(request: web.Request) -> bool:
    """Whether the connection carries a client certificate the client CA signed.

    With CERT_OPTIONAL, a certificate that reached the handler was verified (a bad
    one fails the handshake); plain HTTP and callers without one have none.
    """
    transport = request.transport
    return transport is not None and bool(transport.get_extra_info("peercert"))


def _authenticator(metrics: Metrics) -> Middleware:
    """The middleware that answers 403 to a request without a client certificate.

    Fail closed: every route but the open ones, unknown paths included.
    """

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method in ("GET", "HEAD") and request.path in OPEN_ROUTES:
            return await handler(request)
        if not _has_client_cert(request):
            verb = VERBS.get(request.path, "other")
            metrics.unauthenticated.labels(verb).inc()
            log.warning(
                "refused %s %s from %s: no client certificate", request.method, verb, request.remote
            )
            return web.json_response({"Error": REFUSED}, status=403)
        return await handler(request)

    return authenticate


async def _json(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
    except web.HTTPRequestEntityTooLarge:
        raise wire.WireError(f"body is larger than {wire.MAX_BODY_BYTES} bytes") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise wire.WireError(f"body is not JSON: {exc}") from exc
    except RecursionError:
        raise wire.WireError("body is nested too deeply") from None


BIND_WORKERS = 32
"""Binds in flight at once. kube-scheduler binds each pod in its own goroutine and a
bind waits on the API server's write; with the event loop's default pool (cores + 4
threads) binds queue behind each other and cap throughput (docs/extender.md)."""


def build_app(service: ExtenderService, metrics: Metrics) -> web.Application:
    """The aiohttp app serving `service` on the extender routes, recording into `metrics`.

    Every request but `GET /healthz` and `GET /metrics` needs a verified client
    certificate (run it with `tls_context`); over plain HTTP the verbs are always
    refused. Binds run on a pool of `BIND_WORKERS` threads, shut down with the app.
    """
    binds = ThreadPoolExecutor(BIND_WORKERS, thread_name_prefix="bind")

    def timed(verb: str, fn: Handler) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            start = time.perf_counter()
            try:
                return await fn(request)
            except wire.WireError as exc:
                metrics.bad_requests.labels(verb).inc()
                log.warning("%s: bad request: %s", verb, exc)
                return web.json_response({"Error": str(exc)}, status=400)
            except Exception:
                # the details (which may hold the API server's answer) stay in the log
                log.exception("%s failed", verb)
                return web.json_response({"Error": "internal error"}, status=500)
            finally:
                metrics.latency.labels(verb).observe(time.perf_counter() - start)

        return handler

    async def filter_(request: web.Request) -> web.StreamResponse:
        args = wire.parse_extender_args(await _json(request))
        out = service.filter(args.pod, args.node_names)  # in memory, no API calls: inline
        metrics.decisions.labels("filter", "fits" if out.passed else "none").inc()
        return web.json_response(
            wire.filter_result(out.passed, out.failed, out.unresolvable, out.error)
        )

    async def prioritize(request: web.Request) -> web.StreamResponse:
        args = wire.parse_extender_args(await _json(request))
        return web.json_response(
            wire.host_priorities(service.prioritize(args.pod, args.node_names))
        )

    async def bind(request: web.Request) -> web.StreamResponse:
        args = wire.parse_binding_args(await _json(request))
        loop = asyncio.get_running_loop()
        error = await loop.run_in_executor(
            binds, service.bind, args.pod_namespace, args.pod_name, args.pod_uid, args.node
        )
        metrics.decisions.labels("bind", "error" if error else "bound").inc()
        return web.json_response(wire.binding_result(error))

    async def healthz(_: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def metrics_(_: web.Request) -> web.StreamResponse:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application(
        client_max_size=wire.MAX_BODY_BYTES, middlewares=[_authenticator(metrics)]
    )

    async def close_binds(_: web.Application) -> None:
        binds.shutdown(wait=False)

    app.on_cleanup.append(close_binds)
    app.router.add_post("/bind", timed("bind", bind))
    app.router.add_post("/filter", timed("filter", filter_))
    app.router.add_post("/prioritize", timed("prioritize", prioritize))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_)
    return app
