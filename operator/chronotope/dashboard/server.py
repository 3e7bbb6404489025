"""Serve the dashboard from the operator's watch caches (no extra API load).

`GET /` is the page (shipped in the package, no CDN), `GET /api/state` the
state it polls (`workloads.views.dashboard_state` on the caches),
`GET /healthz` ok. Read-only; binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from chronotope.kube.store import OperatorCache
from chronotope.workloads.views import dashboard_state

__all__ = ["serve_dashboard"]

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}


def _asset(name: str) -> bytes:
    return (resources.files("chronotope.dashboard") / "static" / name).read_bytes()


def serve_dashboard(
    cache: OperatorCache,
    port: int,
    host: str = "127.0.0.1",
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ThreadingHTTPServer:
    """Start the dashboard on a daemon thread; returns the server (call `shutdown` to stop)."""

    def state() -> dict[str, Any]:
        return dashboard_state(
            cache.nodes.list(),
            cache.pods.list(),
            cache.training_jobs.list(),
            pipelines=cache.pipelines.list(),
            variants=cache.variants.list(),
            now=clock(),
            queues=cache.queues.list(),
            local_queues=cache.local_queues.list(),
        )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/api/state":
                self._send(200, json.dumps(state(), default=str).encode(), "application/json")
            elif path == "/healthz":
                self._send(200, b"ok", "text/plain")
            elif path in ("/", "/index.html", "/app.js", "/style.css"):
                name = "index.html" if path in ("/", "/index.html") else path[1:]
                self._send(200, _asset(name), _TYPES["." + name.rsplit(".", 1)[1]])
            else:
                self._send(404, b"not found", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", "default-src 'self'")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    return server
