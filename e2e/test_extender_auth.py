"""Only kube-scheduler may call the extender's verbs (real cluster, real kube-scheduler).

The session's extender serves HTTPS with the local cluster's extender PKI
(`LocalCluster.extender_pki`), and its kube-scheduler calls it with the client
certificate in `tlsConfig`. Here: that kube-scheduler binds through it; callers
with no certificate, with another CA's, or with the cluster admin's are refused
on every verb and bind nothing; `/healthz` and `/metrics` stay open; malformed
bodies and failed API calls answer short messages with none of the API
server's text. Last, the Helm chart's own certificates, arguments and
KubeSchedulerConfiguration run a real extender and kube-scheduler that bind a pod.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from chronotope.devcluster import components
from chronotope.devcluster.binaries import ensure_binaries
from chronotope.devcluster.process import free_port
from e2e.kubetest import KubeCluster, wait_for
from e2e.test_extender import gpu_pod
from tests.impostor import impostor_context

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
VERBS = ("bind", "filter", "prioritize")
REFUSALS = (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected)
HOLD = "chronotope.dev/test-hold"


def _call(
    port: int,
    context: ssl.SSLContext | None,
    method: str,
    path: str,
    body: Any = None,
) -> tuple[int, bytes]:
    """One request to the extender; plain HTTP when `context` is None."""
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    raw = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    try:
        conn.request(method, path, body=raw, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _post(port: int, context: ssl.SSLContext, verb: str, body: Any) -> tuple[int, Any]:
    status, raw = _call(port, context, "POST", f"/{verb}", body)
    return status, json.loads(raw)


def _context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def _pending_pod(
    core: client.CoreV1Api, namespace: str, pod_name: str, finalizers: list[str] | None = None
) -> Any:
    """A pod no scheduler takes (its schedulerName has none), asking for no GPU."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "finalizers": finalizers or []},
        "spec": {
            "schedulerName": f"nobody-{uuid.uuid4().hex[:6]}",
            "containers": [{"name": "c", "image": "registry.example/x:1"}],
        },
    }
    return core.create_namespaced_pod(namespace, pod)


def _bound(core: client.CoreV1Api, namespace: str, pod_name: str) -> Any:
    pod = core.read_namespaced_pod(pod_name, namespace)
    return pod if pod.spec.node_name else None


def _filter_args(pod: Any, api: Any) -> dict[str, Any]:
    return {"Pod": api.sanitize_for_serialization(pod), "NodeNames": ["t4-000", "t4-001"]}


def _binding(pod: Any, node: str, uid: str | None = None) -> dict[str, Any]:
    meta = pod.metadata
    return {
        "PodName": meta.name,
        "PodNamespace": meta.namespace,
        "PodUID": uid or meta.uid,
        "Node": node,
    }


def test_kube_scheduler_binds_through_the_extender_over_https(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    local = kube_cluster.local
    config = yaml.safe_load((local.directory / "chronotope-scheduler-config.yaml").read_text())
    # one extender process, two entries: decisions on its port, binds (HTTP/2) on another
    (extender, binder) = config["extenders"]
    assert extender["urlPrefix"] == f"https://127.0.0.1:{chronotope_scheduler}"
    assert "bindVerb" not in extender
    assert binder["bindVerb"] == "bind"
    assert "filterVerb" not in binder
    assert binder["urlPrefix"] != extender["urlPrefix"]
    for entry in (extender, binder):
        assert entry["enableHTTPS"] is True
        assert entry["tlsConfig"] == local.extender_pki().tls_config()
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, gpu_pod("tls-bound", gpus=1))
        pod = wait_for(lambda: _bound(core, namespace, "tls-bound"), 90, "tls-bound bound")
    assert pod.metadata.annotations["chronotope.dev/assigned-node"] == pod.spec.node_name


def test_callers_without_kube_schedulers_certificate_are_refused(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str, tmp_path: Path
) -> None:
    port, local = chronotope_scheduler, kube_cluster.local
    pki = local.extender_pki()
    anonymous = _context(pki.ca_cert)
    foreign = {
        "another CA": impostor_context(tmp_path, pki.ca_cert),
        # the cluster's own admin certificate (system:masters): a client certificate of
        # the cluster, not of the extender's CA
        "cluster admin": _context(
            pki.ca_cert,
            local.directory / "pki" / "admin.crt",
            local.directory / "pki" / "admin.key",
        ),
    }
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        pod = _pending_pod(core, namespace, "victim")
        bodies = {
            "bind": _binding(pod, "t4-000"),
            "filter": _filter_args(pod, api),
            "prioritize": _filter_args(pod, api),
        }
        for verb in VERBS:  # /bind first in VERBS
            status, out = _post(port, anonymous, verb, bodies[verb])
            assert status == 403, (verb, out)
            assert "client certificate" in out["Error"]
            for context in foreign.values():  # the handshake fails
                with pytest.raises(REFUSALS):
                    _post(port, context, verb, bodies[verb])
            with pytest.raises(REFUSALS):  # no plain HTTP at all
                _call(port, None, "POST", f"/{verb}", bodies[verb])
        # open, read-only, without a client certificate
        assert _call(port, anonymous, "GET", "/healthz") == (200, b"ok")
        status, metrics = _call(port, anonymous, "GET", "/metrics")
        assert status == 200
        assert b'chronotope_extender_unauthenticated_requests_total{verb="bind"}' in metrics
        assert core.read_namespaced_pod("victim", namespace).spec.node_name is None
        # the same bind with kube-scheduler's certificate is made: the refusals were the
        # caller's, not the request's
        status, out = _post(port, pki.client_context(), "bind", bodies["bind"])
        assert (status, out) == (200, {"Error": ""})
        assert core.read_namespaced_pod("victim", namespace).spec.node_name == "t4-000"


def test_bad_input_and_failed_binds_answer_short_messages(
    kube_cluster: KubeCluster, chronotope_scheduler: int, namespace: str
) -> None:
    port = chronotope_scheduler
    kube_scheduler = kube_cluster.local.extender_pki().client_context()
    for verb, body, message in (
        ("bind", {"PodName": "p", "PodNamespace": 3}, "PodNamespace must be a string"),
        ("bind", b"[" * 100_000, "nested too deeply"),
        ("filter", {"Pod": {"metadata": {}, "spec": {"containers": "x"}}}, "spec.containers"),
        ("filter", {"Pod": {"metadata": {"annotations": "x"}}}, "metadata.annotations"),
        ("prioritize", {"Pod": {"metadata": {}, "spec": {"nodeSelector": "x"}}}, "nodeSelector"),
    ):
        status, out = _post(port, kube_scheduler, verb, body)
        assert status == 400, (verb, body, out)
        assert message in out["Error"]
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        ghost = {"PodName": "ghost", "PodNamespace": namespace, "PodUID": "u", "Node": "t4-000"}
        status, out = _post(port, kube_scheduler, "bind", ghost)
        # the API server's own message ('pods "ghost" not found') is not passed on
        assert (status, out["Error"]) == (200, f"cannot read pod {namespace}/ghost: 404 Not Found")
        # a pod being deleted (a finalizer holds it) cannot be bound: the API server
        # refuses with 409 and "pod ... is being deleted, cannot be assigned to a host";
        # the caller sees status and reason only, the extender's log the rest
        pod = _pending_pod(core, namespace, "leaving", finalizers=[HOLD])
        core.delete_namespaced_pod("leaving", namespace)
        try:
            status, out = _post(port, kube_scheduler, "bind", _binding(pod, "t4-000"))
            assert (status, out) == (200, {"Error": "binding failed: 409 Conflict"})
            assert core.read_namespaced_pod("leaving", namespace).spec.node_name is None
            log = kube_cluster.local.directory / "logs" / "chronotope-extender.log"
            assert "is being deleted, cannot be assigned to a host" in log.read_text()
        finally:
            core.patch_namespaced_pod("leaving", namespace, {"metadata": {"finalizers": None}})


def _render_chart(kube_cluster: KubeCluster) -> list[dict[str, Any]]:
    helm = ensure_binaries(kube_cluster.local.settings, build=False).helm
    out = subprocess.run(
        [
            str(helm), "template", "t", str(ROOT / "charts" / "chronotope"),
            "--namespace", "default", "--kube-version", "1.33.0",
            "--show-only", "templates/extender-tls.yaml",
            "--show-only", "templates/scheduler.yaml",
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_the_charts_certificates_and_configuration_bind_a_pod(
    kube_cluster: KubeCluster,
    chronotope_scheduler: int,
    chart_identities: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The chart's Secret, extender arguments and scheduler config, run as the pod would.

    Paths under the Secret's mount become a temporary directory, ports become
    free ones, and the profile gets a name of its own (the session's
    `chronotope` scheduler keeps its pods); everything else is as rendered.
    """
    local = kube_cluster.local
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render_chart(kube_cluster)}
    secret = docs[("Secret", "t-extender-tls")]
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for key, value in secret["data"].items():
        (tls_dir / key).write_bytes(base64.b64decode(value))
        (tls_dir / key).chmod(0o600)
    pod_spec = docs[("Deployment", "t-scheduler")]["spec"]["template"]["spec"]
    mount = "/etc/chronotope-tls"
    for container in pod_spec["containers"]:
        assert {"name": "extender-tls", "mountPath": mount, "readOnly": True} in container[
            "volumeMounts"
        ]
    assert {"name": "extender-tls", "secret": {"secretName": "t-extender-tls"}} in pod_spec[
        "volumes"
    ]
    (sched, extender) = pod_spec["containers"]
    port, metrics_port, sched_port = free_port(), free_port(), free_port()
    bind_port = free_port()
    replace = {
        "--port=8888": f"--port={port}",
        "--bind-port=8889": f"--bind-port={bind_port}",
        "--metrics-port=9102": f"--metrics-port={metrics_port}",
        "--metrics-address=0.0.0.0": "--metrics-address=127.0.0.1",
    }
    args = [replace.get(a, a.replace(mount, str(tls_dir))) for a in extender["args"]]
    assert args[0] == "scheduler"
    assert "--host=127.0.0.1" in args
    kubeconfig = chart_identities.kubeconfig("scheduler") if chart_identities else None
    kubeconfig = kubeconfig or kube_cluster.kubeconfig
    scheduler_name = f"chart-tls-{uuid.uuid4().hex[:6]}"
    config = yaml.safe_load(
        docs[("ConfigMap", "t-scheduler-config")]["data"]["config.yaml"]
        .replace(mount, str(tls_dir))
        .replace("https://127.0.0.1:8888", f"https://127.0.0.1:{port}")
        .replace("https://127.0.0.1:8889", f"https://127.0.0.1:{bind_port}")
    )
    config["leaderElection"] = {"leaderElect": False}
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config["profiles"][0]["schedulerName"] = scheduler_name
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert sched["command"][0] == "kube-scheduler"
    ports = components.Ports(**(local.load_state().ports | {"scheduler": sched_port}))
    binary = ensure_binaries(local.settings, build=False).kube_scheduler
    try:
        local.start_component(
            "chart-tls-extender",
            [sys.executable, "-m", "chronotope", *args, "--kubeconfig", str(kubeconfig)],
            f"https://127.0.0.1:{port}/healthz",
        )
        local.start_component(
            "chart-tls-kube-scheduler",
            components.scheduler_argv(binary, tmp_path / "config.yaml", kubeconfig, ports),
            f"https://127.0.0.1:{sched_port}/healthz",
        )
        with kube_cluster.api_client() as api:
            core = client.CoreV1Api(api)
            pod = gpu_pod("chart-tls", gpus=1)
            pod["spec"]["schedulerName"] = scheduler_name
            core.create_namespaced_pod(namespace, pod)
            bound = wait_for(lambda: _bound(core, namespace, "chart-tls"), 90, "chart-tls bound")
        assert bound.metadata.annotations["chronotope.dev/assigned-node"] == bound.spec.node_name
        # the chart's metrics port is plain HTTP (the extender-metrics Service scrapes it)
        status, metrics = _call(metrics_port, None, "GET", "/metrics")
        assert status == 200
        assert b'chronotope_extender_decisions_total{outcome="bound",verb="bind"} 1.0' in metrics
        # and a caller without the chart's client certificate is refused
        anonymous = _context(tls_dir / "ca.crt")
        status, _ = _call(port, anonymous, "POST", "/bind", b"{}")
        assert status == 403
    finally:
        local.stop_component("chart-tls-kube-scheduler")
        local.stop_component("chart-tls-extender")
