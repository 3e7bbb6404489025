"""Admin kubeconfig for a local cluster, with the credentials embedded so the file travels alone."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from chronotope.devcluster.pki import Pki

__all__ = ["write_kubeconfig"]


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, name: str, server: str, pki: Pki) -> Path:
    """Write the admin kubeconfig for cluster `name` at `server` to `path` (mode 0600)."""
    context = f"chronotope-{name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": f"{context}-admin",
                "user": {
                    "client-certificate-data": _b64(pki.admin_cert),
                    "client-key-data": _b64(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": f"{context}-admin"}}
        ],
        "current-context": context,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
