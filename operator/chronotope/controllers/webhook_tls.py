"""The admission webhook's serving certificate: a directory of PEM files, or a generated one.

The API server calls admission webhooks over HTTPS only, trusting the CA
bundle in the webhook registration. `--webhook-cert-dir` holds `tls.crt` and
`tls.key` (a mounted Secret from cert-manager or from the Helm chart). When
the directory has neither, `ensure_certificates` generates a self-signed CA
and a serving certificate for the `--webhook-host` names and addresses
(with `cryptography`), writing `ca.crt` (the registration's caBundle),
`tls.crt` and `tls.key` (0600). A certificate generated here is generated
again when it no longer covers the hosts or is within `RENEW_BEFORE` of
expiry; a certificate from elsewhere is never touched.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from chronotope import certs

__all__ = ["GENERATED_CA_NAME", "RENEW_BEFORE", "CertFiles", "ensure_certificates"]

log = logging.getLogger(__name__)

GENERATED_CA_NAME = "chronotope-webhook-self-signed-ca"
VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class CertFiles:
    """The serving certificate and key, and the CA bundle when this process made it."""

    cert: Path
    key: Path
    ca: Path | None = None


def ensure_certificates(
    directory: Path, hosts: Sequence[str], now: dt.datetime | None = None
) -> CertFiles:
    """The certificate files in `directory`, generated first when it has none (see module).

    Raises ValueError when the directory holds only one of `tls.crt` / `tls.key`,
    or when it needs generating and `hosts` is empty; OSError when it cannot be
    written (a read-only mounted Secret that lacks the files).
    """
    now = now or dt.datetime.now(dt.UTC)
    cert, key, ca = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    if cert.exists() != key.exists():
        raise ValueError(f"{directory} has one of tls.crt and tls.key but not the other")
    if cert.exists() and not _regenerate(cert, hosts, now):
        return CertFiles(cert, key, ca if ca.exists() else None)
    if not hosts:
        raise ValueError("no --webhook-host to generate the webhook's certificate for")
    directory.mkdir(parents=True, exist_ok=True)
    ca_pem, cert_pem, key_pem = _generate(hosts, now)
    _write(ca, ca_pem, 0o644)
    _write(key, key_pem, 0o600)
    _write(cert, cert_pem, 0o644)
    log.info(
        "generated a self-signed webhook certificate for %s in %s", ", ".join(hosts), directory
    )
    return CertFiles(cert, key, ca)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


def _regenerate(cert_path: Path, hosts: Sequence[str], now: dt.datetime) -> bool:
    """Whether an existing certificate is one this module made that no longer fits."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    issuer = cert.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not issuer or issuer[0].value != GENERATED_CA_NAME:
        return False
    if cert.not_valid_after_utc - RENEW_BEFORE < now:
        return True
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    covered = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    covered |= set(sans.get_values_for_type(x509.DNSName))
    return not {_canonical(h) for h in hosts} <= covered


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _generate(hosts: Sequence[str], now: dt.datetime) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key) as PEM."""
    ca_name, ca, ca_key = certs.authority(
        GENERATED_CA_NAME, now=now, validity=VALIDITY * 2, path_length=0
    )
    serving, key = certs.issue(
        certs.name(hosts[0]),
        ca_name,
        ca_key,
        now=now,
        validity=VALIDITY,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[certs.san(h) for h in hosts],
    )
    return certs.cert_pem(ca), certs.cert_pem(serving), certs.key_pem(key)
