"""The container image (Dockerfile), built by hack/image.sh, running every component.

The module builds the image itself with `hack/image.sh` (which installs and
starts what it needs: Debian's docker.io and debootstrap, a Docker daemon, a
debootstrapped base image; no registry), then runs the components from it on
the host network against the real local control plane:

- `--help` lists every subcommand, and the image runs as a non-root user;
- the operator reconciles a TrainingJob, under the chart's operator identity
  with the chart's container security settings (read-only root, no
  capabilities), and no operator of the test session's is needed for it;
- the scheduler extender lists the cluster and answers on its port;
- the device plugin registers with a stand-in kubelet and lists its devices.

A machine where Docker cannot run fails here: CI must build and run the image.
A Docker daemon that `hack/image.sh` started for this module is stopped at the end.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from chronotope.devcluster.process import free_port
from e2e.kubetest import KubeCluster, kubectl_binary, metric_value, wait_for
from tests.fake_kubelet import fake_kubelet

# a cold build (apt, debootstrap, PyPI downloads) takes minutes; the first test pays it
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SH = ROOT / "hack" / "image.sh"
IMAGE = "chronotope:dev"
IMAGE_USER = "10001:10001"
"""The image's numeric user (the Dockerfile), so that runAsNonRoot can check it."""
GROUP, VERSION, PLURAL = "chronotope.dev", "v1alpha1", "trainingjobs"


@dataclass(frozen=True)
class Docker:
    """The docker client argv (through `sudo -n` when the socket is not ours)."""

    argv: tuple[str, ...]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.argv, *args], capture_output=True, text=True, timeout=timeout, check=False
        )

    def check(self, *args: str, timeout: float = 120) -> str:
        result = self.run(*args, timeout=timeout)
        assert result.returncode == 0, f"docker {' '.join(args)}: {result.stderr}"
        return result.stdout

    def answers(self) -> bool:
        return self.run("info", timeout=60).returncode == 0


def _docker() -> Docker | None:
    found = shutil.which("docker")
    if found is None:
        return None
    if os.geteuid() == 0 or os.access("/var/run/docker.sock", os.W_OK):
        return Docker((found,))
    return Docker(("sudo", "-n", found))


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    """`chronotope:dev` built by hack/image.sh; a daemon the script started is stopped after."""
    before = _docker()
    daemon_was_running = before is not None and before.answers()
    build = subprocess.run(
        ["bash", str(IMAGE_SH)],
        env={**os.environ, "CHRONOTOPE_IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    try:
        client = _docker()
        if build.returncode != 0 or client is None or not client.answers():
            pytest.fail(
                "hack/image.sh could not build the image (Docker must run on this machine: "
                "it installs docker.io and debootstrap and starts dockerd, which needs root or "
                f"passwordless sudo); exit {build.returncode}:\n{build.stderr[-3000:]}"
            )
        yield client
    finally:
        if not daemon_was_running:
            stop = subprocess.run(
                ["bash", str(IMAGE_SH), "stop"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert stop.returncode == 0, f"hack/image.sh stop: {stop.stderr}"


def _portable_kubeconfig(path: Path, out: Path) -> Path:
    """`path` with every credential embedded, readable by the container's user."""
    flat = subprocess.run(
        [kubectl_binary(), "--kubeconfig", str(path), "config", "view", "--raw", "--flatten"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    out.write_text(flat)
    out.chmod(0o644)  # the container runs as another uid; pytest's tmp dir is 0700
    return out


def _kubeconfig_for(
    component: str, kube_cluster: KubeCluster, identities: Any, tmp_path: Path
) -> Path:
    """The chart's ServiceAccount kubeconfig for `component` (admin without identities)."""
    source = kube_cluster.kubeconfig if identities is None else identities.kubeconfig(component)
    return _portable_kubeconfig(source, tmp_path / f"{component}.kubeconfig")


@contextmanager
def _container(docker: Docker, name: str, *args: str) -> Iterator[str]:
    """`docker run -d` a component from the image on the host network; removed after."""
    docker.check(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "host",
        # the chart's container securityContext; /tmp as a pod's emptyDir would be (the
        # kubernetes client writes a kubeconfig's embedded certificates to temp files)
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        *args,
    )
    try:
        yield name
    finally:
        docker.run("rm", "--force", name)


def _logs(docker: Docker, name: str) -> str:
    result = docker.run("logs", name)
    return result.stdout + result.stderr


def _http_ok(url: str) -> bool:
    with suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)
    return False


def _wait_http(docker: Docker, name: str, url: str, timeout: float = 120) -> None:
    """Wait until `url` answers 200; fail with the container's log if it exits first."""

    def ready() -> bool:
        if _http_ok(url):
            return True
        running = docker.run("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        assert running == "true", f"container {name} exited:\n{_logs(docker, name)[-3000:]}"
        return False

    wait_for(ready, timeout, f"{url} from container {name}")


def test_the_image_lists_every_component_and_runs_as_non_root(docker: Docker) -> None:
    listed = docker.check("run", "--rm", IMAGE, "--help")
    for command in ("operator", "scheduler", "device-plugin"):
        assert re.search(rf"^\s+{command}\s", listed, re.MULTILINE), (command, listed)
        usage = docker.check("run", "--rm", IMAGE, command, "--help")
        assert usage.startswith(f"usage: chronotope {command}"), usage
    assert docker.check("image", "inspect", "--format", "{{.Config.User}}", IMAGE).strip() == (
        IMAGE_USER
    )
    ids = docker.check("run", "--rm", "--entrypoint", "id", IMAGE).strip()
    assert ids.startswith("uid=10001(chronotope) gid=10001(chronotope)"), ids


def _job(name: str) -> dict[str, Any]:
    """One worker with one T4 (the shape of e2e/test_trainingjob.py's `job`)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "gpu": {"count": 1},
            "gpuTypes": [{"name": "T4", "relativeSpeed": 1.0}],
            "estimate": {"referenceGpuType": "T4", "durationSeconds": 3600},
            "template": {"spec": {"containers": [{"name": "w", "image": "registry.example/t:1"}]}},
        },
    }


@pytest.mark.usefixtures("chronotope_scheduler")  # binds the worker
def test_the_operator_from_the_image_reconciles_a_trainingjob(
    docker: Docker,
    kube_cluster: KubeCluster,
    chart_identities: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    from kubernetes import client

    from chronotope.kube.crds import install_crds

    assert kube_cluster.local is not None
    # another module's session operator may run; without one, only the container can act
    alone = not kube_cluster.local.running().get("chronotope-operator", False)
    crds = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    kubeconfig = _kubeconfig_for("operator", kube_cluster, chart_identities, tmp_path)
    health, metrics = free_port(), free_port()
    name = f"chronotope-e2e-operator-{uuid.uuid4().hex[:6]}"
    with kube_cluster.api_client() as api:
        install_crds(api, crds)
        with _container(
            docker,
            name,
            "--volume",
            f"{kubeconfig}:/etc/chronotope/kubeconfig:ro",
            IMAGE,
            "operator",
            "--kubeconfig",
            "/etc/chronotope/kubeconfig",
            "--interval",
            "1",
            "--health-port",
            str(health),
            "--metrics-port",
            str(metrics),
            "--metrics-address",
            "127.0.0.1",
        ):
            _wait_http(docker, name, f"http://127.0.0.1:{health}/healthz")
            custom = client.CustomObjectsApi(api)
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _job("img"))

            def running() -> dict[str, Any] | None:
                obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "img")
                status: dict[str, Any] = obj.get("status") or {}
                return status if status.get("phase") == "Running" else None

            status = wait_for(running, 120, "the TrainingJob running")
            assert status["plan"]["gpuType"] == "T4", status
            pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
            assert [p.spec.scheduler_name for p in pods] == ["chronotope"], pods
            assert pods[0].spec.node_name, "the worker is bound"

            def reconciled() -> str | None:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{metrics}/metrics", timeout=5
                ) as resp:
                    text = resp.read().decode()
                running = metric_value(text, "chronotope_trainingjobs", 'phase="Running"')
                return text if running else None

            # the container's own metrics: it reconciled the job and saw it running
            text = wait_for(reconciled, 30, "the container's operator to see the job running")
            ok = metric_value(text, "chronotope_trainingjob_reconcile_seconds_count", 'result="ok"')
            assert ok >= 1, text
            if alone:
                assert f"{namespace}/img Started" in _logs(docker, name), _logs(docker, name)


def test_the_scheduler_extender_from_the_image_lists_the_cluster(
    docker: Docker, kube_cluster: KubeCluster, chart_identities: Any, tmp_path: Path
) -> None:
    from kubernetes import client

    kubeconfig = _kubeconfig_for("scheduler", kube_cluster, chart_identities, tmp_path)
    # the extender serves HTTPS only: the local cluster's extender certificates, readable
    # by the container's user (as the chart mounts its Secret at /etc/chronotope-tls)
    pki = kube_cluster.local.extender_pki()
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o755)
    for path in (pki.serving_cert, pki.serving_key, pki.ca_cert):
        shutil.copyfile(path, tls / path.name)
        (tls / path.name).chmod(0o644)
    port, metrics = free_port(), free_port()
    name = f"chronotope-e2e-scheduler-{uuid.uuid4().hex[:6]}"
    with kube_cluster.api_client() as api:
        nodes = len(client.CoreV1Api(api).list_node().items)
    with _container(
        docker,
        name,
        "--user",
        "23456:23456",  # any non-root uid will do (e.g. OpenShift's arbitrary ones)
        "--volume",
        f"{kubeconfig}:/etc/chronotope/kubeconfig:ro",
        "--volume",
        f"{tls}:/etc/chronotope-tls:ro",
        IMAGE,
        "scheduler",
        "--kubeconfig",
        "/etc/chronotope/kubeconfig",
        "--port",
        str(port),
        f"--tls-cert-file=/etc/chronotope-tls/{pki.serving_cert.name}",
        f"--tls-private-key-file=/etc/chronotope-tls/{pki.serving_key.name}",
        f"--client-ca-file=/etc/chronotope-tls/{pki.ca_cert.name}",
        f"--metrics-port={metrics}",
        "--metrics-address=127.0.0.1",
    ):
        _wait_http(docker, name, f"http://127.0.0.1:{metrics}/metrics")
        synced = re.search(r"cache synced: (\d+) nodes", _logs(docker, name))
        assert synced, _logs(docker, name)
        assert int(synced.group(1)) == nodes, (synced.group(0), nodes)
        url, context = f"https://127.0.0.1:{port}/healthz", pki.client_context()

        def healthy() -> bool:  # HTTPS starts just after the metrics port
            with suppress(OSError), urllib.request.urlopen(url, timeout=2, context=context) as r:
                return bool(r.status == 200)
            return False

        wait_for(healthy, 60, f"{url} over HTTPS")


def test_the_device_plugin_from_the_image_registers_with_the_kubelet(
    docker: Docker, kube_cluster: KubeCluster, device_plugin_kubeconfig: Path, tmp_path: Path
) -> None:
    from kubernetes import client

    from chronotope.deviceplugin._pb import api_pb2

    node = f"img-dp-{uuid.uuid4().hex[:6]}"
    kubeconfig = _portable_kubeconfig(device_plugin_kubeconfig, tmp_path / "dp.kubeconfig")
    # a private kwok node with two GPUs, tainted so no other test's pods land on it
    manifest = {
        "metadata": {
            "name": node,
            "labels": {"type": "kwok", "nvidia.com/gpu.count": "2"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {
            "taints": [{"key": "chronotope.dev/test", "value": "image", "effect": "NoSchedule"}]
        },
    }
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # short unix socket paths
    name = f"chronotope-e2e-device-plugin-{uuid.uuid4().hex[:6]}"
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_node(manifest)
        try:
            with (
                fake_kubelet(plugin_dir) as kubelet,
                _container(
                    docker,
                    name,
                    # the kubelet's socket directory is root's on a node: the plugin runs as uid 0
                    "--user",
                    "0:0",
                    "--volume",
                    f"{kubeconfig}:/etc/chronotope/kubeconfig:ro",
                    "--volume",
                    f"{plugin_dir}:/var/lib/kubelet/device-plugins",
                    "--env",
                    f"NODE_NAME={node}",
                    IMAGE,
                    "device-plugin",
                    "--kubeconfig",
                    "/etc/chronotope/kubeconfig",
                    "--shares-per-gpu",
                    "2",
                ),
            ):
                try:
                    registration = kubelet.next_registration(timeout=120)
                except queue.Empty as exc:
                    raise AssertionError(f"no registration:\n{_logs(docker, name)}") from exc
                assert registration.resource_name == "chronotope.dev/gpu-share"
                with kubelet.plugin_stub(registration.endpoint) as stub:
                    stream = stub.ListAndWatch(api_pb2.Empty(), timeout=60)
                    devices = next(iter(stream)).devices
                    stream.cancel()
                assert len(devices) == 4, devices  # 2 GPUs x 2 shares
                assert {d.health for d in devices} == {"Healthy"}
        finally:
            core.delete_node(node)
            shutil.rmtree(plugin_dir, ignore_errors=True)
