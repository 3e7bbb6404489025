"""The webhook's certificates (controllers.webhook_tls) and its HTTPS edge (controllers.webhook),
over real TLS on loopback."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from chronotope.controllers import webhook
from chronotope.controllers.webhook import WebhookServer, WebhookSettings
from chronotope.controllers.webhook_tls import ensure_certificates
from chronotope.devcluster.pki import generate_pki
from chronotope.kube.admission import pod_template_types
from tests.unit.workloads.test_admission import FakeLookups, job


def _sans(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return ips | set(sans.get_values_for_type(x509.DNSName))


def test_an_empty_directory_gets_a_self_signed_ca_and_serving_certificate(tmp_path: Path) -> None:
    files = ensure_certificates(tmp_path / "w", ["127.0.0.1", "op.ns.svc"])
    assert files.ca == tmp_path / "w" / "ca.crt"
    assert _sans(files.cert) == {"127.0.0.1", "op.ns.svc"}
    assert files.key.stat().st_mode & 0o777 == 0o600
    serving = x509.load_pem_x509_certificate(files.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    serving.verify_directly_issued_by(ca)
    ctx = ssl.create_default_context(cafile=str(files.ca))  # the pair loads as a chain
    ctx.load_cert_chain(files.cert, files.key)


def test_a_generated_certificate_is_kept_until_it_no_longer_fits(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, ["127.0.0.1"])
    pem = first.cert.read_bytes()
    assert ensure_certificates(tmp_path, ["127.0.0.1"]).cert.read_bytes() == pem
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)  # within 30 days of expiry
    assert ensure_certificates(tmp_path, ["127.0.0.1"], now=later).cert.read_bytes() != pem
    ensure_certificates(tmp_path, ["localhost"])
    assert _sans(tmp_path / "tls.crt") == {"localhost"}


def test_a_certificate_from_elsewhere_is_never_replaced(tmp_path: Path) -> None:
    pki = generate_pki(tmp_path / "pki")  # another CA's serving certificate (the apiserver's)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "tls.crt").write_bytes(pki.serving_cert.read_bytes())
    (mine / "tls.key").write_bytes(pki.serving_key.read_bytes())
    far = dt.datetime.now(dt.UTC) + dt.timedelta(days=3650)  # expired, and other hosts
    kept = ensure_certificates(mine, ["op.ns.svc"], now=far)
    assert kept.cert.read_bytes() == pki.serving_cert.read_bytes()
    assert kept.ca is None
    assert sorted(p.name for p in mine.iterdir()) == ["tls.crt", "tls.key"]


def test_half_a_key_pair_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    with pytest.raises(ValueError, match=r"one of tls\.crt and tls\.key"):
        ensure_certificates(tmp_path, ["127.0.0.1"])
    with pytest.raises(ValueError, match="no --webhook-host"):
        ensure_certificates(tmp_path / "empty", [])


def _post(port: int, path: str, body: bytes, ca: Path) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(webhook, "RELOAD_EVERY_S", 0.05)
    files = ensure_certificates(tmp_path, ["127.0.0.1"])
    settings = WebhookSettings(0, "127.0.0.1", files.cert, files.key)
    srv = WebhookServer(settings, FakeLookups(), pod_template_types())
    srv.start()
    try:
        yield srv, files
    finally:
        srv.stop()


def _review(obj: dict[str, Any]) -> bytes:
    request = {
        "uid": "abc",
        "kind": {"group": "chronotope.dev", "version": "v1alpha1", "kind": "TrainingJob"},
        "namespace": "ns",
        "operation": "CREATE",
        "object": obj,
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body).encode()


def test_the_server_answers_admission_reviews_over_tls(server: Any) -> None:
    srv, files = server
    status, out = _post(
        srv.port, "/validate", _review(job(template={"spec": {"containers": 1}})), files.ca
    )
    assert status == 200
    assert out["response"]["uid"] == "abc"
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["message"].startswith("spec.template.spec.containers: ")
    status, out = _post(srv.port, "/mutate", _review(job()), files.ca)
    assert (status, out["response"]["allowed"], out["response"]["patchType"]) == (
        200,
        True,
        "JSONPatch",
    )
    assert _post(srv.port, "/validate", b"{not json", files.ca)[0] == 400
    assert _post(srv.port, "/validate", b'{"kind": "AdmissionReview"}', files.ca)[0] == 400
    ctx = ssl.create_default_context(cafile=str(files.ca))
    with urllib.request.urlopen(f"https://127.0.0.1:{srv.port}/healthz", context=ctx) as resp:
        assert resp.read() == b"ok"


def test_a_renewed_certificate_is_served_without_a_restart(server: Any, tmp_path: Path) -> None:
    srv, files = server
    renewed = ensure_certificates(tmp_path / "renewed", ["127.0.0.1"])
    for name in ("tls.key", "tls.crt"):
        (files.cert.parent / name).write_bytes((renewed.cert.parent / name).read_bytes())
    deadline = time.monotonic() + 30
    while True:
        try:
            status, _ = _post(srv.port, "/mutate", _review(job()), renewed.ca)  # type: ignore[arg-type]
            break
        except urllib.error.URLError:  # still the old certificate: not trusted by the new CA
            assert time.monotonic() < deadline, "the renewed certificate was never served"
            time.sleep(0.05)
    assert status == 200
