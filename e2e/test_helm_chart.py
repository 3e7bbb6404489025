"""The Helm chart: lint, render with several value sets and have the real API server
validate the output, install and uninstall cleanly, and least-privilege RBAC."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubetest import KubeCluster, wait_for

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "chronotope"


def _helm(cluster: KubeCluster) -> str:
    from chronotope.devcluster.binaries import ensure_binaries

    assert cluster.local is not None
    return str(ensure_binaries(cluster.local.settings, build=False).helm)


def _run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def _server_version(cluster: KubeCluster) -> str:
    out = _run(*cluster.kubectl, "version", "-o", "json")
    return str(json.loads(out.stdout)["serverVersion"]["gitVersion"]).lstrip("v")


def test_the_chart_crds_are_the_generated_ones() -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        assert (CHART / "crds" / path.name).read_text() == path.read_text(), (
            f"charts/chronotope/crds/{path.name} drifted: cp crds/*.yaml charts/chronotope/crds/"
        )


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([], id="defaults"),
        pytest.param(
            ["--set", "devicePlugin.enabled=false", "--set", "operator.dashboardPort=8090"],
            id="no-device-plugin-dashboard",
        ),
        pytest.param(
            ["--set", "scheduler.kubeSchedulerImage=registry.example/ks:v1.33.0"], id="pinned"
        ),
        pytest.param(["--set", "webhook.enabled=false"], id="no-webhook"),
        pytest.param(
            ["--set", "webhook.failurePolicy=Ignore", "--set", "webhook.timeoutSeconds=10"],
            id="webhook-ignore",
        ),
    ],
)
def test_lint_and_render_are_accepted_by_the_api_server(
    kube_cluster: KubeCluster, values: list[str]
) -> None:
    helm = _helm(kube_cluster)
    lint = _run(helm, "lint", "--strict", str(CHART), *values)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    version = _server_version(kube_cluster)
    rendered = _run(
        helm,
        "template",
        "t",
        str(CHART),
        "--namespace",
        "default",
        "--kube-version",
        version,
        *values,
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    sched = next(
        d for d in docs if d["kind"] == "Deployment" and "scheduler" in d["metadata"]["name"]
    )
    image = sched["spec"]["template"]["spec"]["containers"][0]["image"]
    if "kubeSchedulerImage" not in str(values):
        major_minor = ".".join(version.split(".")[:2])
        assert image.startswith(f"registry.k8s.io/kube-scheduler:v{major_minor}.")
    applied = _run(
        *kube_cluster.kubectl, "apply", "--dry-run=server", "-f", "-", stdin=rendered.stdout
    )
    assert applied.returncode == 0, applied.stderr


def test_values_with_unknown_keys_or_wrong_types_are_refused(kube_cluster: KubeCluster) -> None:
    helm = _helm(kube_cluster)
    for bad, named in (
        (["--set", "operator.replicas=6"], "/operator/replicas"),
        (["--set", "nosuch=1"], "'nosuch' not allowed"),
        (["--set", "devicePlugin.enabled=maybe"], "/devicePlugin/enabled"),
        (["--set", "webhook.failurePolicy=Sometimes"], "/webhook/failurePolicy"),
        (["--set", "webhook.timeoutSeconds=60"], "/webhook/timeoutSeconds"),
        (["--set", "webhook.nosuch=1"], "'nosuch' not allowed"),
    ):
        out = _run(helm, "template", "t", str(CHART), "--kube-version", "1.33.0", *bad)
        assert out.returncode != 0, bad
        assert "values don't meet the specifications of the schema" in out.stderr
        assert named in out.stderr, (bad, out.stderr)  # the message names the key


def test_two_operator_replicas_elect_a_leader(kube_cluster: KubeCluster) -> None:
    helm = _helm(kube_cluster)
    values = ["--set", "operator.replicas=2"]
    lint = _run(helm, "lint", "--strict", str(CHART), *values)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = _run(
        helm, "template", "t", str(CHART), "--namespace", "ops", "--kube-version", "1.33.0", *values
    )
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    deploy = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "t-operator"
    )
    assert deploy["spec"]["replicas"] == 2
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert "--leader-elect" in args
    assert "--leader-election-namespace=ops" in args
    assert "--leader-election-id=t-operator" in args
    assert "--health-address=0.0.0.0" in args  # the kubelet probes the pod IP
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = next(d for d in docs if d["kind"] == "Role" and "leader" in d["metadata"]["name"])
    assert role["metadata"]["namespace"] == "ops"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    binding = next(
        d for d in docs if d["kind"] == "RoleBinding" and "leader" in d["metadata"]["name"]
    )
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == "t-operator"
    # the API server accepts it (in a namespace that exists, with the same render otherwise)
    in_default = _run(
        helm,
        "template",
        "t",
        str(CHART),
        "--namespace",
        "default",
        "--kube-version",
        _server_version(kube_cluster),
        *values,
    )
    assert in_default.returncode == 0, in_default.stderr
    applied = _run(
        *kube_cluster.kubectl, "apply", "--dry-run=server", "-f", "-", stdin=in_default.stdout
    )
    assert applied.returncode == 0, applied.stderr


def _render(cluster: KubeCluster, *values: str) -> list[dict[str, Any]]:
    out = _run(
        _helm(cluster), "template", "t", str(CHART), "--namespace", "default",
        "--kube-version", _server_version(cluster), *values,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return found


def test_the_webhook_objects_match_the_operator_and_its_registration(
    kube_cluster: KubeCluster,
) -> None:
    from cryptography import x509

    from chronotope.workloads.admission_wire import webhook_configurations

    docs = _render(kube_cluster)
    service = _one(docs, "Service", "t-operator-webhook")
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook"}]
    secret = _one(docs, "Secret", "t-webhook-tls")
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "t-operator-webhook.default.svc" in sans.get_values_for_type(x509.DNSName)
    # the same registration the local dev cluster writes (workloads.admission), at the Service
    client = {"service": {"namespace": "default", "name": "t-operator-webhook", "port": 443}}
    expected = webhook_configurations(
        "t-chronotope", client | {"caBundle": secret["data"]["ca.crt"]}
    )
    for want in expected:
        got = _one(docs, want["kind"])
        assert got["metadata"]["name"] == want["metadata"]["name"]
        assert got["webhooks"] == want["webhooks"]
    deploy = _one(docs, "Deployment", "t-operator")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"--webhook-port=9443", "--webhook-cert-dir=/etc/chronotope/webhook"} <= set(
        container["args"]
    )
    assert {"name": "webhook", "containerPort": 9443} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"] == {"secretName": "t-webhook-tls"}  # mounted: no RBAC on Secrets

    ignore = _render(kube_cluster, "--set", "webhook.failurePolicy=Ignore")
    hook = _one(ignore, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert hook["failurePolicy"] == "Ignore"
    assert _one(ignore, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"

    managed = _render(kube_cluster, "--set", "webhook.certManager=true")
    assert not [d for d in managed if d["kind"] == "Secret" and "webhook" in d["metadata"]["name"]]
    certificate = _one(managed, "Certificate", "t-webhook")
    assert certificate["spec"]["secretName"] == "t-webhook-tls"
    assert _one(managed, "Issuer", "t-webhook")["spec"] == {"selfSigned": {}}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        config = _one(managed, kind)
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "default/t-webhook"
        }
        assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    # the API server accepts all but cert-manager's own kinds (no cert-manager CRDs here)
    plain = [d for d in managed if not d["apiVersion"].startswith("cert-manager.io/")]
    applied = _run(
        *kube_cluster.kubectl, "apply", "--dry-run=server", "-f", "-",
        stdin=yaml.safe_dump_all(plain),
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr

    off = _render(kube_cluster, "--set", "webhook.enabled=false")
    assert not [d for d in off if "webhook" in d["metadata"]["name"].lower()]
    assert not [d for d in off if d["kind"].endswith("WebhookConfiguration")]
    off_pod = _one(off, "Deployment", "t-operator")["spec"]["template"]["spec"]
    assert not [a for a in off_pod["containers"][0]["args"] if a.startswith("--webhook")]
    assert [v["name"] for v in off_pod["volumes"]] == ["tmp"]  # no webhook certificate


def _a_users_training_job(kube_cluster: KubeCluster, namespace: str) -> Any:
    """Create TrainingJob `keep` (CRDs applied first); returns a reader of its uid ("": gone)."""
    applied = _run(
        *kube_cluster.kubectl, "apply", "--server-side", "--force-conflicts",
        "--field-manager=chronotope-tests", "-f", str(ROOT / "crds"),
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    wait_for(
        lambda: _run(*kube_cluster.kubectl, "get", "trainingjobs", "-A").returncode == 0,
        60,
        "TrainingJob CRD served",
    )
    keep = {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "keep", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "gpu": {"count": 1},
            "gpuTypes": [{"name": "NoSuchGPU", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "NoSuchGPU", "durationSeconds": 60},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
    }
    created = _run(*kube_cluster.kubectl, "create", "-f", "-", stdin=json.dumps(keep))
    assert created.returncode == 0, created.stderr

    def keep_uid() -> str:
        out = _run(
            *kube_cluster.kubectl, "get", "trainingjob", "keep", "-n", namespace,
            "-o", "jsonpath={.metadata.uid}",
        )  # fmt: skip
        return out.stdout.strip() if out.returncode == 0 else ""

    return keep_uid


def _secret_data(cluster: KubeCluster, namespace: str, name: str) -> dict[str, str]:
    out = _run(*cluster.kubectl, "get", "secret", "-n", namespace, name, "-o", "json")
    assert out.returncode == 0, out.stderr
    data: dict[str, str] = json.loads(out.stdout)["data"]
    return data


def test_install_rbac_and_uninstall(kube_cluster: KubeCluster, namespace: str) -> None:
    helm = _helm(kube_cluster)
    env_kube = ["--kubeconfig", str(kube_cluster.kubeconfig)]
    release = f"r{namespace[-6:]}"
    # a custom resource from before the install must outlive install, upgrade, rollback and
    # uninstall (Helm never upgrades or deletes the CRDs of a chart's crds/)
    keep_uid = _a_users_training_job(kube_cluster, namespace)
    assert (uid := keep_uid())
    installed = _run(helm, *env_kube, "install", release, str(CHART), "--namespace", namespace)
    assert installed.returncode == 0, installed.stderr

    def webhook_ca() -> tuple[str, str, str]:
        """(Secret ca.crt, validating caBundle, mutating caBundle) of the release."""
        secret = json.loads(
            _run(
                *kube_cluster.kubectl,
                "get",
                "secret",
                "-n",
                namespace,
                f"{release}-webhook-tls",
                "-o",
                "json",
            ).stdout
        )
        bundles = [
            _run(
                *kube_cluster.kubectl,
                "get",
                kind,
                f"{release}-chronotope",
                "-o",
                "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ).stdout
            for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
        ]
        return secret["data"]["ca.crt"], bundles[0], bundles[1]

    ca, tls = webhook_ca(), _secret_data(kube_cluster, namespace, f"{release}-extender-tls")
    assert ca[0]
    assert ca == (ca[0], ca[0], ca[0])

    def can(sa: str, *what: str) -> bool:
        out = _run(
            *kube_cluster.kubectl,
            "auth",
            "can-i",
            *what,
            f"--as=system:serviceaccount:{namespace}:{release}-{sa}",
        )
        return out.stdout.strip() == "yes"

    assert can("operator", "create", "pods", "-n", "default")
    assert can("operator", "patch", "trainingjobs.chronotope.dev", "--subresource=status", "-A")
    assert can("operator", "patch", "configmaps", "-n", "default")  # placement ConfigMaps
    assert can("operator", "update", "deployments.apps", "-n", "default")  # serving groups
    assert not can("operator", "delete", "configmaps", "-n", "default")
    assert not can("operator", "get", "secrets", "-A")
    assert not can("operator", "get", "secrets", "-n", namespace)
    assert not can("operator", "delete", "nodes")
    # leader election: its Lease, in the release namespace only
    assert can("operator", "update", "leases.coordination.k8s.io", "-n", namespace)
    assert not can("operator", "update", "leases.coordination.k8s.io", "-n", "default")
    assert not can("operator", "delete", "leases.coordination.k8s.io", "-n", namespace)
    assert can("scheduler", "create", "pods", "--subresource=binding", "-n", "default")
    assert not can("scheduler", "create", "pods", "-n", "default")
    assert not can("scheduler", "get", "secrets", "-A")
    # kube-scheduler's leader election Lease is named after the release, not kube-scheduler
    lease = f"leases.coordination.k8s.io/{release}-scheduler"
    assert can("scheduler", "update", lease, "-n", namespace)
    assert not can("scheduler", "update", "leases.coordination.k8s.io/other", "-n", namespace)
    assert can("device-plugin", "patch", "nodes")
    assert not can("device-plugin", "create", "pods", "-n", "default")
    assert not can("device-plugin", "create", "pods", "--subresource=binding", "-n", "default")
    upgraded = _run(
        helm,
        *env_kube,
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--set",
        "devicePlugin.enabled=false",
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert not can("device-plugin", "patch", "nodes")  # its role went with the DaemonSet
    # the upgrade kept the webhook's certificate and the extender's (lookup)
    assert (webhook_ca(), _secret_data(kube_cluster, namespace, f"{release}-extender-tls")) == (
        ca,
        tls,
    )
    assert keep_uid() == uid  # the upgrade kept the custom resource
    rolled = _run(helm, *env_kube, "rollback", release, "1", "--namespace", namespace)
    assert rolled.returncode == 0, rolled.stderr
    assert can("device-plugin", "patch", "nodes")
    removed = _run(helm, *env_kube, "uninstall", release, "--namespace", namespace, "--wait")
    assert removed.returncode == 0, removed.stderr

    def leftovers() -> list[str]:
        out = _run(
            *kube_cluster.kubectl,
            "get",
            "clusterroles,clusterrolebindings,roles,rolebindings,deployments,daemonsets,"
            "serviceaccounts,configmaps,services,secrets,validatingwebhookconfigurations,"
            "mutatingwebhookconfigurations,validatingadmissionpolicies,"
            "validatingadmissionpolicybindings",
            "-A",
            "-l",
            f"app.kubernetes.io/instance={release}",
            "-o",
            "name",
        )
        return [line for line in out.stdout.splitlines() if line]

    wait_for(lambda: leftovers() == [], 60, "no orphaned objects")
    assert keep_uid() == uid  # uninstalling the chart keeps the CRDs and what users made


def test_each_container_runs_as_the_user_its_image_needs(kube_cluster: KubeCluster) -> None:
    # the device plugin needs uid 0 for the kubelet's root-owned socket directory; the rest
    # run as non-root with a read-only root filesystem and a writable /tmp
    helm = _helm(kube_cluster)
    out = _run(helm, "template", "r", str(CHART), "--namespace", "ns", "--kube-version", "1.33.0")
    assert out.returncode == 0, out.stderr
    pods = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for doc in yaml.safe_load_all(out.stdout)
        if doc and doc["kind"] in ("Deployment", "DaemonSet")
    }
    plugin = pods["r-device-plugin"]["containers"][0]
    assert plugin["securityContext"]["runAsUser"] == 0
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for name in ("r-operator", "r-scheduler"):
        assert pods[name]["securityContext"]["runAsNonRoot"] is True
        for container in pods[name]["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security.get("runAsUser", 10001) != 0
    kube_scheduler = pods["r-scheduler"]["containers"][0]
    assert kube_scheduler["securityContext"]["runAsUser"] == 65532  # image default is root
    for name, index in (("r-operator", 0), ("r-scheduler", 1), ("r-device-plugin", 0)):
        mounts = {m["mountPath"] for m in pods[name]["containers"][index]["volumeMounts"]}
        assert "/tmp" in mounts, name
