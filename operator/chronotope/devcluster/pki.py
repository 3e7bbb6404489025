"""Certificates and keys for a local control plane.

One throwaway CA per cluster signs the apiserver's serving certificate and an
admin client certificate (group system:masters); a separate RSA key pair signs
service-account tokens. Everything is written with 0600 permissions into the
cluster's state directory and dies with it.

The scheduler extender has a CA of its own (`extender_pki`): it signs the
extender's serving certificate and kube-scheduler's client certificate, and the
extender accepts callers with a certificate from that CA only (docs/extender.md).
A CA of its own, not the cluster's, so that no other client certificate of the
cluster (the admin's, say) can call the extender.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from chronotope.certs import authority, cert_pem, issue, key_pem, name, san

__all__ = [
    "EXTENDER_CA_NAME",
    "ExtenderPki",
    "Pki",
    "extender_pki",
    "generate_pki",
    "scheduler_client",
]

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


def generate_pki(directory: Path) -> Pki:
    """Create a CA, serving and admin certificates, and the service-account keys."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_name, ca, ca_key = authority("chronotope-local-ca", now=now, validity=_VALIDITY)
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
    serving, serving_key = issue(
        name("kube-apiserver"),
        ca_name,
        ca_key,
        now=now,
        validity=_VALIDITY,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    admin, admin_key = issue(
        name("chronotope-admin", "system:masters"),
        ca_name,
        ca_key,
        now=now,
        validity=_VALIDITY,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return Pki(
        ca_cert=_write(directory / "ca.crt", cert_pem(ca)),
        serving_cert=_write(directory / "apiserver.crt", cert_pem(serving)),
        serving_key=_write(directory / "apiserver.key", key_pem(serving_key)),
        admin_cert=_write(directory / "admin.crt", cert_pem(admin)),
        admin_key=_write(directory / "admin.key", key_pem(admin_key)),
        sa_public=_write(directory / "sa.pub", sa_pub),
        sa_private=_write(directory / "sa.key", key_pem(sa_key)),
    )


@dataclass(frozen=True)
class ExtenderPki:
    """Paths of the extender's CA, its serving certificate and kube-scheduler's client one."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    client_cert: Path
    client_key: Path

    def server_args(self) -> list[str]:
        """The `chronotope scheduler` flags that serve with these certificates."""
        return [
            *("--tls-cert-file", str(self.serving_cert)),
            *("--tls-private-key-file", str(self.serving_key)),
            *("--client-ca-file", str(self.ca_cert)),
        ]

    def tls_config(self) -> dict[str, str]:
        """The extender's `tlsConfig` in a KubeSchedulerConfiguration (client cert, CA)."""
        return {
            "certFile": str(self.client_cert),
            "keyFile": str(self.client_key),
            "caFile": str(self.ca_cert),
        }

    def client_context(self) -> ssl.SSLContext:
        """A TLS context that calls the extender as kube-scheduler does (tests, benches)."""
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


EXTENDER_CA_NAME = "chronotope-extender-ca"
"""The CN of the CA that signs the extender's serving and kube-scheduler's client certificate."""


def scheduler_client(
    ca_name: x509.Name,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    now: dt.datetime,
    validity: dt.timedelta,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """kube-scheduler's client certificate for the extender (CN kube-scheduler), and its key."""
    return issue(
        name("kube-scheduler"),
        ca_name,
        ca_key,
        now=now,
        validity=validity,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )


def extender_pki(directory: Path) -> ExtenderPki:
    """The extender's certificates in `directory`, created on first use and kept after.

    Kept, so that an extender restarted on its own still trusts the client
    certificate the running kube-scheduler loaded. The serving certificate names
    127.0.0.1 and localhost; the client certificate is kube-scheduler's.
    """
    pki = ExtenderPki(
        ca_cert=directory / "ca.crt",
        serving_cert=directory / "extender.crt",
        serving_key=directory / "extender.key",
        client_cert=directory / "kube-scheduler.crt",
        client_key=directory / "kube-scheduler.key",
    )
    if all(path.exists() for path in vars(pki).values()):
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_name, ca, ca_key = authority(EXTENDER_CA_NAME, now=now, validity=_VALIDITY)
    serving, serving_key = issue(
        name("chronotope-extender"),
        ca_name,
        ca_key,
        now=now,
        validity=_VALIDITY,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[san("127.0.0.1"), san("localhost")],
    )
    client, client_key = scheduler_client(ca_name, ca_key, now=now, validity=_VALIDITY)
    # a partly written directory (a crash here) lacks a file, so it is made again
    _write(pki.serving_key, key_pem(serving_key))
    _write(pki.client_key, key_pem(client_key))
    _write(pki.serving_cert, cert_pem(serving))
    _write(pki.client_cert, cert_pem(client))
    _write(pki.ca_cert, cert_pem(ca))
    return pki
