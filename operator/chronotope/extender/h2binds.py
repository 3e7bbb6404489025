"""The bind verb over HTTP/2, on a port and an event loop of its own. No decisions.

kube-scheduler's extender client keeps at most two idle connections per
extender entry (Go's default `MaxIdleConnsPerHost`), while binds run many at
once, each waiting on an API write: over HTTP/1.1 the connections above two are
closed after each bind and opened again for the next, so about every other bind
paid a TLS handshake on both sides, and on the extender's one event loop a
handshake held up the filter behind it. Over HTTP/2 (which kube-scheduler's Go
client speaks when the server offers it) every bind shares one kept connection.
The configuration gives kube-scheduler a second extender entry with only
`bindVerb`, so binds have their own connection and the filter keeps its own
(docs/extender.md).

The rules are the HTTPS port's (`server`): `POST /bind` needs a verified client
certificate (403 without one; a certificate of another CA fails the handshake),
`GET /healthz` is open, a malformed or oversized body gets 400 from `Binds`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from typing import Any

import orjson
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes

from chronotope.extender import wire
from chronotope.extender.server import REFUSED, TOO_LARGE, VERBS, Binds

__all__ = ["serve"]

log = logging.getLogger(__name__)

MAX_STREAMS = 1000
"""Binds in flight on one connection (kube-scheduler runs one goroutine per bind)."""


class _Request:
    """One stream's request: its headers and the body so far."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.body = bytearray()
        self.too_large = False


class _Protocol(asyncio.Protocol):
    """One HTTP/2 connection: requests in, each answered when its bind is done."""

    def __init__(self, binds: Binds) -> None:
        self.binds = binds
        self.conn = H2Connection(H2Configuration(client_side=False, header_encoding="utf-8"))
        self.requests: dict[int, _Request] = {}
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.answering: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # CERT_OPTIONAL: a certificate that got here was verified by the client CA
        self.authenticated = bool(transport.get_extra_info("peercert"))
        self.conn.initiate_connection()
        self.conn.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS})
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except H2Error as exc:
            log.warning("bind port: HTTP/2 protocol error: %s", exc)
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            self._on(event)
        self._flush()

    def _on(self, event: Any) -> None:
        if isinstance(event, RequestReceived):
            headers = {str(k): str(v) for k, v in event.headers}
            self.requests[event.stream_id] = _Request(headers)
        elif isinstance(event, DataReceived):
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            req = self.requests.get(event.stream_id)
            if req is not None and not req.too_large:
                req.body += event.data
                if len(req.body) > wire.MAX_BODY_BYTES:
                    req.too_large, req.body = True, bytearray()
        elif isinstance(event, StreamEnded):
            req = self.requests.pop(event.stream_id, None)
            if req is not None:
                task = asyncio.ensure_future(self._answer(event.stream_id, req))
                self.answering.add(task)  # held until done: the loop keeps weak references
                task.add_done_callback(self.answering.discard)
        elif isinstance(event, StreamReset):
            self.requests.pop(event.stream_id, None)
        elif isinstance(event, ConnectionTerminated) and self.transport is not None:
            self.transport.close()

    async def _answer(self, stream_id: int, req: _Request) -> None:
        method, path = req.headers.get(":method"), req.headers.get(":path")
        if method in ("GET", "HEAD") and path == "/healthz":
            self._respond(stream_id, 200, b"ok", "text/plain")
            return
        if not self.authenticated:
            self.binds.metrics.unauthenticated.labels(VERBS.get(path or "", "other")).inc()
            status, answer = 403, {"Error": REFUSED}
        elif method != "POST" or path != "/bind":
            status, answer = 404, {"Error": f"no route {method} {path}"}
        elif req.too_large:
            self.binds.metrics.bad_requests.labels("bind").inc()
            status, answer = 400, {"Error": TOO_LARGE}
        else:
            status, answer = await self.binds.answer(bytes(req.body))
        self._respond(stream_id, status, orjson.dumps(answer), "application/json")

    def _respond(self, stream_id: int, status: int, body: bytes, content_type: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        headers = [
            (":status", str(status)),
            ("content-type", content_type),
            ("content-length", str(len(body))),
        ]
        try:
            self.conn.send_headers(stream_id, headers)
            self.conn.send_data(stream_id, body, end_stream=True)
        except H2Error as exc:  # the client reset the stream, or no window left for it
            log.info("bind port: stream %d not answered: %s", stream_id, exc)
        self._flush()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def serve(binds: Binds, host: str, port: int, context: ssl.SSLContext) -> threading.Thread:
    """Serve `binds` over HTTP/2 and TLS (`context`, whose ALPN offers h2) on a daemon thread.

    Returns once the port listens; raises OSError when it cannot (port taken).
    """
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(
        loop.create_server(lambda: _Protocol(binds), host, port, ssl=context)
    )
    log.info("binds over HTTP/2 on https://%s:%d", host, server.sockets[0].getsockname()[1])
    thread = threading.Thread(target=loop.run_forever, name=f"binds-{port}", daemon=True)
    thread.start()
    return thread
