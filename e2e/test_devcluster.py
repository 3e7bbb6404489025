"""The local cluster tool: side-by-side clusters, clean teardown, clear errors."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from chronotope.devcluster import process
from chronotope.devcluster.binaries import ensure_binaries
from chronotope.devcluster.cluster import ClusterError, LocalCluster
from chronotope.devcluster.process import ComponentError
from e2e.kubetest import KubeCluster

pytestmark = pytest.mark.cluster


def _alive(pids: list[dict[str, Any]]) -> list[str]:
    return [p["name"] for p in pids if process.is_alive(p["pid"], p["binary"])]


def _processes_mentioning(path: Path) -> list[str]:
    """Command lines of live processes that refer to `path` (orphans would)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            zombie = (proc / "stat").read_text().split(") ", 1)[1].startswith("Z")
        except (OSError, IndexError):
            continue
        if str(path) in cmdline and not zombie:
            found.append(cmdline)
    return found


def test_second_cluster_runs_beside_the_first_and_down_cleans_up_after_a_crash(
    kube_cluster: KubeCluster, cluster_settings: Any, tmp_path: Path
) -> None:
    settings = dataclasses.replace(cluster_settings, state_root=tmp_path)
    side = LocalCluster(settings, "side")
    state = side.up()
    recorded = list(state.processes)
    try:
        assert state.server != kube_cluster.server
        out = subprocess.run(
            [
                kube_cluster.kubectl[0],
                "--kubeconfig",
                str(state.kubeconfig),
                "get",
                "ns",
                "default",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "default" in out.stdout
        assert sorted(side.running()) == sorted(
            ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
        )
        # simulate a crash: the apiserver dies hard, the rest is orphaned
        apiserver = next(p for p in recorded if p["name"] == "kube-apiserver")
        os.kill(apiserver["pid"], signal.SIGKILL)
    finally:
        side.down()
    assert _alive(recorded) == []
    assert side.running() == {}
    assert _processes_mentioning(tmp_path) == []


def test_taken_port_is_a_clear_error_and_starts_nothing(
    cluster_settings: Any, tmp_path: Path
) -> None:
    settings = dataclasses.replace(cluster_settings, state_root=tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cluster = LocalCluster(settings, "busy")
        with pytest.raises(ClusterError, match=f"port {port} is already in use"):
            cluster.up(apiserver_port=port)
    assert cluster.running() == {}


def test_failing_component_shows_its_log_and_leaves_nothing_running(
    cluster_settings: Any, tmp_path: Path
) -> None:
    real = ensure_binaries(cluster_settings)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for path in real.all():
        (bin_dir / path.name).symlink_to(path)
    (bin_dir / "kube-apiserver").unlink()
    broken = bin_dir / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'E0101 boom: cannot listen on the moon' >&2\nexit 1\n")
    broken.chmod(0o755)
    settings = dataclasses.replace(cluster_settings, state_root=tmp_path / "state", bin_dir=bin_dir)
    cluster = LocalCluster(settings, "broken")
    with pytest.raises(ComponentError, match="boom: cannot listen on the moon") as err:
        cluster.up()
    assert "kube-apiserver exited" in str(err.value)
    assert cluster.running() == {}
    assert _processes_mentioning(tmp_path) == []
