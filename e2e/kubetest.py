"""Helpers for tests that drive the real local cluster (imported by conftest and tests)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

__all__ = ["KubeCluster", "kubectl_binary", "operator_metrics", "prometheus_server", "wait_for"]

T = TypeVar("T")


def kubectl_binary() -> str:
    for name in ("kubectl.1.33", "kubectl"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("kubectl is not on PATH; the cluster tests drive the cluster through it")


@dataclass
class KubeCluster:
    """Handle to a running cluster: its kubeconfig, a kubectl argv prefix, API clients."""

    kubeconfig: Path
    server: str
    kubectl: list[str] = field(default_factory=list)
    local: Any = None
    """The LocalCluster when the tests started it (None for CHRONOTOPE_TEST_KUBECONFIG)."""

    def api_client(self) -> Any:
        from chronotope.kube.client import api_client

        return api_client(self.kubeconfig)

    def run_kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        result = subprocess.run(
            [*self.kubectl, *args],
            check=False,
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result.stdout + result.stderr if not check else result.stdout


def wait_for(predicate: Callable[[], T | None], timeout: float = 60, what: str = "condition") -> T:
    """Poll until `predicate` returns something truthy and return it; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextlib.contextmanager
def scratch_namespace(core: Any, name: str) -> Iterator[str]:
    """Namespace `name` for one test (labelled `chronotope.dev/test`), deleted after it.

    `core` is a `CoreV1Api`. It is ready once its default ServiceAccount exists: the
    ServiceAccount admission plugin rejects pods until then.
    """
    core.create_namespace({"metadata": {"name": name, "labels": {"chronotope.dev/test": "1"}}})
    try:
        wait_for(lambda: bool(core.list_namespaced_service_account(name).items), 60, "sa")
        yield name
    finally:
        core.delete_namespace(name)


def metric_value(text: str, name: str, labels: str) -> float:
    """The value of sample `name{labels}` in Prometheus text; 0 if absent."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def operator_metrics(cluster: KubeCluster) -> str:
    """The text of the operator's /metrics (the operator the tests started)."""
    import urllib.request

    assert cluster.local is not None
    state = cluster.local.load_state()
    assert state is not None
    assert state.operator_metrics_port
    url = f"http://127.0.0.1:{state.operator_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


@contextlib.contextmanager
def prometheus_server(config: Mapping[str, Any], directory: Path) -> Iterator[str]:
    """A real Prometheus (Debian `prometheus`) with `config`, on a loopback port; its URL.

    The config and the TSDB go under `directory`; the process stops on exit.
    """
    from chronotope.devcluster.process import free_port

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the Debian `prometheus` package is needed: hack/system-packages.sh")
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(dict(config)))
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
