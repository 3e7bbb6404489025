"""The pure pieces of running components under the chart's identities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chronotope.devcluster.identities import (
    ChartIdentities,
    helm_template_argv,
    rbac_documents,
    token_kubeconfig,
)

ADMIN: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {"name": "other", "cluster": {"server": "https://10.0.0.1:6443"}},
        {
            "name": "chronotope-dev",
            "cluster": {
                "server": "https://127.0.0.1:40001",
                "certificate-authority-data": "Q0E=",
                "tls-server-name": "ignored-extra",
            },
        },
    ],
    "users": [
        {
            "name": "chronotope-dev-admin",
            "user": {"client-certificate-data": "Q0VSVA==", "client-key-data": "S0VZ"},
        }
    ],
    "contexts": [
        {"name": "chronotope-dev", "context": {"cluster": "chronotope-dev", "user": "x"}},
        {"name": "elsewhere", "context": {"cluster": "other", "user": "y"}},
    ],
    "current-context": "chronotope-dev",
}
USER = "system:serviceaccount:chronotope-system:chronotope-operator"


def test_token_kubeconfig_keeps_server_and_ca_and_drops_the_admin_credentials() -> None:
    config = token_kubeconfig(ADMIN, USER, "tok123")
    assert config["clusters"] == [
        {
            "name": "chronotope-dev",
            "cluster": {"server": "https://127.0.0.1:40001", "certificate-authority-data": "Q0E="},
        }
    ]
    assert config["users"] == [{"name": USER, "user": {"token": "tok123"}}]
    [context] = config["contexts"]
    assert config["current-context"] == context["name"] == "chronotope-dev-chronotope-operator"
    assert context["context"] == {"cluster": "chronotope-dev", "user": USER}
    assert "client-key-data" not in str(config)


@pytest.mark.parametrize(
    ("admin", "token", "error"),
    [
        (ADMIN, "", "empty token"),
        (ADMIN | {"current-context": "nope"}, "t", "no current context"),
        ({k: v for k, v in ADMIN.items() if k != "current-context"}, "t", "no current context"),
        (ADMIN | {"clusters": []}, "t", "no cluster 'chronotope-dev'"),
    ],
    ids=["empty-token", "unknown-context", "no-context", "missing-cluster"],
)
def test_token_kubeconfig_refuses_bad_input(admin: dict[str, Any], token: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        token_kubeconfig(admin, USER, token)


RENDERED = """\
---
# Source: chronotope/templates/serviceaccounts.yaml
apiVersion: v1
kind: ServiceAccount
metadata: {name: r-operator, namespace: ns}
---
# Source: chronotope/templates/rbac.yaml
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: r-operator}
rules: []
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: r-auth, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: []
"""


def test_rbac_documents_reads_every_object_and_skips_empty_documents() -> None:
    docs = rbac_documents(RENDERED + "---\n")
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ServiceAccount", "r-operator"),
        ("ClusterRole", "r-operator"),
        ("RoleBinding", "r-auth"),
    ]


@pytest.mark.parametrize(
    ("rendered", "error"),
    [
        (
            RENDERED + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
            "Deployment",
        ),
        ("---\n# nothing\n", "rendered nothing"),
        ("- a list\n", "list"),
    ],
    ids=["workload", "empty", "not-a-mapping"],
)
def test_rbac_documents_refuses_anything_but_rbac(rendered: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        rbac_documents(rendered)


def test_helm_template_renders_only_the_rbac_templates() -> None:
    argv = helm_template_argv(
        Path("/bin/helm"), Path("charts/chronotope"), "rel", "ns-1", "v1.33.13"
    )
    assert argv == [
        "/bin/helm",
        "template",
        "rel",
        "charts/chronotope",
        "--namespace",
        "ns-1",
        "--kube-version",
        "v1.33.13",
        "--show-only",
        "templates/serviceaccounts.yaml",
        "--show-only",
        "templates/rbac.yaml",
    ]


@pytest.mark.parametrize(("release", "namespace"), [("Rel", "ns"), ("rel", "ns_1"), ("", "ns")])
def test_helm_template_refuses_names_that_are_not_dns_labels(release: str, namespace: str) -> None:
    with pytest.raises(ValueError, match="not a DNS label"):
        helm_template_argv(Path("helm"), Path("chart"), release, namespace, "v1.33.13")


def test_chart_identities_name_the_charts_service_accounts(tmp_path: Path) -> None:
    ids = ChartIdentities(release="chronotope", namespace="chronotope-system", directory=tmp_path)
    assert ids.service_account("device-plugin") == "chronotope-device-plugin"
    assert ids.username("scheduler") == (
        "system:serviceaccount:chronotope-system:chronotope-scheduler"
    )
    assert ids.kubeconfig("operator") == tmp_path / "chronotope-operator.kubeconfig"
    with pytest.raises(ValueError, match="unknown component 'extender'"):
        ids.kubeconfig("extender")
