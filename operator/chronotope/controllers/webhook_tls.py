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
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _generate(hosts: Sequence[str], now: dt.datetime) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key) as PEM."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GENERATED_CA_NAME)])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, VALIDITY * 2)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    serving = (
        _builder(subject, ca_name, key.public_key(), now, VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return (
        ca.public_bytes(serialization.Encoding.PEM),
        serving.public_bytes(serialization.Encoding.PEM),
        key_pem,
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: dt.datetime,
    validity: dt.timedelta,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
    )
