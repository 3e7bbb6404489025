"""The admission webhook's HTTPS edge: routes, TLS and a thread of its own. No decisions here.

Routes: `POST /validate` and `POST /mutate` take an AdmissionReview (v1) and
answer with `workloads.admission_wire.review` (validation, or defaulting as a JSON
patch); `GET /healthz` says ok. The server runs on its own thread and event
loop beside kopf's, so a slow lookup never delays a reconcile nor the other
way round; lookups (API GETs) run on a small thread pool. A body that is not
an AdmissionReview gets 400, an unexpected fault 500: the API server then
applies the registration's failure policy. The certificate files are checked
every `RELOAD_EVERY_S` and re-read when they change (cert-manager renews a
mounted Secret in place), so new connections get the new certificate.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from chronotope.workloads import admission_wire as wire
from chronotope.workloads.admission import Lookups
from chronotope.workloads.pod_shape import TypeTable

__all__ = ["RELOAD_EVERY_S", "WebhookServer", "WebhookSettings", "build_app"]

log = logging.getLogger(__name__)

RELOAD_EVERY_S = 30.0
LOOKUP_THREADS = 4


@dataclass(frozen=True)
class WebhookSettings:
    """Where the webhook listens and the certificate it serves."""

    port: int
    address: str
    cert: Path
    key: Path


def build_app(lookups: Lookups, pod_types: TypeTable, pool: ThreadPoolExecutor) -> web.Application:
    """The aiohttp application: admission routes answered with `lookups` on `pool`."""

    def route(mutate: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return web.Response(status=400, text=f"not JSON: {exc}")
            if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
                return web.Response(status=400, text="not an AdmissionReview with a request")
            decide = functools.partial(
                wire.review, body["request"], lookups, pod_types, mutate=mutate
            )
            try:
                answer = await asyncio.get_running_loop().run_in_executor(pool, decide)
            except Exception as exc:
                log.exception("admission review failed")
                return web.Response(status=500, text=f"{type(exc).__name__}: {exc}")
            if not answer.allowed:
                req = body["request"]
                log.info(
                    "denied %s %s/%s: %s",
                    (req.get("kind") or {}).get("kind"),
                    req.get("namespace"),
                    req.get("name"),
                    answer.message,
                )
            return web.json_response(wire.response(body, answer))

        return handle

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=8 * 1024 * 1024)  # the API server's request limit
    app.router.add_post(wire.VALIDATE_PATH, route(mutate=False))
    app.router.add_post(wire.MUTATE_PATH, route(mutate=True))
    app.router.add_get("/healthz", healthz)
    return app


class WebhookServer:
    """The webhook on its own thread and event loop; `start` binds, `stop` shuts it down."""

    def __init__(self, settings: WebhookSettings, lookups: Lookups, pod_types: TypeTable) -> None:
        """Serve `lookups`' answers with `settings`' address and certificate (not yet started)."""
        self.settings = settings
        self._pool = ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="webhook-lookup")
        self._app = build_app(lookups, pod_types, self._pool)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook", daemon=True)
        self._runner: web.AppRunner | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] | None = None
        self.port = settings.port
        """The bound port (the chosen one when settings.port is 0)."""

    def start(self, timeout: float = 30.0) -> None:
        """Load the certificate and start listening; raises OSError or ssl.SSLError if it cannot."""
        self._reload()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout)
        log.info("admission webhook on https://%s:%d", self.settings.address, self.port)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening and end the thread."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._pool.shutdown(wait=False)

    async def _serve(self) -> None:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.address, self.settings.port, ssl_context=self._tls
        )
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the chosen one when asked for port 0
        self._watcher = asyncio.get_running_loop().create_task(self._watch_certificate())

    async def _shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _watch_certificate(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_EVERY_S)
            try:
                self._reload()
            except (OSError, ssl.SSLError):
                log.exception("could not re-read the webhook certificate; serving the old one")

    def _reload(self) -> None:
        """Load the certificate and key when their files changed since the last load."""
        stamp = (self.settings.cert.stat().st_mtime, self.settings.key.stat().st_mtime)
        if stamp != self._stamp:
            self._tls.load_cert_chain(self.settings.cert, self.settings.key)
            if self._stamp is not None:
                log.info("re-read the webhook certificate %s", self.settings.cert)
            self._stamp = stamp
