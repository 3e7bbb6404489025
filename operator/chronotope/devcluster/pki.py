"""Certificates and keys for a local control plane.

One throwaway CA per cluster signs the apiserver's serving certificate and an
admin client certificate (group system:masters); a separate RSA key pair signs
service-account tokens. Everything is written with 0600 permissions into the
cluster's state directory and dies with it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "generate_pki"]

_VALIDITY = dt.timedelta(days=365)
_SERVICE_IP = "10.96.0.1"  # first address of the service CIDR the apiserver is given


@dataclass(frozen=True)
class Pki:
    """Paths of the cluster's CA, serving, admin and service-account key material."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public: Path
    sa_private: Path


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
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
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate_pki(directory: Path) -> Pki:
    """Create a CA, serving and admin certificates, and the service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("chronotope-local-ca")
    ca = _sign(ca_name, ca_key, ca_name, ca_key, ca=True)

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", _SERVICE_IP)]
    serving = _sign(
        _name("kube-apiserver"),
        serving_key,
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _sign(
        _name("chronotope-admin", "system:masters"),
        admin_key,
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return Pki(
        ca_cert=_write(directory / "ca.crt", _cert_pem(ca)),
        serving_cert=_write(directory / "apiserver.crt", _cert_pem(serving)),
        serving_key=_write(directory / "apiserver.key", _key_pem(serving_key)),
        admin_cert=_write(directory / "admin.crt", _cert_pem(admin)),
        admin_key=_write(directory / "admin.key", _key_pem(admin_key)),
        sa_public=_write(directory / "sa.pub", sa_pub),
        sa_private=_write(directory / "sa.key", _key_pem(sa_key)),
    )
