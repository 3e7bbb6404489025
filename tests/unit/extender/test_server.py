"""The extender's HTTPS edge on a real TLS socket: who may call which route, and what a
malformed body or a failed API call answers.

The server is the real aiohttp app (`build_app`) with the real TLS context
(`tls_context`) on a loopback port; the service behind it is the real one with
a recording bind (test_service). Certificates are the local cluster's
(`devcluster.pki.extender_pki`) and, for the intruder, another CA's.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from kubernetes.client.exceptions import ApiException

from chronotope.cli import main
from chronotope.devcluster.pki import ExtenderPki, extender_pki
from chronotope.extender import wire
from chronotope.extender.cli import ApiCallError, api_error_summary, short_errors
from chronotope.extender.server import REFUSED, Metrics, build_app, tls_context
from chronotope.extender.service import ExtenderService
from chronotope.kube.binder import BindError
from chronotope.sharing.assignment import BindRequest
from tests.impostor import impostor_context
from tests.unit.extender.test_service import Recorder, pod, service

VERBS = ("bind", "filter", "prioritize")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ExtenderPki:
    return extender_pki(tmp_path_factory.mktemp("extender-pki"))


@pytest.fixture(scope="module")
def intruder(tmp_path_factory: pytest.TempPathFactory, pki: ExtenderPki) -> ssl.SSLContext:
    """A caller whose client certificate (CN kube-scheduler) another CA signed."""
    return impostor_context(tmp_path_factory.mktemp("intruder"), pki.ca_cert)


def anonymous(pki: ExtenderPki) -> ssl.SSLContext:
    """A caller that trusts the extender's serving certificate and has none of its own."""
    return ssl.create_default_context(cafile=str(pki.ca_cert))


@contextmanager
def serving(app: web.Application, context: ssl.SSLContext | None) -> Iterator[int]:
    """Run `app` on a loopback port in a thread with its own event loop; yields the port."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    loop.run_until_complete(site.start())
    port = int(runner.addresses[0][1])
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def call(
    port: int,
    context: ssl.SSLContext | None,
    method: str,
    path: str,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post(port: int, context: ssl.SSLContext | None, verb: str, body: Any) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer = call(port, context, "POST", f"/{verb}", raw)
    return status, json.loads(answer)


def filter_args(name: str, gpus: int = 1) -> dict[str, Any]:
    return {"Pod": pod(name, gpus=gpus), "NodeNames": ["a", "t", "v"]}


def binding_args(name: str, node: str) -> dict[str, Any]:
    return {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node}


def served(svc: ExtenderService, pki: ExtenderPki) -> tuple[web.Application, ssl.SSLContext]:
    context = tls_context(pki.serving_cert, pki.serving_key, pki.ca_cert)
    return build_app(svc, Metrics()), context


def test_kube_schedulers_certificate_calls_every_verb(pki: ExtenderPki) -> None:
    rec = Recorder()
    app, context = served(service(rec), pki)
    with serving(app, context) as port:
        status, out = post(port, pki.client_context(), "filter", filter_args("p", 4))
        assert status == 200
        (chosen,) = out["NodeNames"]
        status, scores = post(port, pki.client_context(), "prioritize", filter_args("p", 4))
        assert status == 200
        assert {s["Host"]: s["Score"] for s in scores}[chosen] == 10
        status, out = post(port, pki.client_context(), "bind", binding_args("p", chosen))
        assert (status, out) == (200, {"Error": ""})
    assert rec.bound["ns/p"][0] == chosen


def test_callers_without_a_client_certificate_are_refused_on_every_verb(
    pki: ExtenderPki,
) -> None:
    rec = Recorder()
    app, context = served(service(rec), pki)
    with serving(app, context) as port:
        # a pod another caller filtered (so a bind would find its assumption)
        assert post(port, pki.client_context(), "filter", filter_args("p"))[0] == 200
        for verb, body in (
            ("bind", binding_args("p", "t")),
            ("filter", filter_args("q")),
            ("prioritize", filter_args("q")),
        ):
            status, out = post(port, anonymous(pki), verb, body)
            assert (status, out) == (403, {"Error": REFUSED}), verb
        # unknown paths and other methods fail closed too
        assert call(port, anonymous(pki), "POST", "/nosuch", b"{}")[0] == 403
        assert call(port, anonymous(pki), "GET", "/bind")[0] == 403
        # /healthz and /metrics stay open and read-only
        assert call(port, anonymous(pki), "GET", "/healthz") == (200, b"ok")
        status, text = call(port, anonymous(pki), "GET", "/metrics")
        assert status == 200
        metrics = text.decode()
        assert call(port, anonymous(pki), "POST", "/metrics", b"")[0] == 403
    assert rec.bound == {}
    for verb, count in (("bind", 2), ("filter", 1), ("prioritize", 1), ("other", 1)):
        line = f'chronotope_extender_unauthenticated_requests_total{{verb="{verb}"}} {count}.0'
        assert line in metrics


def test_a_certificate_from_another_ca_fails_the_handshake(
    pki: ExtenderPki, intruder: ssl.SSLContext
) -> None:
    rec = Recorder()
    app, context = served(service(rec), pki)
    with serving(app, context) as port:
        for verb in VERBS:
            body = binding_args("p", "t") if verb == "bind" else filter_args("p")
            with pytest.raises((ssl.SSLError, ConnectionError)):
                post(port, intruder, verb, body)
        assert call(port, anonymous(pki), "GET", "/healthz") == (200, b"ok")
    assert rec.bound == {}


def test_over_plain_http_the_verbs_are_always_refused(pki: ExtenderPki) -> None:
    rec = Recorder()
    with serving(build_app(service(rec), Metrics()), None) as port:
        assert post(port, None, "bind", binding_args("p", "t"))[0] == 403
        assert call(port, None, "GET", "/healthz") == (200, b"ok")
    assert rec.bound == {}


def _nested(depth: int) -> bytes:
    return b'{"Pod": ' + b"[" * depth + b"]" * depth + b', "NodeNames": []}'


@pytest.mark.parametrize(
    ("verb", "body", "message"),
    [
        ("filter", b"{not json", "body is not JSON"),
        ("filter", b"\xff\xfe", "body is not JSON"),
        ("filter", _nested(100), "nested deeper than 64 levels"),
        ("filter", _nested(100_000), "nested too deeply"),
        ("bind", b"[" * 100_000, "nested too deeply"),
        ("filter", b" " * (wire.MAX_BODY_BYTES + 1), f"larger than {wire.MAX_BODY_BYTES} bytes"),
        ("bind", b'"' + b"x" * wire.MAX_BODY_BYTES + b'"', "larger than"),
        ("filter", {"Pod": {"metadata": {}, "spec": {"containers": "x"}}}, "list of objects"),
        ("filter", {"Pod": {"metadata": {"annotations": "x"}}}, "metadata.annotations"),
        ("filter", {"Pod": {"metadata": {}, "spec": {"nodeSelector": "x"}}}, "nodeSelector"),
        ("prioritize", {"Pod": {"metadata": {}}, "NodeNames": "a"}, "NodeNames"),
        ("bind", {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": ["t"]}, "Node"),
        ("bind", binding_args("p" * 254, "t"), "PodName must be a string of 1 to 253"),
    ],
)
def test_malformed_bodies_get_400_with_a_short_message(
    pki: ExtenderPki, verb: str, body: Any, message: str
) -> None:
    rec = Recorder()
    app, context = served(service(rec), pki)
    with serving(app, context) as port:
        status, out = post(port, pki.client_context(), verb, body)
    assert status == 400
    assert message in out["Error"]
    assert len(out["Error"]) < 200
    assert rec.bound == {}


def test_a_fault_answers_500_without_its_text(
    pki: ExtenderPki, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = service(Recorder())

    def broken(*_: Any) -> Any:
        raise RuntimeError("token=hunter2")

    monkeypatch.setattr(svc, "filter", broken)
    app, context = served(svc, pki)
    with serving(app, context) as port:
        status, out = post(port, pki.client_context(), "filter", filter_args("p"))
        assert (status, out) == (500, {"Error": "internal error"})
        assert call(port, pki.client_context(), "GET", "/healthz") == (200, b"ok")


def _api_exception(status: int, reason: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.headers = {"Audit-Id": "0b1d", "Content-Type": "application/json"}
    exc.body = '{"kind":"Status","message":"pods \\"other-tenant-secret\\" is forbidden"}'
    return exc


def _raising(exc: Exception) -> Callable[..., Any]:
    def fn(*_: Any) -> Any:
        raise exc

    return fn


def _chained(exc: ApiException) -> BindError:
    try:
        raise BindError(f"binding ns/p to t failed: {exc.reason}") from exc
    except BindError as err:
        return err


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_api_exception(409, "Conflict"), "409 Conflict"),
        (_chained(_api_exception(403, "Forbidden")), "403 Forbidden"),
        (BindError("node t: device-plugin allocation lock held by h@1"), "lock held by h@1"),
        (ConnectionRefusedError("10.96.0.1:443 refused"), "ConnectionRefusedError"),
    ],
)
def test_api_errors_are_summarised_to_status_and_reason(error: Exception, expected: str) -> None:
    summary = api_error_summary(error, own=(BindError,))
    assert expected in summary
    assert "other-tenant-secret" not in summary
    assert "Audit-Id" not in summary
    assert "10.96.0.1" not in summary


def test_a_failed_bind_tells_kube_scheduler_status_and_reason_only(pki: ExtenderPki) -> None:
    """The API server's answer (headers, body) never reaches the caller: pod events show it."""
    svc = service(Recorder())
    svc.bind_fn = short_errors(
        _raising(_chained(_api_exception(409, "Conflict"))), "binding failed: ", own=(BindError,)
    )
    svc.fetch_pod = short_errors(_raising(_api_exception(404, "Not Found")))
    app, context = served(svc, pki)
    with serving(app, context) as port:
        client = pki.client_context()
        status, out = post(port, client, "filter", filter_args("p"))
        (chosen,) = out["NodeNames"]
        status, out = post(port, client, "bind", binding_args("p", chosen))
        assert (status, out) == (200, {"Error": "binding failed: 409 Conflict"})
        # a bind this process never filtered reads the pod first
        status, out = post(port, client, "bind", binding_args("never-filtered", "t"))
        assert (status, out) == (200, {"Error": "cannot read pod ns/never-filtered: 404 Not Found"})


def test_short_errors_passes_results_through_and_raises_its_own_error() -> None:
    seen: list[BindRequest] = []
    assert short_errors(seen.append)(BindRequest("ns", "p", "u", "t", None)) is None
    assert len(seen) == 1
    with pytest.raises(ApiCallError, match=r"^x: 500 Internal$") as info:
        short_errors(_raising(_api_exception(500, "Internal")), "x: ")()
    assert info.value.__cause__ is None  # the client's error (and its body) is not chained


def test_the_extender_will_not_start_without_its_certificates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pki: ExtenderPki
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["scheduler", "--policy", "fgd"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--tls-cert-file" in err
    assert "--client-ca-file" in err
    # a certificate file that is not one stops the start before any API call
    (tmp_path / "bad.crt").write_text("not a certificate")
    code = main(
        [
            "scheduler",
            *("--kubeconfig", str(tmp_path / "no-such-kubeconfig")),
            *("--tls-cert-file", str(tmp_path / "bad.crt")),
            *("--tls-private-key-file", str(pki.serving_key)),
            *("--client-ca-file", str(pki.ca_cert)),
        ]
    )
    assert code == 2
