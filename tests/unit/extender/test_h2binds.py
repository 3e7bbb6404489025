"""The bind verb over HTTP/2 (`h2binds`) on a real TLS socket, called by a real HTTP/2
client (the `h2` library): many binds share one connection, and the rules are the
HTTPS port's (client certificate, bounded body, short errors).

kube-scheduler's Go client is the caller in the cluster tests (every pod there binds
through this port); here the service behind it is the real one with a recording bind
(test_service).
"""

from __future__ import annotations

import json
import socket
import ssl
from typing import Any

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived, StreamEnded

from chronotope.devcluster.pki import ExtenderPki, extender_pki
from chronotope.extender import h2binds
from chronotope.extender.server import REFUSED, Binds, Metrics, tls_context
from chronotope.extender.service import ExtenderService
from tests.unit.extender.test_service import Recorder, pod, service


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ExtenderPki:
    return extender_pki(tmp_path_factory.mktemp("extender-pki"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(svc: ExtenderService, pki: ExtenderPki) -> tuple[int, Metrics]:
    metrics = Metrics()
    context = tls_context(pki.serving_cert, pki.serving_key, pki.ca_cert, alpn=("h2",))
    port = _free_port()
    h2binds.serve(Binds(svc, metrics), "127.0.0.1", port, context)
    return port, metrics


def h2_context(pki: ExtenderPki, with_cert: bool = True) -> ssl.SSLContext:
    context = (
        pki.client_context() if with_cert else ssl.create_default_context(cafile=str(pki.ca_cert))
    )
    context.set_alpn_protocols(["h2"])
    return context


def requests(
    port: int, context: ssl.SSLContext, calls: list[tuple[str, str, bytes]]
) -> list[tuple[int, bytes]]:
    """Send every (method, path, body) at once on one HTTP/2 connection; their answers."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    assert sock.selected_alpn_protocol() == "h2"
    conn = H2Connection(H2Configuration(client_side=True))
    conn.initiate_connection()
    streams: dict[int, dict[str, Any]] = {}
    for method, path, body in calls:
        sid = conn.get_next_available_stream_id()
        headers = [
            (":method", method),
            (":path", path),
            (":scheme", "https"),
            (":authority", "127.0.0.1"),
            ("content-type", "application/json"),
        ]
        conn.send_headers(sid, headers, end_stream=not body)
        for at in range(0, len(body), 16384):  # the default largest frame
            conn.send_data(sid, body[at : at + 16384], end_stream=at + 16384 >= len(body))
        streams[sid] = {"status": 0, "body": b"", "done": False}
    sock.sendall(conn.data_to_send())
    try:
        while not all(s["done"] for s in streams.values()):
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, ResponseReceived):
                    streams[event.stream_id]["status"] = int(dict(event.headers)[b":status"])
                elif isinstance(event, DataReceived):
                    streams[event.stream_id]["body"] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, StreamEnded):
                    streams[event.stream_id]["done"] = True
            sock.sendall(conn.data_to_send())
    finally:
        sock.close()
    return [(s["status"], s["body"]) for s in streams.values()]


def bind_body(name: str, node: str) -> bytes:
    args = {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node}
    return json.dumps(args).encode()


def test_many_binds_share_one_connection_and_write_the_filters_gpus(pki: ExtenderPki) -> None:
    rec = Recorder()
    svc = service(rec)
    chosen = {}
    for i in range(12):  # 13 GPUs in all
        out = svc.filter(pod(f"p{i}", gpus=1), ["a", "t", "v"])
        (chosen[f"p{i}"],) = out.passed
    port, metrics = serve(svc, pki)
    answers = requests(
        port, h2_context(pki), [("POST", "/bind", bind_body(n, node)) for n, node in chosen.items()]
    )
    assert answers == [(200, b'{"Error":""}')] * 12
    assert {k.split("/")[1]: v[0] for k, v in rec.bound.items()} == chosen
    held = {tuple(v[1].gpu_indices) for k, v in rec.bound.items() if v[0] == "a" and v[1]}
    assert len(held) == sum(1 for n in chosen.values() if n == "a")  # no GPU twice
    assert metrics.decisions.labels("bind", "bound")._value.get() == 12


def test_a_caller_without_a_client_certificate_is_refused(pki: ExtenderPki) -> None:
    rec = Recorder()
    port, metrics = serve(service(rec), pki)
    ((status, body),) = requests(
        port, h2_context(pki, with_cert=False), [("POST", "/bind", bind_body("p", "a"))]
    )
    assert (status, json.loads(body)) == (403, {"Error": REFUSED})
    assert rec.bound == {}
    assert metrics.unauthenticated.labels("bind")._value.get() == 1
    ((status, body),) = requests(port, h2_context(pki, with_cert=False), [("GET", "/healthz", b"")])
    assert (status, body) == (200, b"ok")


def test_bad_bodies_and_unknown_routes_get_a_short_error(pki: ExtenderPki) -> None:
    port, _ = serve(service(Recorder()), pki)
    answers = requests(
        port,
        h2_context(pki),
        [
            ("POST", "/bind", b"{not json"),
            ("POST", "/bind", b"[" * 60_000),  # one flow-control window
            ("POST", "/bind", json.dumps({"PodName": 3}).encode()),
            ("POST", "/filter", b"{}"),
        ],
    )
    statuses = [s for s, _ in answers]
    errors = [json.loads(b)["Error"] for _, b in answers]
    assert statuses == [400, 400, 400, 404]
    assert "body is not JSON" in errors[0]
    assert errors[1] == "body is nested too deeply"
    assert "PodName" in errors[2]
