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

Binds can also be served on a port of their own over HTTP/2 (`h2binds`, the
extender's `--bind-port`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from chronotope.extender import wire
from chronotope.extender.service import ExtenderService

__all__ = [
    "OPEN_ROUTES",
    "REFUSED",
    "TOO_LARGE",
    "VERBS",
    "Binds",
    "Metrics",
    "build_app",
    "parse_json",
    "tls_context",
]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_ROUTES = frozenset({"/healthz", "/metrics"})
"""Paths anyone may GET without a client certificate; every other request needs one."""

VERBS = {"/filter": "filter", "/prioritize": "prioritize", "/bind": "bind"}

TOO_LARGE = f"body is larger than {wire.MAX_BODY_BYTES} bytes"
"""The 400 answer to a body over the bound, on either transport."""

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


def tls_context(
    cert: Path, key: Path, client_ca: Path, alpn: tuple[str, ...] = ("http/1.1",)
) -> ssl.SSLContext:
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
    context.set_alpn_protocols(list(alpn))
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
            return _reply({"Error": REFUSED}, status=403)
        return await handler(request)

    return authenticate


async def _json(request: web.Request) -> Any:
    """The request's JSON body; WireError when it is too large or not JSON."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise wire.WireError(TOO_LARGE) from None
    return parse_json(body)


def parse_json(body: bytes) -> Any:
    """A body's JSON (orjson: the filter's body names every candidate node); WireError if not."""
    if len(body) > wire.MAX_BODY_BYTES:
        raise wire.WireError(TOO_LARGE)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc) or "recursion" in str(exc):
            raise wire.WireError("body is nested too deeply") from None
        raise wire.WireError(f"body is not JSON: {exc}") from exc


def _reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


BIND_WORKERS = 32
"""Binds in flight at once. kube-scheduler binds each pod in its own goroutine and a
bind waits on the API server's write; with the event loop's default pool (cores + 4
threads) binds queue behind each other and cap throughput (docs/extender.md)."""


class Binds:
    """Answers bind requests, whichever transport brings them.

    HTTP/1.1 here, HTTP/2 in `h2binds`: parse, bind on a pool of `BIND_WORKERS`
    threads, count and time.
    """

    def __init__(self, service: ExtenderService, metrics: Metrics) -> None:
        """Bind with `service`, recording into `metrics`; the pool starts threads lazily."""
        self.service = service
        self.metrics = metrics
        self.pool = ThreadPoolExecutor(BIND_WORKERS, thread_name_prefix="bind")

    async def answer(self, body: bytes) -> tuple[int, Any]:
        """(HTTP status, JSON answer) for one bind request's body."""
        start = time.perf_counter()
        try:
            args = wire.parse_binding_args(parse_json(body))
            loop = asyncio.get_running_loop()
            error = await loop.run_in_executor(
                self.pool,
                self.service.bind,
                args.pod_namespace,
                args.pod_name,
                args.pod_uid,
                args.node,
            )
        except wire.WireError as exc:
            self.metrics.bad_requests.labels("bind").inc()
            log.warning("bind: bad request: %s", exc)
            return 400, {"Error": str(exc)}
        except Exception:
            # the details (which may hold the API server's answer) stay in the log
            log.exception("bind failed")
            return 500, {"Error": "internal error"}
        finally:
            self.metrics.latency.labels("bind").observe(time.perf_counter() - start)
        self.metrics.decisions.labels("bind", "error" if error else "bound").inc()
        return 200, wire.binding_result(error)

    def close(self) -> None:
        """Stop the pool; binds in flight finish."""
        self.pool.shutdown(wait=False)


def build_app(service: ExtenderService, metrics: Metrics) -> web.Application:
    """The aiohttp app serving `service` on the extender routes, recording into `metrics`.

    Every request but `GET /healthz` and `GET /metrics` needs a verified client
    certificate (run it with `tls_context`); over plain HTTP the verbs are always
    refused. Binds run on a pool of `BIND_WORKERS` threads, shut down with the app.
    """
    binds = Binds(service, metrics)

    def timed(verb: str, fn: Handler) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            start = time.perf_counter()
            try:
                return await fn(request)
            except wire.WireError as exc:
                metrics.bad_requests.labels(verb).inc()
                log.warning("%s: bad request: %s", verb, exc)
                return _reply({"Error": str(exc)}, status=400)
            except Exception:
                # the details (which may hold the API server's answer) stay in the log
                log.exception("%s failed", verb)
                return _reply({"Error": "internal error"}, status=500)
            finally:
                metrics.latency.labels(verb).observe(time.perf_counter() - start)

        return handler

    async def filter_(request: web.Request) -> web.StreamResponse:
        args = wire.parse_extender_args(await _json(request))
        out = service.filter(args.pod, args.node_names)  # in memory, no API calls: inline
        metrics.decisions.labels("filter", "fits" if out.passed else "none").inc()
        return _reply(wire.filter_result(out.passed, out.failed, out.unresolvable, out.error))

    async def prioritize(request: web.Request) -> web.StreamResponse:
        args = wire.parse_extender_args(await _json(request))
        return _reply(wire.host_priorities(service.prioritize(args.pod, args.node_names)))

    async def bind(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            metrics.bad_requests.labels("bind").inc()
            return _reply({"Error": TOO_LARGE}, 400)
        status, answer = await binds.answer(body)
        return _reply(answer, status)

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
        binds.close()

    app.on_cleanup.append(close_binds)
    app.router.add_post("/bind", bind)
    app.router.add_post("/filter", timed("filter", filter_))
    app.router.add_post("/prioritize", timed("prioritize", prioritize))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_)
    return app
