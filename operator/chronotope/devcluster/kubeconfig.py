"""Kubeconfigs for a local cluster, with the credentials embedded so the file travels alone.

`kubeconfig_doc` is the one shape (one cluster, one user, one context) of the
admin kubeconfig here and of the chart identities' token kubeconfigs
(`devcluster.identities`); `write_config` writes either with mode 0600.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from chronotope.devcluster.pki import Pki

__all__ = ["kubeconfig_doc", "write_config", "write_kubeconfig"]


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_doc(
    context: str,
    cluster_name: str,
    cluster: Mapping[str, Any],
    user_name: str,
    user: Mapping[str, Any],
) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user and the context joining them (current)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": dict(cluster)}],
        "users": [{"name": user_name, "user": dict(user)}],
        "contexts": [{"name": context, "context": {"cluster": cluster_name, "user": user_name}}],
        "current-context": context,
    }


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a kubeconfig readable by its owner only (mode 0600 before any secret is in it)."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


def write_kubeconfig(path: Path, name: str, server: str, pki: Pki) -> Path:
    """Write the admin kubeconfig for cluster `name` at `server` to `path` (mode 0600)."""
    context = f"chronotope-{name}"
    cluster = {"server": server, "certificate-authority-data": _b64(pki.ca_cert)}
    user = {
        "client-certificate-data": _b64(pki.admin_cert),
        "client-key-data": _b64(pki.admin_key),
    }
    return write_config(path, kubeconfig_doc(context, context, cluster, f"{context}-admin", user))
