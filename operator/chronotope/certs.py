"""X.509 certificates with `cryptography`: the one signer for every certificate Chronotope makes.

The local control plane's PKI (`devcluster.pki`) and the admission webhook's
self-signed serving certificate (`controllers.webhook_tls`) both sign here. Pure:
keys and names in, certificates and PEM bytes out; nothing is written.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

__all__ = ["authority", "cert_pem", "issue", "key_pem", "name", "new_key", "san", "sign"]

BACKDATE = dt.timedelta(minutes=5)
"""Certificates are valid from a little before `now`, for clocks slightly behind."""


def name(cn: str, org: str | None = None) -> x509.Name:
    """A subject or issuer name: CN, and O when given (Kubernetes reads O as a group)."""
    attrs = [x509.NameAttribute(x509.NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(x509.NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def san(host: str) -> x509.GeneralName:
    """A subjectAltName entry: an IP address when `host` parses as one, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    now: dt.datetime,
    validity: dt.timedelta,
    ca: bool = False,
    path_length: int | None = None,
    usages: Sequence[x509.ObjectIdentifier] = (),
    sans: Sequence[x509.GeneralName] = (),
) -> x509.Certificate:
    """A certificate for `subject` signed by `issuer_key`, valid from `now` for `validity`.

    A CA (`ca`) may sign certificates and CRLs (`path_length` limits the chain
    below it); `usages` are extended key usages; `sans` subject alternative names.
    """
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
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
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def new_key() -> ec.EllipticCurvePrivateKey:
    """A new P-256 private key (every key Chronotope makes, but the service-account one)."""
    return ec.generate_private_key(ec.SECP256R1())


def authority(
    cn: str, *, now: dt.datetime, validity: dt.timedelta, path_length: int | None = None
) -> tuple[x509.Name, x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new self-signed CA named `cn`: its name, certificate and key."""
    key = new_key()
    ca_name = name(cn)
    cert = sign(
        ca_name,
        key.public_key(),
        ca_name,
        key,
        now=now,
        validity=validity,
        ca=True,
        path_length=path_length,
    )
    return ca_name, cert, key


def issue(
    subject: x509.Name,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    now: dt.datetime,
    validity: dt.timedelta,
    usages: Sequence[x509.ObjectIdentifier] = (),
    sans: Sequence[x509.GeneralName] = (),
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new key and its certificate for `subject`, signed by `issuer_key` (a leaf)."""
    key = new_key()
    cert = sign(
        subject,
        key.public_key(),
        issuer,
        issuer_key,
        now=now,
        validity=validity,
        usages=usages,
        sans=sans,
    )
    return cert, key


def key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    """An unencrypted PKCS#8 PEM private key."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    """A certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)
