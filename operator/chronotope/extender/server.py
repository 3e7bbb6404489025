"""HTTP edge of the extender: aiohttp routes, metrics, health. No decisions here.

Routes: `POST /filter`, `POST /prioritize`, `POST /bind`, `GET /healthz`,
`GET /metrics`. A malformed body gets HTTP 400 with a message and never
reaches the service; an unexpected fault gets 500 with the error text and the
service keeps running. Filter and prioritize run inline (pure, in memory, no waiting);
bind makes API calls, so it runs in a thread pool off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from chronotope.extender import wire
from chronotope.extender.service import ExtenderService

__all__ = ["Metrics", "build_app"]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Metrics:
    """The extender's Prometheus metrics: latency by verb, decisions, malformed requests."""

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


async def _json(request: web.Request) -> Any:
    try:
        return await request.json(loads=json.loads)
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

    Binds run on a pool of `BIND_WORKERS` threads, shut down with the app.
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
            except Exception as exc:
                log.exception("%s failed", verb)
                return web.json_response({"Error": f"internal error: {exc}"}, status=500)
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

    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def close_binds(_: web.Application) -> None:
        binds.shutdown(wait=False)

    app.on_cleanup.append(close_binds)
    app.router.add_post("/filter", timed("filter", filter_))
    app.router.add_post("/prioritize", timed("prioritize", prioritize))
    app.router.add_post("/bind", timed("bind", bind))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_)
    return app
