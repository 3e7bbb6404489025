"""Run the local cluster's components under the Helm chart's ServiceAccounts.

In a real install each component is a pod with its own ServiceAccount and the
chart's least-privilege RBAC (charts/chronotope, docs/install.md). The local
cluster runs the same components as processes; with `ChartIdentities` they
authenticate as those ServiceAccounts instead of as cluster-admin, so every
flow the end-to-end tests drive also proves the chart grants enough.

`setup_chart_identities` renders ONLY the chart's ServiceAccounts and RBAC
(`helm template --show-only`), applies them with the admin kubeconfig, asks the
TokenRequest API for one token per component and writes one kubeconfig per
component (the admin kubeconfig's server and CA, the token as the user). The
tokens are not refreshed: they live `expiry_s` (24 h by default), far longer
than a test session or a demo; a longer-lived cluster needs `chronotope dev
cluster up --chart-identities` again.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from chronotope.devcluster.kubeconfig import kubeconfig_doc, write_config

__all__ = [
    "COMPONENTS",
    "DEFAULT_NAMESPACE",
    "DEFAULT_RELEASE",
    "RBAC_KINDS",
    "TOKEN_EXPIRY_S",
    "ChartIdentities",
    "helm_template_argv",
    "rbac_documents",
    "setup_chart_identities",
    "token_kubeconfig",
]

COMPONENTS = ("operator", "scheduler", "device-plugin")
"""The chart's ServiceAccounts are `<release>-<component>` (templates/serviceaccounts.yaml)."""

DEFAULT_RELEASE = "chronotope"
DEFAULT_NAMESPACE = "chronotope-system"
TOKEN_EXPIRY_S = 24 * 3600
RBAC_KINDS = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
_RBAC_TEMPLATES = ("templates/serviceaccounts.yaml", "templates/rbac.yaml")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class ChartIdentities:
    """The chart's ServiceAccounts in one release, and a token kubeconfig for each."""

    release: str
    namespace: str
    directory: Path
    """Where the per-component kubeconfigs are (`<component>.kubeconfig`)."""

    def service_account(self, component: str) -> str:
        """The component's ServiceAccount name; ValueError for an unknown component."""
        if component not in COMPONENTS:
            raise ValueError(f"unknown component {component!r}; one of {', '.join(COMPONENTS)}")
        return f"{self.release}-{component}"

    def username(self, component: str) -> str:
        """The user the API server sees for the component's token."""
        return f"system:serviceaccount:{self.namespace}:{self.service_account(component)}"

    def kubeconfig(self, component: str) -> Path:
        """The kubeconfig that authenticates as the component's ServiceAccount."""
        return self.directory / f"{self.service_account(component)}.kubeconfig"


def helm_template_argv(
    helm: Path, chart: Path, release: str, namespace: str, kube_version: str
) -> list[str]:
    """`helm template` rendering only the chart's ServiceAccounts and RBAC.

    `kube_version` is the cluster's (the chart declares a minimum; offline,
    helm would assume an old default). Raises ValueError when the release or
    namespace is not a DNS label.
    """
    for what, value in (("release", release), ("namespace", namespace)):
        if not _DNS_LABEL.match(value):
            raise ValueError(f"{what} {value!r} is not a DNS label (lower-case a-z, 0-9, '-')")
    argv = [str(helm), "template", release, str(chart), "--namespace", namespace]
    argv += ["--kube-version", kube_version]
    for template in _RBAC_TEMPLATES:
        argv += ["--show-only", template]
    return argv


def rbac_documents(rendered: str) -> list[dict[str, Any]]:
    """The objects of a rendered `helm template`, checked to be RBAC objects only.

    Pure. Raises ValueError for any other kind, so a template change that adds a
    workload to these files cannot slip into the cluster as a side effect.
    """
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") not in RBAC_KINDS:
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"the chart's RBAC templates rendered a {kind}, not an RBAC object")
    if not docs:
        raise ValueError("the chart's RBAC templates rendered nothing")
    return docs


def token_kubeconfig(admin: Mapping[str, Any], user: str, token: str) -> dict[str, Any]:
    """A kubeconfig with the admin kubeconfig's cluster (server + CA) and `token` as `user`.

    Pure. Raises ValueError when `admin` has no current context or its cluster
    is missing, or when the token is empty.
    """
    if not token:
        raise ValueError(f"empty token for {user}")
    current = admin.get("current-context")
    contexts = {c["name"]: c["context"] for c in admin.get("contexts") or []}
    if current not in contexts:
        raise ValueError(f"the admin kubeconfig has no current context (found {current!r})")
    cluster_name = contexts[current]["cluster"]
    clusters = {c["name"]: c["cluster"] for c in admin.get("clusters") or []}
    if cluster_name not in clusters:
        raise ValueError(f"the admin kubeconfig has no cluster {cluster_name!r}")
    cluster = clusters[cluster_name]
    kept = {k: cluster[k] for k in ("server", "certificate-authority-data") if k in cluster}
    context = f"{cluster_name}-{user.rsplit(':', 1)[-1]}"
    return kubeconfig_doc(context, cluster_name, kept, user, {"token": token})


def render_chart_rbac(
    helm: Path, chart: Path, release: str, namespace: str, kube_version: str
) -> list[dict[str, Any]]:
    """Run `helm template` for the chart's ServiceAccounts and RBAC; RuntimeError on failure."""
    argv = helm_template_argv(helm, chart, release, namespace, kube_version)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed: {out.stderr.strip()}")
    return rbac_documents(out.stdout)


def setup_chart_identities(
    admin_kubeconfig: Path,
    helm: Path,
    chart: Path,
    directory: Path,
    *,
    kube_version: str,
    release: str = DEFAULT_RELEASE,
    namespace: str = DEFAULT_NAMESPACE,
    expiry_s: int = TOKEN_EXPIRY_S,
) -> ChartIdentities:
    """Apply the chart's ServiceAccounts and RBAC, and write a token kubeconfig per component.

    Idempotent: applying again replaces the objects and mints fresh tokens.
    """
    from chronotope.kube.client import api_client
    from chronotope.kube.rbac import apply_rbac, request_token
    from chronotope.kube.replay import ensure_namespace

    objects = render_chart_rbac(helm, chart, release, namespace, kube_version)
    identities = ChartIdentities(release=release, namespace=namespace, directory=directory)
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    directory.mkdir(parents=True, exist_ok=True)
    with api_client(admin_kubeconfig) as api:
        ensure_namespace(api, namespace)
        apply_rbac(api, objects)
        for component in COMPONENTS:
            token = request_token(api, namespace, identities.service_account(component), expiry_s)
            config = token_kubeconfig(admin, identities.username(component), token)
            write_config(identities.kubeconfig(component), config)
    return identities
